"""What a validation run produces: statuses, each check's outcome, the whole report, and their text forms."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from envkit.core.messages import Message

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"
STATUSES = (PASS, FAIL, WARN, SKIP)
"""Every status a check can end in, in report order."""

RESET_BROKEN = "reset-broken"
RESET_NONDETERMINISTIC = "reset-nondeterministic"
STEP_NONDETERMINISTIC = "step-nondeterministic"
VACUOUS_SCORE = "vacuous-score"
TEMPLATE_DROPS_TOOLS = "template-drops-tools"
"""The root causes a check's :class:`Outcome` may name (described in :data:`envkit.validate.registry.ROOT_CAUSES`)."""

NOT_RUN = "not_run_because"
"""The ``details`` key of a check that could not run for a reason outside the env's code (e.g. a served env that
withholds its oracle): :meth:`ValidationReport.not_run` lists them."""


@dataclass
class Outcome:
    """What a check function found; the runner adds the check's id, title and RFC-008 id from the registry."""

    status: str
    reason: str
    hint: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    cause: str = ""
    """The root cause the finding comes from (a key of :data:`~envkit.validate.registry.ROOT_CAUSES`), or ``""``:
    the runner reports one root cause once and turns the checks that depend on it into SKIPs naming the check
    that reported it."""


@dataclass
class Check:
    """The outcome of one check, as reported.

    ``id`` is envkit's number of the check (the ``#`` of the report); ``rfc008`` the OpenEnv RFC-008 check id it
    implements, or ``None`` where RFC-008 has none.
    """

    id: int
    name: str
    status: str
    reason: str
    hint: str = ""
    details: dict[str, Any] = field(default_factory=dict)
    rfc008: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``: both ids first."""
        return {
            "id": self.id,
            "rfc008": self.rfc008,
            "name": self.name,
            "status": self.status,
            "reason": self.reason,
            "hint": self.hint,
            "details": self.details,
        }


@dataclass
class ValidationReport:
    """All checks of one validation run."""

    target: str
    kind: str
    checks: list[Check]
    seconds: float
    seeds: list[int]
    template: str = ""
    """The tokenizer / chat template transcripts were rendered with."""

    @property
    def failed(self) -> bool:
        """Whether any check failed."""
        return any(c.status == FAIL for c in self.checks)

    def counts(self) -> dict[str, int]:
        """How many checks ended in each status."""
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    def not_run(self) -> dict[str, list[int]]:
        """The checks that could not run for a reason outside the env's code, by that reason (e.g. ``"the served
        env exposes no oracle (serve-env --expose-oracle)"``: ``[3, 11, 15, 17, 18]``)."""
        reasons: dict[str, list[int]] = {}
        for check in self.checks:
            why = check.details.get(NOT_RUN) if check.status == SKIP else None
            if why:
                reasons.setdefault(str(why), []).append(check.id)
        return reasons

    def summary(self) -> str:
        """One line: the verdict and the counts (and which checks could not run, and why)."""
        counts = self.counts()
        verdict = "FAILED" if self.failed else "passed"
        parts = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        seeds = seed_range(self.seeds)
        line = f"{self.target}: validation {verdict} ({parts}) in {self.seconds:.1f}s over seeds {seeds}"
        for why, ids in self.not_run().items():
            line += f"; checks {', '.join(map(str, ids))} not run: {why}"
        return line

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "target": self.target,
            "kind": self.kind,
            "ok": not self.failed,
            "counts": self.counts(),
            "seconds": round(self.seconds, 3),
            "seeds": self.seeds,
            "template": self.template,
            "checks": [c.to_dict() for c in self.checks],
            "not_run": self.not_run(),
        }


class ConstructionError(Exception):
    """The env could not be built or imported at all (the CLI exits with code 2)."""


def short(action: Any, limit: int = 160) -> str:
    """An action (or any value) as one line of JSON, cut at ``limit`` characters; ``""`` for ``None``."""
    if action is None:
        return ""
    try:
        text = json.dumps(action, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(action)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


def dump(value: Any) -> str:
    """A canonical JSON text of ``value``: two values are the same when their dumps are."""
    return json.dumps(value, sort_keys=True, default=repr, ensure_ascii=False)


def first_different_message(a: list[Message], b: list[Message]) -> int | None:
    """The index of the first message that differs between two transcripts (``None`` when they are the same)."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if dump(x) != dump(y):
            return index
    return min(len(a), len(b)) if len(a) != len(b) else None


def first_difference(a: list[Message], b: list[Message]) -> str:
    """Where two transcripts first differ, for a report line: the message and, in both, the text around the first
    character that differs (a long message is cut around it, so the two sides never print the same prefix)."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        left, right = dump(x), dump(y)
        if left != right:
            at = next(
                (i for i, (p, q) in enumerate(zip(left, right, strict=False)) if p != q), min(len(left), len(right))
            )
            return f"message {index}, character {at} ({around(left, at)} vs {around(right, at)})"
    return f"message {min(len(a), len(b))} (lengths {len(a)} vs {len(b)})" if len(a) != len(b) else "the score"


def around(text: str, at: int, before: int = 30, after: int = 30) -> str:
    """``text`` cut to the characters around position ``at``, with ``…`` where it was cut."""
    start, end = max(0, at - before), at + after
    return f"{'…' if start else ''}{text[start:end]}{'…' if end < len(text) else ''}"


def fmt_score(value: float | None) -> str:
    """A score with three decimals, or ``"no score"``."""
    return "no score" if value is None else f"{value:.3f}"


def seed_range(seeds: list[int]) -> str:
    """``"0–7"`` for seeds 0 … 7; ``"-"`` when there are none."""
    return f"{seeds[0]}–{seeds[-1]}" if seeds else "-"
