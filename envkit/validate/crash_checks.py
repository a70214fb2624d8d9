"""The final-answer input check: what a model really sends as its answer — numbers with commas, units or currency
signs, empty, whitespace, huge or oddly typed values — sent in place of the oracle's final action, where the env
parses and scores the answer. The fuzzing check (7) sends malformed actions as the *first* action, before any state
an answer is compared against exists; this one sends them where an answer is scored."""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any

from envkit.core.env import Env
from envkit.validate.context import EnvContext
from envkit.validate.driver import Driver, Fault, Run
from envkit.validate.policies import tool_schemas
from envkit.validate.report import FAIL, PASS, SKIP, Outcome, short

PROBE_SEEDS = 2
"""The oracle episodes (one per seed, the first that played without a fault) whose final action is probed."""
MAX_PROBES = (40, 16)
"""At most this many inputs are sent in place of one answering action on the first seed, and on each later one
(each on a fresh env replayed up to that action; the later seeds get the number-shaped variants, which come first)."""
HUGE_DIGITS = 400
"""The digits of the huge number probe: more than a float holds (``float()`` gives ``inf``)."""
HUGE_TEXT_CHARS = 100_000
"""The characters of the huge text probe."""

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_TOOL_CRASH = re.compile(r"^Error: (?P<tool>\S+) failed with (?P<error>[A-Za-z_][\w.]*): (?P<message>.*)", re.S)
"""What :meth:`envkit.ToolEnv.call_tool` answers when a tool raises anything but ``ToolError``."""


@dataclass(frozen=True)
class Probe:
    """One input sent in place of the final action.

    Args:
        label: What is sent, for a report line: ``answer='1,234' (thousands separator)``.
        action: The action sent.
        typed: Whether the sent values have the types the tool's schema declares (a tool crashing on a wrong type
            is not reported for an env that leaves arguments unchecked on purpose, ``argument_validation="none"``).
    """

    label: str
    action: Any
    typed: bool = True


def text_variants(value: str) -> list[tuple[str, str]]:
    """How a model writes an answer like ``value`` in ways an answer parser may not expect: ``(why, text)`` pairs.

    Args:
        value: The oracle's answer text (or one string argument of its answering call).

    Returns:
        The variants, numbers first when ``value`` holds one (commas, units, currency, trailing period, decimals,
        scientific notation, a 5,000-digit number), then any answer's (empty, whitespace, a refusal, a sentence
        around it, markup, case, control characters, 100 KB).
    """
    found = _NUMBER.findall(value)
    variants: list[tuple[str, str]] = []
    if found:
        number = found[-1]
        whole = number.split(".")[0].lstrip("-") or "0"
        grouped = f"{int(whole):,}" if len(whole) > 3 else f"1,{whole.zfill(3)}"
        variants += [
            ("thousands separator", value.replace(number, grouped, 1) if number in value else grouped),
            ("a unit after the number", f"{number} km"),
            ("a currency sign", f"${number}"),
            ("a currency word", f"{number} dollars"),
            ("a percent sign", f"{number}%"),
            ("a trailing period", f"{number}."),
            ("a decimal point", f"{number}.0" if "." not in number else f"{number}00"),
            ("scientific notation", f"{number}e0"),
            ("a fraction", f"{number}/1"),
            ("a plus sign", f"+{number.lstrip('-')}"),
            ("a number word", "forty-two"),
            ("a range", f"{number}-{number}"),
            (f"a {HUGE_DIGITS}-digit number", "9" * HUGE_DIGITS),
        ]
    variants += [
        ("empty", ""),
        ("whitespace only", " \n\t "),
        ("padded with whitespace", f"  {value}\n"),
        ("not an answer", "I don't know."),
        ("N/A", "N/A"),
        ("a sentence around it", f"The answer is {value}."),
        ("markdown", f"**{value}**"),
        ("LaTeX", f"\\boxed{{{value}}}"),
        ("quoted", f'"{value}"'),
        ("upper case", value.upper()),
        ("control characters", f"{value}\x00\u202e"),
        ("100 KB of text", ("z" * HUGE_TEXT_CHARS)),
    ]
    return variants


def _value_variants(schema: dict[str, Any], value: Any) -> list[tuple[str, Any, bool]]:
    """``(why, value, typed)`` variants of one argument of the answering call, by its schema's type."""
    kind = schema.get("type")
    kinds = set(kind) if isinstance(kind, list) else {kind}
    variants: list[tuple[str, Any, bool]] = []
    if "string" in kinds or (not kind and isinstance(value, str)):
        variants += [(why, text, True) for why, text in text_variants(str(value if value is not None else ""))]
        variants += [("a number for a string", 42, False), ("a list for a string", [str(value)], False)]
    if kinds & {"number", "integer"}:
        number = value if isinstance(value, (int, float)) and not isinstance(value, bool) else 42
        variants += [
            ("zero", 0, True),
            ("negative", -abs(number) - 1, True),
            ("a 40-digit integer", 10**40, True),
            ("a float near the largest", 1e308, True),
            ("a fraction for an integer" if "integer" in kinds else "many decimals", number + 0.123456789, True),
            ("the number as a string", str(number), False),
            ("the number with a thousands separator", f"{number:,}", False),
            ("the number with a unit", f"{number} dollars", False),
        ]
    if "boolean" in kinds:
        variants += [("a string for a boolean", "yes", False), ("a number for a boolean", 1, False)]
    if "array" in kinds:
        items = value if isinstance(value, list) else []
        variants += [
            ("an empty list", [], True),
            ("a list with null", [*items, None], False),
            ("a list of mixed types", [None, 1, "a", [2]], False),
            ("the items repeated", items * 2, True),
            ("1,000 items", (items or ["a"]) * (1000 // max(1, len(items))), True),
            ("a string for a list", ", ".join(map(str, items)) or "a, b", False),
        ]
    if "object" in kinds:
        variants += [("an empty object", {}, True), ("a list for an object", [value], False)]
    variants += [("null", None, "null" in kinds)]
    return variants


def final_probes(env: Env, final: Any) -> list[Probe]:
    """The inputs sent in place of ``final``, the oracle's final action: variants of its text when it answers in text,
    else of each argument of its last tool call (the answering call), plus that call with arguments missing, extra,
    empty or unparsable.

    Args:
        env: The env (its tool schemas type the answering call's arguments).
        final: The oracle's final action.
    """
    message = {"role": "assistant", "content": final} if isinstance(final, str) else final
    if not isinstance(message, dict):
        return []
    calls = message.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        content = str(message.get("content") or "")
        return [
            Probe(f"{short(text, 40)} ({why})", {**message, "content": text}) for why, text in text_variants(content)
        ]
    call = calls[-1]
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        return []
    name, arguments = function["name"], function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return []
    if not isinstance(arguments, dict):
        return []
    schema = next(
        (t["function"].get("parameters", {}) for t in tool_schemas(env) if t["function"].get("name") == name), {}
    )
    properties = schema.get("properties", {}) if isinstance(schema, dict) else {}

    def probe(label: str, new_arguments: Any, typed: bool = True) -> Probe:
        new_call = {**call, "function": {**function, "arguments": new_arguments}}
        return Probe(f"{name}({label})", {**message, "tool_calls": [*calls[:-1], new_call]}, typed)

    probes = []
    for key in arguments:
        argument_schema = properties.get(key, {}) if isinstance(properties.get(key), dict) else {}
        for why, value, typed in _value_variants(argument_schema, arguments[key]):
            probes.append(probe(f"{key}={short(value, 40)}: {why}", {**arguments, key: value}, typed))
    required = schema.get("required", list(arguments)) if isinstance(schema, dict) else list(arguments)
    probes += [
        probe("no arguments", {}, not required),
        probe("an extra argument", {**arguments, "note": "done"}, False),
        probe("arguments as unparsable JSON", '{"' + next(iter(arguments), "answer") + '": ', False),
    ]
    return probes


@dataclass
class Crash:
    """A crash one probe caused: where, the one-line finding, and the site it raised at (to tell one bug from two)."""

    line: str
    site: str


def crash_site(trace: str, error: str) -> str:
    """Where an exception was raised: its type and the innermost frame of its traceback (``file:line``), so two
    faults with one site are one bug found twice."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', trace)
    kind = error.split(":", 1)[0]
    return f"{kind} at {frames[-1][0]}:{frames[-1][1]}" if frames else kind


def raised_in(trace: str) -> str:
    """The function the innermost frame of a traceback is in, for a report line: ``" (in answer(), line 51)"``;
    ``""`` when the trace has no frame."""
    frames = [f for f in re.findall(r'File "[^"]+", line (\d+), in (\S+)', trace) if not f[1].startswith("<")]
    return f" (in {frames[-1][1]}(), line {frames[-1][0]})" if frames else ""


def fault_site(fault: Fault) -> str:
    """:func:`crash_site` of a recorded fault."""
    return crash_site(fault.trace, fault.error)


REPORTED_BY = ("fuzz:", "never stops", "oracle", "final answer:")
"""The scripted episodes whose crashes a check reports (fuzzing 7, termination 9, the oracle's 3 and 18, this
check's), by the start of their policy label; every crash of ``score()`` is reported by check 8."""


def reported_sites(driver: Driver) -> set[str]:
    """The sites (:func:`crash_site`) of the crashes a check has reported so far: a crash found again at one of them
    is the same bug, reported once."""
    return {fault_site(f) for f in driver.faults if f.where == "score" or f.policy.startswith(REPORTED_BY)}


def answering_steps(actions: list[Any]) -> list[int]:
    """Which of an oracle episode's actions are answers: the final one, and the last tool call before it when the
    final one is text (a booking, then a goodbye to the simulated user)."""
    final = len(actions) - 1
    steps = [final]
    if not _calls(actions[final]):
        called = [i for i in range(final) if _calls(actions[i])]
        steps += called[-1:]
    return steps


def _calls(action: Any) -> bool:
    return isinstance(action, dict) and isinstance(action.get("tool_calls"), list) and bool(action["tool_calls"])


def check_final_inputs(ctx: EnvContext) -> Outcome:
    """The oracle's episodes replayed on fresh envs up to their final action (and, when that is text, up to the last
    tool call before it), which is then replaced by each of :func:`final_probes` (numbers with commas or units,
    empty, huge, oddly typed arguments to the answering tool): ``step()`` and ``score()`` must not raise, the score
    must stay a finite number in [0, 1], and the answering tool must not crash (a ``ToolEnv`` tool raising anything
    but ``ToolError``). One FAIL names the function, the input and the exception; a crash another check already
    reported (the same exception at the same line) is a SKIP."""
    if not ctx.has_oracle and ctx.withheld:
        return ctx.not_run("no final answer to vary")
    if not ctx.has_oracle:
        return Outcome(SKIP, "the env has no oracle(): its final answer is unknown (check 7 fuzzes the first action)")
    driver = ctx.driver
    earlier = reported_sites(driver)
    runs = [r for r in ctx.runs["oracle"] if r.fault is None and r.actions][:PROBE_SEEDS]
    if not runs:
        return Outcome(SKIP, "no oracle episode played without an exception: no final action to vary")
    unchecked = getattr(ctx.env, "argument_validation", None) == "none"
    sent = 0
    for index, run in enumerate(runs):
        for step in answering_steps(run.actions):
            for probe in final_probes(ctx.env, run.actions[step])[: MAX_PROBES[min(index, 1)]]:
                crash = _send(driver, run, step, probe, skip_untyped_tool_crash=unchecked)
                if driver.hang is not None:
                    return Outcome(SKIP, "not finished: the env hung (see check 13, which names the call)")
                sent += 1
                if crash is None:
                    continue
                if crash.site in earlier:
                    return Outcome(
                        SKIP,
                        f"an answer crashes the env where an earlier check already found it ({crash.line})",
                        details={"site": crash.site},
                    )
                return Outcome(
                    FAIL,
                    crash.line,
                    "parse the answer defensively: accept or reject every string a model may write (commas, units, "
                    "empty, huge) with a score or a ToolError message, never an exception",
                    {"site": crash.site, "probes_sent": sent},
                )
    if not sent:
        return Outcome(SKIP, "the oracle's final action has no answer text or tool arguments to vary")
    return Outcome(
        PASS,
        f"{sent} odd final answers (commas, units, empty, huge, wrong types) on {len(runs)} seeds: no step, score or "
        "answering tool raised",
        details={"probes_sent": sent},
    )


def _send(driver: Driver, run: Run, step: int, probe: Probe, *, skip_untyped_tool_crash: bool) -> Crash | None:
    """Replay ``run`` up to its action ``step`` on a fresh env, send ``probe`` instead, and read the score: the
    crash, or ``None``."""
    which = "final action" if step == len(run.actions) - 1 else f"action {step + 1} of {len(run.actions)}"
    where = f"[seed {run.seed}, in place of the oracle's {which}]"
    replay, env = driver.replay_env(run.actions[:step], run.seed, f"final answer: {probe.label}")
    if env is None or replay.fault is not None or replay.ended:
        return None  # the replay itself broke: the replay and fuzzing checks report that
    before = len(env.messages) if isinstance(getattr(env, "messages", None), list) else None
    bad_scores = len(driver.bad_scores)
    driver.step(env, replay, copy.deepcopy(probe.action))
    if replay.fault is not None and replay.fault.where in ("step", "score"):
        fault = replay.fault
        raised = f"{fault.where}() raised {fault.error}{raised_in(fault.trace)}"
        return Crash(f"{raised} on the answer {probe.label} {where}", fault_site(fault))
    if len(driver.bad_scores) > bad_scores:
        value = driver.bad_scores[-1].split(" after ", 1)[0]
        return Crash(f"{value} after the answer {probe.label} {where}", "bad score")
    if before is None:
        return None
    for message in env.messages[before + 1 :]:
        matched = _TOOL_CRASH.match(str(message.get("content", ""))) if isinstance(message, dict) else None
        if matched and not (skip_untyped_tool_crash and not probe.typed):
            tool, error, text = matched["tool"], matched["error"], matched["message"]
            return Crash(
                f"the answering tool {tool}() raised {error}: {short(text.strip(), 120)} on {probe.label} {where} "
                "(ToolEnv sent the exception to the model as the tool's result)",
                f"{error} in {tool}",
            )
    return None
