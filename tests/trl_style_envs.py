"""Classes in the style of TRL's ``GRPOTrainer(environment_factory=...)``, for the ``trl:`` adapter tests.

Nothing here imports envkit's adapter: these are what a TRL user writes (``reset(**row)``, public methods with type
hints and Google-style docstrings as tools, ``get_reward()`` or reward functions reading ``environments``), plus the
round trip: envkit's arithmetic env exported with ``to_environment_factory``.
"""

from __future__ import annotations

import random
from typing import ClassVar

from envkit.adapters.trl import to_environment_factory
from envkit.envs.arithmetic import ArithmeticEnv


class GuessingGame:
    """Guess a hidden number from higher/lower hints; the env owns its reward (``get_reward``)."""

    def __init__(self, high: int = 50) -> None:
        self.high = high
        self.target = 0
        self.guesses: list[int] = []

    def reset(self, **kwargs) -> str:
        self.target = random.Random(int(kwargs.get("task_seed", 0))).randint(1, self.high)
        self.guesses = []
        return f"I am thinking of a whole number between 1 and {self.high}. Find it with the guess tool."

    def guess(self, number: int) -> str:
        """Guess the hidden number.

        Args:
            number: Your guess, a whole number in the range you were given.
        """
        if not 1 <= number <= self.high:
            raise ValueError(f"{number} is out of range")
        self.guesses.append(number)
        if number == self.target:
            return "Correct!"
        return "Higher." if number < self.target else "Lower."

    def give_up(self) -> str:
        """Reveal the hidden number (scores nothing)."""
        self.guesses.append(-1)
        return f"It was {self.target}."

    def get_reward(self) -> float:
        if self.target in self.guesses:
            return 1.0
        if not self.guesses or -1 in self.guesses:
            return 0.0
        closest = min(abs(g - self.target) for g in self.guesses)
        return 0.5 * (1 - closest / self.high)

    def _private_helper(self) -> None:  # not a tool: TRL skips names starting with "_"
        pass


class Lookup:
    """A TRL-style env without ``get_reward``: scored by a reward function reading ``environments``."""

    CAPITALS: ClassVar[dict[str, str]] = {"France": "Paris", "Japan": "Tokyo", "Peru": "Lima", "Kenya": "Nairobi"}

    def __init__(self) -> None:
        self.country = ""
        self.answered: str | None = None

    def reset(self, country: str = "France", **kwargs) -> None:
        self.country = country
        self.answered = None
        return None  # the opening is the row's prompt, as in most TRL datasets

    def lookup_capital(self, country: str) -> str:
        """Look up the capital city of a country.

        Args:
            country: The country's English name.
        """
        return self.CAPITALS[country]

    async def answer(self, city: str) -> str:
        """Give the final answer.

        Args:
            city: The capital city.
        """
        self.answered = city
        return "Noted."


def capital_reward(environments, completions, **kwargs) -> list[float]:
    """A TRL reward function: one reward per rollout, from the environment instances."""
    return [float(env.answered == env.CAPITALS[env.country]) for env in environments]


def lookup_rows() -> list[dict]:
    return [
        {"prompt": [{"role": "user", "content": f"What is the capital of {country}?"}], "country": country}
        for country in sorted(Lookup.CAPITALS)
    ]


ArithmeticForTRL = to_environment_factory(ArithmeticEnv)
"""The round trip: envkit's arithmetic env exported for TRL, to be consumed back through ``trl:``."""
