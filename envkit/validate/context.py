"""What every env check reads: the env, the driver that plays it, the seeds, the template and the scripted episodes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from envkit.core.env import Env
from envkit.validate.driver import Driver, Run
from envkit.validate.policies import NOOP_POLICIES
from envkit.validate.report import NOT_RUN, SKIP, Outcome
from envkit.validate.template import TemplateTokenizer


@runtime_checkable
class ServedEnv(Protocol):
    """An env that is a client of a server holding the real env (``openenv:ws://…`` of ``envkit serve-env``), which
    may keep the env's oracle and canaries to itself. Read by the checks that need them: they SKIP naming
    :attr:`withheld` instead of blaming the env; and :attr:`client_warnings` are reported by the schema check."""

    @property
    def withheld(self) -> str | None:
        """Why the env behind the server has an oracle or canaries that this client does not get (``None``: it
        withholds nothing)."""
        ...

    @property
    def client_warnings(self) -> list[str]:
        """What clients of the server should know of its tools (e.g. an argument a client library cannot pass)."""
        ...


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
    def withheld(self) -> str | None:
        """Why the env's oracle or canaries are not available to the checks although the env has them (a served env
        that does not expose them: :class:`ServedEnv`); ``None`` when nothing is withheld."""
        return self.env.withheld if isinstance(self.env, ServedEnv) else None

    def not_run(self, why: str, hint: str = "") -> Outcome:
        """The SKIP of a check that needs what :attr:`withheld` says is withheld (``why``: what it could not do)."""
        return Outcome(SKIP, f"{why}: {self.withheld}", hint, {NOT_RUN: self.withheld})

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
