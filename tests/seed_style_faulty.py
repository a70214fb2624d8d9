"""Seed-style classes whose ``score_episode`` fails: every other call (it returns NaN, returns a value outside [0, 1],
or raises: ``fault``), or every call on one training process of two. The other calls score 1.0 when the completion
contains the sum, else 0.0."""

from __future__ import annotations

import os
import random

from datasets import Dataset


class EveryOtherScoreFails:
    """Sums of two numbers, asked as conversations; every second ``score_episode`` call is faulty."""

    def __init__(self, cases: int = 4, fault: str = "nan", seed: int = 0) -> None:
        rng = random.Random(seed)
        self.cases = [(rng.randint(1, 99), rng.randint(1, 99)) for _ in range(cases)]
        self.fault = fault
        self.calls = 0

    def build_dataset(self, tokenizer) -> Dataset:
        prompts = [[{"role": "user", "content": f"What is {a} + {b}?"}] for a, b in self.cases]
        return Dataset.from_dict({"prompt": prompts, "case_idx": list(range(len(prompts)))})

    def score_episode(self, model, tokenizer, completion: str, case_idx: int) -> float:
        self.calls += 1
        if self.calls % 2 == 0:
            if self.fault == "raise":
                raise ConnectionError("the grading service is down")
            return {"nan": float("nan"), "high": 1.5, "text": "correct"}[self.fault]  # type: ignore[return-value]
        return self.scored(completion, case_idx)

    def scored(self, completion: str, case_idx: int) -> float:
        """A good call's score: 1.0 when ``completion`` contains the case's sum, else 0.0."""
        a, b = self.cases[case_idx]
        return 1.0 if str(a + b) in completion else 0.0


class FailsOnOneProcess(EveryOtherScoreFails):
    """Every ``score_episode`` call on the second training process (``RANK`` 1, as ``accelerate launch`` sets it)
    raises; the first process's calls score as :class:`EveryOtherScoreFails`'s good ones."""

    def score_episode(self, model, tokenizer, completion: str, case_idx: int) -> float:
        if os.environ.get("RANK") == "1":
            raise ConnectionError("the grading service is down on this process")
        return self.scored(completion, case_idx)
