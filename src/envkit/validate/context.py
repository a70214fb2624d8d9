"""What every env check reads: the env, the driver that plays it, the seeds, the template and the scripted episodes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from envkit.core.env import Env
from envkit.validate.driver import Driver, Run
from envkit.validate.policies import NOOP_POLICIES
from envkit.validate.template import TemplateTokenizer


@dataclass
class EnvContext:
    """The state one :func:`envkit.validate.validate_env` run shares between its checks.

    Args:
        factory: Builds a fresh env.
        env: The first instance built (the contract and schema checks inspect it; no episode is played on it).
        driver: Plays every episode; its faults, scores and timings accumulate across checks.
        seeds: The task seeds, at least two.
        chat: The tokenizer whose chat template renders prompts and transcripts.
        runs: The scripted policies' episodes, by policy name, one per seed (filled before the checks that need
            episodes run).
    """

    factory: Callable[[], Env]
    env: Env
    driver: Driver
    seeds: list[int]
    chat: TemplateTokenizer
    runs: dict[str, list[Run]] = field(default_factory=dict)

    @property
    def has_oracle(self) -> bool:
        """Whether the env's oracle proposed an action on at least one seed."""
        return not all(r.no_oracle for r in self.runs["oracle"])

    @property
    def source(self) -> list[Run]:
        """The episodes to replay: the oracle's, or the random policy's when the env has no oracle."""
        return self.runs["oracle"] if self.has_oracle else self.runs["random"]

    def floor(self, seed: int) -> float | None:
        """The measured do-nothing floor of ``seed``: the best score of the no-op policies there (``None`` when none
        of them got a valid score)."""
        scores = [
            r.score
            for name in NOOP_POLICIES
            for r in self.runs[name]
            if r.seed == seed and r.score is not None and r.score == r.score  # NaN: an invalid score
        ]
        return max(scores) if scores else None
