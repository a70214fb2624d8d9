"""The oracle's answer on a seed — the action that brought its score to 1.0 — and the episodes that replay the oracle
with that action changed, which the answer checks play (see :mod:`envkit.validate.answer_checks`)."""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass
from typing import Any

from envkit.core.messages import Message
from envkit.validate.context import EnvContext
from envkit.validate.distractors import answer_text, call_text, candidate_tokens
from envkit.validate.driver import Run
from envkit.validate.report import dump

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_KINDS = (
    re.compile(r"\d{4}-\d{2}-\d{2}"),  # dates
    re.compile(r"[A-Za-z]+-[A-Za-z0-9]+"),  # ids and references
    re.compile(r"-?\d+(?:\.\d+)?"),  # numbers
)
MAX_VALUE_CHARS = 60
"""A string argument longer than this is free text (a message, a summary), not an answer value."""


@dataclass
class Answer:
    """The oracle's answer on one seed: the action after which its score reached 1.0 and stayed there.

    Args:
        run: The oracle's episode (it scored 1.0).
        step: The index of the answer in ``run.actions``.
    """

    run: Run
    step: int

    @property
    def seed(self) -> int:
        """The seed."""
        return self.run.seed

    @property
    def action(self) -> Message:
        """The answering action, as a message."""
        action = self.run.actions[self.step]
        return action if isinstance(action, dict) else {"role": "assistant", "content": str(action)}

    @property
    def call(self) -> dict[str, Any] | None:
        """The answering tool call (the last call of the action), or ``None`` when the answer is text."""
        calls = self.action.get("tool_calls")
        if not isinstance(calls, list) or not calls:
            return None
        last = calls[-1]
        function = last.get("function") if isinstance(last, dict) else None
        return last if isinstance(function, dict) and isinstance(function.get("arguments"), dict) else None

    @property
    def arguments(self) -> dict[str, Any]:
        """The answering call's arguments (``{}`` for a text answer)."""
        return self.call["function"]["arguments"] if self.call is not None else {}

    @property
    def tool(self) -> str:
        """The name of the answering tool (``""`` for a text answer)."""
        return str(self.call["function"].get("name")) if self.call is not None else ""

    def shown(self) -> str:
        """The answer as one line: the call, or the text."""
        return call_text(self.call) if self.call is not None else repr(answer_text(self.action).strip()[:80])

    def values(self) -> list[Any]:
        """What the answer says, as values to look for elsewhere: a call's answer-like arguments (numbers, one-token
        strings; else its short strings), a text's numbers, dates and ids (else its names; else the whole text)."""
        if self.call is not None:
            values = [v for v in self.arguments.values() if is_number(v) or _one_token(v)]
            return values or [v for v in self.arguments.values() if _short_text(v)]
        text = answer_text(self.action).strip()
        tokens = candidate_tokens(text)
        specific = [t for t in tokens if any(kind.fullmatch(t) for kind in _KINDS)]
        return list(dict.fromkeys(specific or tokens[1:] or ([text] if _short_text(text) else [])))

    def with_action(self, action: Message, *, first: bool = False) -> list[Any]:
        """The oracle's actions with the answer replaced by ``action`` (``first``: sent at once, without the actions
        before it); the actions after the answer follow as recorded."""
        before = [] if first else self.run.actions[: self.step]
        return [*copy.deepcopy(before), action, *copy.deepcopy(self.run.actions[self.step + 1 :])]

    def with_arguments(self, arguments: dict[str, Any]) -> Message:
        """The answering action with the answering call's arguments replaced."""
        action = copy.deepcopy(self.action)
        call = action["tool_calls"][-1]
        call["function"] = {**call["function"], "arguments": arguments}
        return action

    def with_calls(self, calls: list[dict[str, Any]]) -> Message:
        """The answering action with its last call replaced by ``calls``."""
        action = copy.deepcopy(self.action)
        action["tool_calls"] = [*action["tool_calls"][:-1], *calls]
        return action

    def call_with(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The answering call with other arguments."""
        assert self.call is not None
        return {**self.call, "function": {**self.call["function"], "arguments": arguments}}


def answers(ctx: EnvContext) -> list[Answer]:
    """The oracle's answer on every seed where its episode reached 1.0 without a fault and the score was below 1.0
    before some action (a score that is 1.0 from the start is check 4's finding)."""
    found = []
    for run in ctx.runs.get("oracle", []):
        scores = run.scores
        if run.fault is not None or not run.actions or run.score != 1.0 or len(scores) != len(run.actions) + 1:
            continue
        below = [i for i, s in enumerate(scores[:-1]) if s < 1.0]
        if below and all(s == 1.0 for s in scores[below[-1] + 1 :]):
            found.append(Answer(run, below[-1]))
    return found


def replay_score(ctx: EnvContext, actions: list[Any], seed: int, label: str) -> float | None:
    """The score of ``actions`` replayed from ``reset(seed)`` on a fresh env (``None``: it crashed or hung)."""
    run = ctx.driver.replay(actions, seed, label)
    return None if run.fault is not None else run.score


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or a finite float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _one_token(value: Any) -> bool:
    return isinstance(value, str) and bool(value) and candidate_tokens(value) == [value]


def _short_text(value: Any) -> bool:
    return isinstance(value, str) and 2 <= len(value.strip()) <= MAX_VALUE_CHARS


def numbers_in(text: str) -> list[float]:
    """The numbers a text states (``1,200`` read as 1200)."""
    found = []
    for token in _NUMBER.findall(text):
        try:
            found.append(float(token.replace(",", "")))
        except ValueError:
            continue
    return found


def mentions(text: str, value: Any) -> bool:
    """Whether ``text`` states ``value``: a number as a number (``32.17``, ``32.170``), a string as a whole word."""
    if is_number(value):
        return float(value) in numbers_in(text)
    if isinstance(value, str) and value.strip():
        number = _as_float(value)
        if number is not None:
            return number in numbers_in(text)
        return re.search(rf"(?<![\w-]){re.escape(value.strip())}(?![\w-])", text) is not None
    return False


def _as_float(text: str) -> float | None:
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def same(a: Any, b: Any) -> bool:
    """Whether two argument values say the same (``"7"`` and ``7.0`` do)."""
    if dump(a) == dump(b):
        return True
    x = float(a) if is_number(a) else _as_float(a) if isinstance(a, str) else None
    y = float(b) if is_number(b) else _as_float(b) if isinstance(b, str) else None
    return x is not None and x == y
