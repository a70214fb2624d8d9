"""The distractor policy: the oracle's final answer padded with every candidate answer the agent can see."""

from __future__ import annotations

import math
import re
from typing import Any

from envkit.core.env import Env
from envkit.core.messages import Message
from envkit.validate.driver import Run

MAX_DISTRACTORS = 150
"""At most this many candidates pad one answer (and 4,000 characters of them, on each side of it)."""
DISTRACTOR_CALLS = 2
"""Extra calls of the answering tool, with distractor arguments, around a final tool-call answer."""
_CANDIDATE = re.compile(
    r"\b\d{4}-\d{2}-\d{2}\b"  # dates
    r"|\b[A-Za-z]+-[A-Za-z0-9]+\b"  # ids, references, code words: H-104, BK-3F9A1C, apple-17
    r"|-?\d+(?:\.\d+)?"  # numbers and prices
    r"|\b[A-Z][a-z][\w'-]*"  # names: cities, hotels, capitals
)


def candidate_tokens(text: str) -> list[str]:
    """The answer-like tokens of a text, in order: dates, ids and references, numbers, capitalised names."""
    return _CANDIDATE.findall(text)


def answer_text(action: Any) -> str:
    """The text of an action: its content and the values of its tool calls' arguments."""
    if isinstance(action, str):
        return action
    if not isinstance(action, dict):
        return ""
    parts = [str(action.get("content") or "")]
    for call in action.get("tool_calls") or [] if isinstance(action.get("tool_calls"), list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        arguments = function.get("arguments") if isinstance(function, dict) else None
        if isinstance(arguments, dict):
            parts += [
                str(v) for v in arguments.values() if isinstance(v, (str, int, float)) and not isinstance(v, bool)
            ]
    return " ".join(p for p in parts if p)


def call_text(call: Any) -> str:
    """A tool call as one line: ``issue_refund(order_id='ORD-1510', amount=32.17)``."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return repr(call)[:80]
    arguments = function.get("arguments")
    shown = (
        ", ".join(f"{k}={v!r}" if len(repr(v)) <= 40 else f"{k}={repr(v)[:40]}…" for k, v in arguments.items())
        if isinstance(arguments, dict)
        else repr(arguments)[:40]
    )
    return f"{function.get('name')}({shown})"


def _as_number(token: str) -> float | None:
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


class DistractorPolicy:
    """The oracle's actions with its answers padded by distractors: every candidate the agent can see.

    Candidates are the answer-like tokens (numbers, prices, ids, references, dates, names) of this episode's messages,
    the final answers the oracle gave on the other seeds, and the tokens of every oracle transcript; the oracle's own
    final answer is never among them. The oracle plays as usual up to its final answer (the last action of its own
    episode on the seed). In ``"pad"`` mode a final text is sent as ``candidates + text + candidates``; a final tool
    call has its string arguments padded the same way and comes between extra calls of the same tool with distractor
    arguments: calls with every argument replaced, and — for a call of several arguments — one call per answer-like
    argument (a number, an id, a date, a name) with that argument alone replaced, so that a score accepting the right
    call among wrong ones, or tolerating a wrong value in one argument (``issue_refund(order_id, amount)`` with any
    amount), lets the padded answer win. In ``"replace"`` mode the final answer is sent as distractors alone (the
    counterfactual: does the score depend on the answer at all?). Whatever the oracle says after its final answer
    (the env asked again) is treated the same way.

    Args:
        oracle_runs: The oracle's episodes on the same seeds; their last action is each seed's final answer.
    """

    def __init__(self, oracle_runs: list[Run], mode: str = "pad") -> None:
        self.mode = mode
        self.final: dict[int, tuple[int, str]] = {}
        self.answers: list[tuple[int, str]] = []
        pool: list[str] = []
        for run in oracle_runs:
            if run.fault is not None or not run.actions:
                continue
            text = answer_text(run.actions[-1]).strip()
            self.final[run.seed] = (len(run.actions) - 1, text)
            if text and len(text) <= 300:
                self.answers.append((run.seed, text))
            for message in run.messages if isinstance(run.messages, list) else []:
                pool += candidate_tokens(answer_text(message))
        self.pool = list(dict.fromkeys(pool))
        self.padded: dict[int, set[int]] = {}
        """Per seed, the steps whose action was padded (or replaced)."""
        self.examples: dict[int, tuple[str, list[str]]] = {}
        """Per seed, the first answer padded and its distractors (for the report); for a tool-call answer, the
        oracle's calls and the calls sent in their place."""
        self.call_answers: set[int] = set()
        """The seeds whose final answer is a tool call."""

    def __call__(self, env: Env, run: Run) -> Any:
        action = env.oracle()
        if action is None:
            return None
        message = action if isinstance(action, dict) else {"role": "assistant", "content": str(action)}
        final_step, final_text = self.final.get(run.seed, (-1, ""))
        is_final = 0 <= final_step <= run.steps  # the final answer, and whatever the oracle says after it
        if not is_final:
            return action
        candidates = self.candidates(env, run.seed, answer_text(message), final_text)
        if not candidates:
            return action
        calls = message.get("tool_calls")
        if not calls:
            if self.mode == "replace":
                padded = {**message, "content": _join(candidates)}
            else:
                content = str(message.get("content") or "")
                padded = {**message, "content": f"{_join(candidates)}\n{content}\n{_join(candidates[::-1])}"}
        elif isinstance(calls, list):
            padded = self._pad_calls(message, calls, candidates)
            if padded is None:
                return action
        else:
            return action
        self.padded.setdefault(run.seed, set()).add(run.steps)
        if calls and run.seed not in self.examples:  # the report shows the calls sent instead of the candidates
            self.examples[run.seed] = (" ".join(map(call_text, calls)), [call_text(c) for c in padded["tool_calls"]])
            self.call_answers.add(run.seed)
        self.examples.setdefault(run.seed, (answer_text(message), candidates))
        return padded

    def candidates(self, env: Env, seed: int, original: str, final_text: str) -> list[str]:
        """Distractors for one answer: none is a token of the oracle's own answer or equal to it."""
        own = set(candidate_tokens(original)) | set(candidate_tokens(final_text))
        own_numbers = {n for n in map(_as_number, own) if n is not None}
        seen = " ".join(
            answer_text(m)
            for m in getattr(env, "messages", []) or []
            if isinstance(m, dict) and m.get("role") != "assistant"
        )
        others = [text for s, text in self.answers if s != seed]
        chosen: list[str] = []
        for candidate in [*candidate_tokens(seen), *others, *self.pool]:
            candidate = candidate.strip()
            if (
                not candidate
                or candidate in own
                or candidate in (original.strip(), final_text)
                or _as_number(candidate) in own_numbers
                or candidate in chosen
            ):
                continue
            chosen.append(candidate)
            if len(chosen) >= MAX_DISTRACTORS or sum(map(len, chosen)) > 4_000:
                break
        return chosen

    def _pad_calls(self, message: Message, calls: list[Any], candidates: list[str]) -> Message | None:
        numbers = [n for n in map(_as_number, candidates) if n is not None]
        before: list[Any] = []
        main: list[Any] = []
        after: list[Any] = []
        changed = False
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if not isinstance(arguments, dict) or not arguments:
                main.append(call)
                continue
            padded = {}
            for key, value in arguments.items():
                if isinstance(value, str) and self.mode == "pad":
                    padded[key] = f"{_join(candidates)}\n{value}\n{_join(candidates[::-1])}"
                    changed = True
                else:
                    padded[key] = value
            if self.mode == "pad":
                main.append({**call, "function": {**function, "arguments": padded}})
            if self.mode == "pad" and len(arguments) > 1:
                for index, (key, value) in enumerate(arguments.items()):
                    if not _answer_like(value):
                        continue  # free text or a flag: replacing it alone may leave a right call
                    other = _one_distractor(value, index, numbers, candidates)
                    if other != value:
                        before.append({**call, "function": {**function, "arguments": {**arguments, key: other}}})
                        changed = True
            for k in range(DISTRACTOR_CALLS):
                variant, differs = {}, False
                for key, value in arguments.items():
                    variant[key] = _distractor_value(value, k, numbers, candidates)
                    differs = differs or variant[key] != value
                if differs:
                    (before if k % 2 == 0 else after).append({**call, "function": {**function, "arguments": variant}})
                    changed = True
        if not changed:
            return None
        return {**message, "tool_calls": before + main + after}


def _distractor_value(value: Any, index: int, numbers: list[float], candidates: list[str]) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        pool = [int(n) for n in numbers if n.is_integer()] if isinstance(value, int) else numbers
        pool = pool or numbers
        return pool[index % len(pool)] if pool else value
    if isinstance(value, str):
        return candidates[index % len(candidates)]
    return value


def _answer_like(value: Any) -> bool:
    """A number, or a string that is one answer-like token (an id, a reference, a date, a name, a number)."""
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    return isinstance(value, str) and candidate_tokens(value) == [value]


def _shape(text: str) -> str:
    return re.sub(r"[A-Za-z]", "a", re.sub(r"\d", "9", text))


def _one_distractor(value: Any, index: int, numbers: list[float], candidates: list[str]) -> Any:
    """A distractor for one argument: a number for a number; for a string, preferably a candidate of the same shape
    (another order id for an order id), so that only this argument is wrong."""
    if isinstance(value, str):
        alike = [c for c in candidates if c != value and _shape(c) == _shape(value)]
        return alike[index % len(alike)] if alike else _distractor_value(value, index, numbers, candidates)
    return _distractor_value(value, index, numbers, candidates)


def _join(candidates: list[str]) -> str:
    return " ".join(candidates)
