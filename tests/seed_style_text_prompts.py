"""A seed-style class whose ``build_dataset`` renders its prompts to text, tools included, with the chat template.

The common pattern of existing ``--rl-env-module`` GRPO CLIs:
``tokenizer.apply_chat_template(messages, tools=self.get_tools(), tokenize=False, add_generation_prompt=True)``.
``score_episode`` records every call, so tests can check what the rewards were computed from.
"""

from __future__ import annotations

import random
from typing import ClassVar

from datasets import Dataset


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class TextPromptsWithTools:
    """Sums of two numbers, prompts rendered to text with the ``add`` tool in them."""

    scored: ClassVar[list[tuple[str, int, float]]] = []
    """``(completion, case_idx, score)`` of every ``score_episode`` call, in order."""
    prompts: ClassVar[list[str]] = []

    def __init__(self, cases: int = 8, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.cases = [(rng.randint(1, 99), rng.randint(1, 99)) for _ in range(cases)]

    def build_dataset(self, tokenizer) -> Dataset:
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": f"What is {a} + {b}? Use the add tool."}],
                tools=self.get_tools(),
                tokenize=False,
                add_generation_prompt=True,
            )
            for a, b in self.cases
        ]
        type(self).prompts[:] = prompts
        return Dataset.from_dict({"prompt": prompts, "case_idx": list(range(len(prompts)))})

    def score_episode(self, model, tokenizer, completion: str, case_idx: int) -> float:
        """A score that differs from completion to completion (its length, in [0, 1]), recorded with its input."""
        score = (len(completion) % 11) / 10
        type(self).scored.append((completion, case_idx, score))
        return score

    def get_tools(self) -> list:
        return [add]
