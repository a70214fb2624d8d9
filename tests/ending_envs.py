"""An env whose score says which ending it was told (``EnvFactory("ending_envs:TellsItsEnding")``), for the tests of
the ending contract on every worker kind and through OpenEnv: importable by spec in a worker (the workers get the
parent's ``sys.path``, which holds tests/), and kept light (no helpers, no torch)."""

from __future__ import annotations

import envkit

SCORES = {
    None: 0.05,  # never told (what every env got before the ending was part of the contract)
    "done": 1.0,
    "max_turns": 0.25,
    "max_steps": 0.3,
    "too_many_errors": 0.4,
    "max_episode_tokens": 0.5,
    "timeout": 0.6,
    "error": 0.7,
}
"""The score of each ending (by its value): distinct, so the score alone names the ending the env was told."""


class TellsItsEnding(envkit.ToolEnv):
    """``add`` forever, or say anything to end the episode; ``explode`` always fails (a tool error). Its score is
    :data:`SCORES` of :attr:`ending`, and its score components name the ending too."""

    max_turns = 6
    max_tool_errors = 2
    requires_proper_ending = True

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.total = 0
        return [
            {"role": "system", "content": "You add numbers."},
            {"role": "user", "content": f"Add one, then say so (task {seed})."},
        ], {}

    @envkit.tool
    def add(self, amount: int) -> str:
        """Add an amount to the running total.

        Args:
            amount: The whole number to add.
        """
        self.total += amount
        return f"total is now {self.total}"

    @envkit.tool
    def explode(self) -> str:
        """A tool that always fails."""
        raise envkit.ToolError("it exploded")

    def score(self) -> float:
        ending = getattr(self, "ending", None)
        return SCORES[None if ending is None else str(getattr(ending, "value", ending))]

    def score_components(self) -> dict[str, float]:
        ending = getattr(self, "ending", None)
        return {f"told_{getattr(ending, 'value', ending)}": 1.0}

    def oracle(self):
        if self.total == 0:
            return {"role": "assistant", "content": "", "tool_calls": [_call("add", amount=1)]}
        return {"role": "assistant", "content": "Done: the total is 1."}


def _call(name: str, **arguments) -> dict:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}
