"""Guess the number: a multi-turn text env without tools, where the env answers with feedback.

The env thinks of a whole number in ``[low, high]`` (the range itself varies with the seed unless fixed in the
constructor); each assistant turn is a guess (the last whole number in the text), answered with "higher", "lower" or
"correct". The binary-search oracle always wins within ``max_turns`` (ranges span at most 1000 numbers).

Score: 1.0 for a correct guess; otherwise ``0.5 * (1 - distance / range)`` for the closest guess made (0 without any
guess), so a near miss earns partial credit and talking without guessing earns nothing.

Sample episode (``envkit play guess-number --seed 0``)::

    [system] You are playing a guessing game. Answer each turn with a single whole number.
    [user] I am thinking of a whole number between 85 and 729. Guess it!
    [assistant] 407
    [user] Higher.
    [assistant] 568
    [user] Lower.
    ... (487, 447, 427, 417: lower; 412: higher)
    [assistant] 414
    [user] Correct! The number was 414.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, ClassVar

from envkit.core.env import TASK_ID_KEY, Env
from envkit.core.messages import Message

_INTEGER = re.compile(r"-?\d+")


class GuessNumberEnv(Env):
    """Find a hidden whole number from higher/lower feedback (short name ``guess-number``)."""

    max_turns: ClassVar[int] = 12

    def __init__(self, low: int | None = None, high: int | None = None) -> None:
        super().__init__()
        if (low is None) != (high is None):
            raise ValueError("give both low and high, or neither (then the seed picks the range)")
        if low is not None and high is not None and not 0 < high - low <= 1000:
            raise ValueError(f"need low < high with a span of at most 1000, got [{low}, {high}]")
        self.fixed_range = None if low is None or high is None else (low, high)
        self.low, self.high = self.fixed_range or (1, 100)
        self.target = self.low
        self.guesses: list[int] = []
        self.solved = False

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """A new hidden number from ``seed``."""
        super().reset(seed=seed, options=options)
        if self.fixed_range is None:
            self.low = int(self.np_random.integers(0, 100))
            self.high = self.low + int(self.np_random.integers(20, 1001))
        else:
            self.low, self.high = self.fixed_range
        self.target = int(self.np_random.integers(self.low, self.high + 1))
        self.guesses, self.solved = [], False
        return [
            {
                "role": "system",
                "content": "You are playing a guessing game. Answer each turn with a single whole number.",
            },
            {
                "role": "user",
                "content": f"I am thinking of a whole number between {self.low} and {self.high}. Guess it!",
            },
        ], {"low": self.low, "high": self.high, TASK_ID_KEY: self.task_id}

    @property
    def task_id(self) -> str:
        """The current task's id (``reset``'s ``info["task_id"]``): a digest of the range and the hidden number, so
        two seeds that hide one number in one range are one task, while the id does not tell the number."""
        return hashlib.sha256(f"guess-number/{self.low}/{self.high}/{self.target}".encode()).hexdigest()[:16]

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Read the guess (the last whole number in the text) and answer higher / lower / correct."""
        assert isinstance(action, dict)
        numbers = _INTEGER.findall(str(action.get("content") or "")[-10_000:])
        before = self.score()
        if not numbers:
            reply = f"Please answer with a single whole number between {self.low} and {self.high}."
        else:
            guess = int(numbers[-1]) if len(numbers[-1]) < 30 else self.high * 10
            self.guesses.append(guess)
            if guess == self.target:
                self.solved = True
                reply = f"Correct! The number was {self.target}."
            else:
                reply = "Higher." if guess < self.target else "Lower."
        info = {"guesses": len(self.guesses)}
        return [{"role": "user", "content": reply}], self.score() - before, self.solved, False, info

    def score(self) -> float:
        """1.0 when solved; else partial credit for the closest guess."""
        if self.solved:
            return 1.0
        if not self.guesses:
            return 0.0
        distance = min(abs(g - self.target) for g in self.guesses)
        return 0.5 * max(0.0, 1.0 - distance / (self.high - self.low))

    def canaries(self) -> dict[str, list[Message | str]]:
        """Known reward hacks, none of which may score: the win claimed in the env's own words, without a guess."""
        return {"the win claimed without a guess": ["Correct! I guessed your number."]}

    def oracle(self) -> Message | None:
        """Binary search over the interval left by the feedback so far."""
        low, high = self.low, self.high
        for guess in self.guesses:
            if guess < self.target:
                low = max(low, guess + 1)
            elif guess > self.target:
                high = min(high, guess - 1)
        return {"role": "assistant", "content": str((low + high) // 2)}
