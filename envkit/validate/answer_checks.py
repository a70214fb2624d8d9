"""The answer checks: the answer is not shown to the agent before the work, a tool-call answer's arguments decide the
score, and the score accepts the answer alone (not a superset, duplicates, neighbours or the right call among
others). Each plays the oracle's episodes with its answer (:class:`~envkit.validate.answers.Answer`) changed."""

from __future__ import annotations

import json
import re
from typing import Any

from envkit.validate.answers import Answer, answers, is_number, mentions, replay_score, same
from envkit.validate.context import EnvContext
from envkit.validate.distractors import call_text, candidate_tokens
from envkit.validate.policies import REFUSAL
from envkit.validate.report import FAIL, NOT_RUN, PASS, SKIP, Outcome, short
from envkit.validate.semantic_checks import check_distractors

LEAK_SEEDS = 2
"""An answer shown before the work on at least this many seeds, with different answers, is a leak (once could be a
coincidence: a count that happens to be a number of the question)."""
_LABEL = re.compile(
    r"(?i)\b(?:answer|expected|solution|gold|correct|target|ground[ _]truth)\b[\"'\s:=]*(?:is|was|would be)?[\"'\s:=]*"
)
VISIBLE_HINT = (
    "the agent can read the answer instead of doing the work — GRPO learns to copy it: keep the answer (and what "
    "the score compares against) out of the prompt, the tool schemas and tool results until the agent has earned it"
)
TOOL_ANSWER_HINT = (
    "the score does not read the answering call's arguments: compare them with the task's answer (validate them "
    "in the tool: an unknown id is an error, not a record), and score the submission, not that a call was made"
)
ACCEPTS_MORE_HINT = {
    "among": "score the final state exactly: the right call made once and no other call of the answering tool — a "
    "model that sprays calls with guessed arguments must not win",
    "superset": "compare the whole answer: a list with an extra item is wrong (every gold item present is not enough)",
    "duplicates": "compare lists as lists (or multisets), not as sets: a repeated item is a wrong answer",
    "neighbour": "compare exactly (or to the precision the task states): a tolerance that accepts a neighbouring "
    "value lets a model guess around the answer",
}
GARBAGE = {"str": "qqq-000", "int": 987654321, "float": 0.001}


# ---- class 1: the answer is visible before the work -----------------------------------------------------------------
def check_answer_hidden(ctx: EnvContext) -> Outcome:
    """The oracle's answer on a seed (all its values: a call's answer-like arguments, a text's numbers and ids) is
    not shown to the agent before the work: not in the system message, the tool schemas after ``reset``, a labelled
    place of the opening user message (``answer: 42``), nor a tool result of the random policy's calls. A leak counts
    when it repeats on several seeds with different answers."""
    if not ctx.has_oracle and ctx.withheld:
        return ctx.not_run("there is no answer to look for")
    if not ctx.has_oracle:
        return Outcome(SKIP, "the env has no oracle(): there is no answer to look for")
    found = [a for a in answers(ctx) if a.values()]
    if not found:
        return Outcome(SKIP, "no oracle episode reached 1.0 with an answer to look for")
    random_runs = {r.seed: r for r in ctx.runs.get("random", [])}
    leaks: list[tuple[Answer, str, str]] = []
    for answer in found:
        where = _leak(ctx, answer, random_runs.get(answer.seed))
        if ctx.driver.hang is not None:
            return Outcome(SKIP, "not finished: the env hung")
        if where is not None:
            leaks.append((answer, *where))
    distinct = {json.dumps(a.values(), default=str) for a, _, _ in leaks}
    details: dict[str, Any] = {"seeds_checked": [a.seed for a in found], "leaked_seeds": [a.seed for a, _, _ in leaks]}
    if len(leaks) >= LEAK_SEEDS and len(distinct) >= 2:
        answer, where, context = leaks[0]
        return Outcome(
            FAIL,
            f"{len(leaks)}/{len(found)} seeds show the answer before the work; seed {answer.seed}: the oracle's "
            f"answer {_values_shown(answer)} is in {where}: {context}",
            VISIBLE_HINT,
            details,
        )
    return Outcome(
        PASS,
        f"the oracle's answers on {len(found)} seeds appear nowhere before the work (system message, tool schemas, "
        "labelled in the user's message, tool results of random calls)",
        details=details,
    )


def _values_shown(answer: Answer) -> str:
    """The answer's values as the report shows them: the call, or a text's values and the text."""
    if answer.call is not None:
        return answer.shown()
    return f"{', '.join(map(str, answer.values()))} (in {answer.shown()})"


def _leak(ctx: EnvContext, answer: Answer, random_run: Any) -> tuple[str, str] | None:
    """Where the agent sees ``answer`` before the work (a place and the text around it), or ``None``."""
    values = answer.values()
    opening = answer.run.messages[: answer.run.observed[0]] if answer.run.observed else []
    for message in opening:
        content = str(message.get("content") or "") if isinstance(message, dict) else ""
        if message.get("role") == "system" and _all_in(content, values):
            return "the system message", _around(content, values[0])
        if message.get("role") == "user" and _all_in(content, values) and _labelled(content, values):
            return "the opening user message, labelled", _around(content, values[0])
    schemas = _schemas(ctx, answer.seed)
    if schemas and _all_in(schemas, values):
        return "the tool schemas after reset", _around(schemas, values[0])
    work = {_call_key(c) for action in answer.run.actions[: answer.step] for c in _calls_of(action)}
    for call, message in _results(random_run.messages if random_run is not None else []):
        content = str(message.get("content") or "")
        if _call_key(call) not in work and _all_in(content, values):  # the oracle's own calls are the work
            return f"the result of a random call {call_text(call)}", _around(content, values[0])
    return None


def _calls_of(action: Any) -> list[Any]:
    calls = action.get("tool_calls") if isinstance(action, dict) else None
    return calls if isinstance(calls, list) else []


def _call_key(call: Any) -> str:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return repr(call)
    return json.dumps([function.get("name"), function.get("arguments")], sort_keys=True, default=str)


def _results(messages: list[Any]) -> list[tuple[Any, dict[str, Any]]]:
    """Each tool message of a transcript with the call it answers (calls are answered in order)."""
    pending: list[Any] = []
    paired = []
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            pending = list(_calls_of(message))
        elif message.get("role") == "tool" and pending:
            paired.append((pending.pop(0), message))
    return paired


def _schemas(ctx: EnvContext, seed: int) -> str:
    """The env's tool schemas after ``reset(seed)``, as JSON (a schema may be built per task)."""
    from envkit.validate.driver import Run

    run = Run("answer hidden: schemas", seed)
    env = ctx.driver.new_env(run.policy)
    if env is None or not ctx.driver.reset(env, run):
        return ""
    try:
        tools = ctx.driver.call(lambda: getattr(env, "tools", None))[0]
        return json.dumps(tools, default=str) if tools else ""
    except Exception:
        return ""  # a broken tools property is the schema check's finding


def _all_in(text: str, values: list[Any]) -> bool:
    return bool(values) and all(mentions(text, v) for v in values)


def _labelled(text: str, values: list[Any]) -> bool:
    return any(
        mentions(text[m.end() : m.end() + 40].split("\n")[0][: len(str(v)) + 8], v)
        for m in _LABEL.finditer(text)
        for v in values
    )


def _around(text: str, value: Any) -> str:
    needle = str(value)
    at = text.find(needle)
    if at < 0 and is_number(value):
        match = re.search(re.escape(f"{value:g}") if isinstance(value, float) else str(value), text)
        at = match.start() if match else 0
    start = max(0, at - 40)
    return repr(("…" if start else "") + text[start : at + len(needle) + 30].replace("\n", " ") + "…")


# ---- class 2: the score ignores a tool-call answer ------------------------------------------------------------------
def check_tool_answer(ctx: EnvContext) -> Outcome:
    """Where the oracle answers with a tool call, the call's arguments decide the score: the call with garbage
    arguments, empty ones, another task's answer or a refusal — in the answer's place, and as the very first action
    (the answer tool called without the work) — scores below 1.0."""
    if not ctx.has_oracle and ctx.withheld:
        return ctx.not_run("there is no tool-call answer to vary")
    if not ctx.has_oracle:
        return Outcome(SKIP, "the env has no oracle(): there is no tool-call answer to vary")
    found = [a for a in answers(ctx) if a.call is not None and any(_variable(v) for v in a.arguments.values())]
    if not found:
        return Outcome(PASS, "the oracle answers in text, not with a tool call: nothing to vary (see checks 4 and 15)")
    hacked: list[str] = []
    plays = 0
    for answer in found:
        others = [a for a in found if a.seed != answer.seed and a.tool == answer.tool]
        for label, arguments in _counterfactuals(answer, others):
            for first in (False, True) if answer.step else (False,):
                plays += 1
                variant = answer.with_arguments(arguments)
                score = replay_score(
                    ctx, answer.with_action(variant, first=first), answer.seed, f"tool answer: {label}"
                )
                if ctx.driver.hang is not None:
                    return Outcome(SKIP, "not finished: the env hung")
                if score == 1.0:
                    when = "as the first action, without the work" if first else "in the answer's place"
                    hacked.append(
                        f"seed {answer.seed}: {call_text(answer.call_with(arguments))} ({label}) {when} scores 1.0 "
                        f"like the oracle's {answer.shown()}"
                    )
                    break
            if hacked and hacked[-1].startswith(f"seed {answer.seed}:"):
                break
    details: dict[str, Any] = {"seeds_checked": [a.seed for a in found], "episodes": plays, "hacked": hacked[:20]}
    if hacked:
        return Outcome(
            FAIL,
            f"the score ignores the answering call's arguments on {len(hacked)}/{len(found)} seeds; {hacked[0]}",
            TOOL_ANSWER_HINT,
            details,
        )
    return Outcome(
        PASS,
        f"the answering call with garbage, empty, another task's or refused arguments, in place and first, scores "
        f"below 1.0 on {len(found)} seeds ({plays} episodes)",
        details=details,
    )


def _variable(value: Any) -> bool:
    return is_number(value) or (isinstance(value, str) and bool(value.strip())) or isinstance(value, list)


def _counterfactuals(answer: Answer, others: list[Answer]) -> list[tuple[str, dict[str, Any]]]:
    """The answering call's arguments replaced: garbage, empty, another task's answer, a refusal — each only when it
    differs from the oracle's arguments."""
    arguments = answer.arguments
    garbage = {k: _garbage(v) for k, v in arguments.items()}
    empty = {k: _empty(v) for k, v in arguments.items()}
    refusal = {k: REFUSAL if isinstance(v, str) else v for k, v in arguments.items()}
    variants = [("garbage arguments", garbage), ("empty arguments", empty), ("a refusal", refusal)]
    other = next(
        (o.arguments for o in others if set(o.arguments) == set(arguments) and not _same_arguments(o, answer)), None
    )
    if other is not None:
        variants.insert(2, ("another task's answer", other))
    return [(label, v) for label, v in variants if not all(same(v[k], arguments[k]) for k in arguments)]


def _same_arguments(a: Answer, b: Answer) -> bool:
    return all(same(a.arguments.get(k), v) for k, v in b.arguments.items() if _variable(v))


def _garbage(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return GARBAGE["int"]
    if isinstance(value, float):
        return GARBAGE["float"]
    if isinstance(value, str):
        return GARBAGE["str"]
    if isinstance(value, list):
        return [GARBAGE["str"]]
    return value


def _empty(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        return type(value)(0)
    if isinstance(value, str):
        return ""
    if isinstance(value, list):
        return []
    return value


# ---- class 3: the score accepts more than the answer ----------------------------------------------------------------
def check_accepts_more(ctx: EnvContext) -> Outcome:
    """The score accepts the answer alone: the oracle's final answer padded with every candidate in sight (check 15's
    distractors) scores below 1.0, and so do — where the changed part decides the score — the right call sent among
    calls of the same tool with what the agent saw before answering, a list answer with an extra item or a repeated
    one, and a neighbouring number (±1, ±1%) in the answer's place."""
    padded = check_distractors(ctx)
    if padded.status == FAIL or (padded.status == SKIP and NOT_RUN in padded.details):
        return padded
    found = answers(ctx) if ctx.has_oracle else []
    if not found:
        return padded
    hacked: list[tuple[str, str]] = []
    tried: dict[str, int] = {}
    for answer in found:
        for kind, label, bearing, action in _more(answer, _candidates(answer, found), _seen(answer)):
            if bearing is not None:
                base = replay_score(ctx, answer.with_action(bearing), answer.seed, f"accepts more: {kind} baseline")
                if ctx.driver.hang is not None:
                    return Outcome(SKIP, "not finished: the env hung")
                if base is None or base >= 1.0:
                    continue  # the changed part does not decide the score here
            tried[kind] = tried.get(kind, 0) + 1
            run = ctx.driver.replay(answer.with_action(action), answer.seed, f"accepts more: {kind}")
            if ctx.driver.hang is not None:
                return Outcome(SKIP, "not finished: the env hung")
            if run.fault is None and run.score == 1.0 and not (kind == "among" and _all_refused(answer, run)):
                hacked.append((kind, f"seed {answer.seed}: {label} scores 1.0 like the oracle's {answer.shown()}"))
                break
    details: dict[str, Any] = {**padded.details, "variants_tried": tried, "hacked": [h for _, h in hacked][:20]}
    if hacked:
        kind, line = hacked[0]
        return Outcome(
            FAIL,
            f"the score accepts more than the answer on {len(hacked)}/{len(found)} seeds; {line}",
            ACCEPTS_MORE_HINT[kind],
            details,
        )
    if not tried:
        return padded
    kinds = ", ".join(f"{k} ({n})" for k, n in tried.items())
    lead = padded.reason if padded.status == PASS else "the padded final answer decides nothing"
    return Outcome(
        PASS,
        f"{lead}; the right answer among others, supersets, duplicates and neighbours: none scores 1.0 ({kinds})",
        details=details,
    )


def _all_refused(answer: Answer, run: Any) -> bool:
    """Whether every distractor call of an "among" episode was refused as an error (an unknown id): the env then
    scored the right call alone, which is no finding."""
    action = run.actions[answer.step] if len(run.actions) > answer.step else {}
    distractors = len(action.get("tool_calls") or []) - len(answer.action.get("tool_calls") or [])
    return distractors > 0 and _errors(run.messages) - _errors(answer.run.messages) >= distractors


def _errors(messages: list[Any]) -> int:
    return sum(
        1
        for m in messages
        if isinstance(m, dict) and m.get("role") == "tool" and str(m.get("content") or "").startswith("Error")
    )


def _candidates(answer: Answer, found: list[Answer]) -> list[Any]:
    """Distractor values for one answer, nearest first: the answer-like tokens of what its own episode showed the
    agent (the other orders of this customer), then every other seed's answer values and episode tokens — never
    a value of the answer itself."""
    pool: list[Any] = []
    for other in [answer, *(a for a in found if a is not answer)]:
        if other is not answer:
            pool += other.values()
        for message in other.run.messages:
            if isinstance(message, dict) and message.get("role") != "assistant":
                pool += candidate_tokens(str(message.get("content") or ""))
    unique = {json.dumps(v, default=str): v for v in reversed(pool)}
    ordered = [unique[k] for k in dict.fromkeys(json.dumps(v, default=str) for v in pool)]
    return [c for c in ordered if not _mentioned(answer, c)]


def _seen(answer: Answer) -> list[Any]:
    """The answer-like tokens the env showed the agent before it answered (the alternatives it could spray), never a
    value of the answer itself."""
    before: list[Any] = []
    assistant_turns = 0
    for message in answer.run.messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") == "assistant":
            assistant_turns += 1
            if assistant_turns > answer.step:
                break
            continue
        before += candidate_tokens(str(message.get("content") or ""))
    return [c for c in dict.fromkeys(before) if not _mentioned(answer, c)]


def _mentioned(answer: Answer, value: Any) -> bool:
    return any(same(value, v) for v in answer.values())


def _more(answer: Answer, candidates: list[Any], seen: list[Any]) -> list[tuple[str, str, Any, Any]]:
    """The variants of one answer: ``(kind, what is sent, the action that shows the changed part decides the score or
    None, the action)``."""
    variants: list[tuple[str, str, Any, Any]] = []
    if answer.call is not None:
        arguments = answer.arguments
        # The calls the right one is hidden among use only what this episode showed the agent (the customer's
        # other orders): spraying the visible alternatives is the hack; a calculator called with made-up numbers
        # beside the right ones is not.
        others = [_other_arguments(arguments, seen, k) for k in range(2)]
        others += [
            {**arguments, key: _like(value, seen)} for key, value in arguments.items() if _like(value, seen) is not None
        ]
        others = [o for o in others if not all(same(o[k], arguments[k]) for k in arguments)]
        if others:
            calls = [answer.call_with(o) for o in others]
            middle = len(calls) // 2
            sent = [*calls[:middle], answer.call, *calls[middle:]]
            label = f"{answer.shown()} sent among {len(sent)} calls ({'; '.join(map(call_text, sent))})"
            variants.append(("among", label, answer.with_calls(calls), answer.with_calls(sent)))
        for key, value in arguments.items():
            first = value[0] if isinstance(value, list) and value else str(value).split(",")[0].strip()
            distractor = _like(first, candidates) or next((c for c in candidates if isinstance(c, str) and c), None)
            for kind, changed in _list_variants(value, distractor):
                wrong = {**arguments, key: _garbage(value)}
                label = f"{call_text(answer.call_with({**arguments, key: changed}))}"
                variants.append(
                    (kind, label, answer.with_arguments(wrong), answer.with_arguments({**arguments, key: changed}))
                )
            for near in _neighbours(value):
                changed = type(value)(near) if not isinstance(value, str) else _number_text(near, value)
                wrong = {**arguments, key: _far(value)}
                label = call_text(answer.call_with({**arguments, key: changed}))
                variants.append(
                    (
                        "neighbour",
                        label,
                        answer.with_arguments(wrong),
                        answer.with_arguments({**arguments, key: changed}),
                    )
                )
        return variants
    text = str(answer.action.get("content") or "")
    for token in dict.fromkeys(re.findall(r"(?<![\w.,-])\d+(?:\.\d+)?(?![\w-]|\.\d)", text)):
        far = _number_text(_far(float(token)), token)
        for near in _neighbours(token):
            changed = text.replace(token, _number_text(near, token), 1)
            variants.append(
                (
                    "neighbour",
                    repr(short(changed, 80)),
                    {**answer.action, "content": text.replace(token, far, 1)},
                    {**answer.action, "content": changed},
                )
            )
    return variants


def _other_arguments(arguments: dict[str, Any], candidates: list[Any], index: int) -> dict[str, Any]:
    """Every argument replaced by a distractor of its type."""
    numbers = [c for c in candidates if is_number(c)] + [float(c) for c in candidates if isinstance(c, str) and _num(c)]
    strings = [c for c in candidates if isinstance(c, str)]
    other = {}
    for key, value in arguments.items():
        if is_number(value) and numbers:
            pick = numbers[index % len(numbers)]
            other[key] = int(pick) if isinstance(value, int) else float(pick)
        elif isinstance(value, str) and strings:
            other[key] = _like(value, candidates, index) or strings[index % len(strings)]
        else:
            other[key] = value
    return other


def _like(value: Any, candidates: list[Any], index: int = 0) -> Any:
    """A distractor for one argument of the same shape (another order id for an order id), or ``None``."""
    if isinstance(value, str) and value:
        shape = _shape(value)
        alike = [c for c in candidates if isinstance(c, str) and c != value and _shape(c) == shape]
        return alike[index % len(alike)] if alike else None
    return None


def _shape(text: str) -> str:
    return re.sub(r"[A-Za-z]", "a", re.sub(r"\d", "9", text))


def _num(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _list_variants(value: Any, distractor: str | None) -> list[tuple[str, Any]]:
    """A list answer (a JSON list, or comma-separated values in a string) with an extra item, and with an item twice."""
    if isinstance(value, list) and value:
        extra = distractor if distractor is not None and distractor not in value else None
        return [*([("superset", [*value, extra])] if extra else []), ("duplicates", [value[0], *value])]
    if isinstance(value, str) and value.strip() and "\n" not in value and len(value) <= 200:
        items = [part.strip() for part in value.split(",") if part.strip()]
        if not items:
            return []
        extra = distractor if distractor is not None and distractor not in items else None
        variants = [("duplicates", ", ".join([items[0], *items]))]
        if extra is not None:
            variants.insert(0, ("superset", ", ".join([*items, extra])))
        return variants
    return []


def _neighbours(value: Any) -> list[float]:
    """Numbers next to an answer: ±1 for a whole number, ±1% (at the answer's precision) for a decimal."""
    if isinstance(value, str):
        if not _num(value.strip()):
            return []
        number, decimals = float(value), len(value.strip().partition(".")[2])
    elif is_number(value):
        number, decimals = float(value), 0 if isinstance(value, int) else max(2, len(repr(value).partition(".")[2]))
    else:
        return []
    if decimals == 0 and number == int(number):
        return [number - 1, number + 1]
    step = round(abs(number) * 0.01, decimals) or 10.0**-decimals
    return [round(number - step, decimals), round(number + step, decimals)]


def _far(value: Any) -> Any:
    """A number far from the answer, of its type."""
    if isinstance(value, str):
        return _number_text(float(value) * 7 + 13, value)
    number = float(value) * 7 + 13
    return int(number) if isinstance(value, int) else round(number, 2)


def _number_text(number: float, like: str) -> str:
    decimals = len(str(like).strip().partition(".")[2])
    return f"{number:.{decimals}f}"
