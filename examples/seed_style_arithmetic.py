"""A seed-style env class: the interface of existing ``--rl-env-module`` GRPO CLIs, which envkit runs unchanged.

``build_dataset(tokenizer)`` returns rows with a ``prompt`` column; ``score_episode(model, tokenizer, completion,
case_idx)`` scores one decoded completion of row ``case_idx`` in [0, 1]; ``get_tools()`` (optional) returns the
tools as typed, docstringed functions.

Check it: ``envkit validate --rl-env-module seed_style_arithmetic --rl-env-class SeedArithmetic`` (with
``examples/`` on ``PYTHONPATH``), or ``envkit validate examples/seed_style_arithmetic.py:SeedArithmetic``.
"""

from __future__ import annotations

import re

from datasets import Dataset


def add(a: float, b: float) -> float:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


class SeedArithmetic:
    """Sums of two numbers; the last number in the completion must equal the sum."""

    def __init__(self, cases: int = 64, seed: int = 0, use_tools: bool = True) -> None:
        import random

        self.use_tools = use_tools
        rng = random.Random(seed)
        self.cases = [(rng.randint(1, 99), rng.randint(1, 99)) for _ in range(cases)]

    def build_dataset(self, tokenizer) -> Dataset:
        """One row per case: a conversational prompt, its length in tokens, and the case index.

        Prompts are lists of messages (TRL renders them with the chat template, tools included); with tools they must
        be, since TRL's tool loop works on conversations.
        """
        prompts = [[{"role": "user", "content": f"What is {a} + {b}? Answer with the number."}] for a, b in self.cases]
        lengths = [
            len(
                tokenizer.apply_chat_template(
                    p, tools=self.get_tools() or None, add_generation_prompt=True, return_dict=False
                )
            )
            for p in prompts
        ]
        return Dataset.from_dict(
            {"prompt": prompts, "prompt_tokens": lengths, "case_idx": list(range(len(self.cases)))}
        )

    def score_episode(self, model, tokenizer, completion: str, case_idx: int) -> float:
        """1.0 when the last number in ``completion`` is the sum, else 0.0."""
        a, b = self.cases[case_idx]
        numbers = re.findall(r"-?\d+(?:\.\d+)?", completion[-2000:])
        return float(bool(numbers) and float(numbers[-1]) == a + b)

    def get_tools(self) -> list:
        """The tools the model may call."""
        return [add] if self.use_tools else []
