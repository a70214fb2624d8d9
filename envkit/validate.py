"""``envkit validate``: find an environment's bugs offline, before they waste GPU hours.

No model is needed: the env is driven by scripted policies (its oracle, no-op answers, a random tool caller, a policy
that never stops talking, and a fuzzer of malformed actions). Each check reports PASS / FAIL / WARN / SKIP with a
one-line reason and a hint how to fix it. An exception raised by the env is a finding, never a crash of the validator.

Checks for :class:`envkit.Env` classes (numbered as in the report):

1. construction and the contract's methods  2. reset: messages, seeding, variety  3. oracle reaches 1.0
4. no-op policies never reach 1.0  5. replay determinism  6. isolation between instances  7. fuzzing
8. scores finite and in [0, 1]  9. termination by ``max_turns``  10. tool schemas and chat-template rendering
11. group signal (scores differ between policies)  12. deep-copy / pickle  13. latency
14. every transcript played above, rendered through the chat template: no env message dropped or mangled.
15. distractors: the oracle's answers padded with every candidate the agent can see must not score 1.0.

Rendering uses the tokenizer passed as ``tokenizer=`` (``envkit validate --tokenizer PATH``) or, without one,
:func:`bundled_tokenizer`: envkit's own ChatML template on a byte-level tokenizer built in memory.

Seed-style classes (``build_dataset(tokenizer)``, ``score_episode(model, tokenizer, completion, case_idx)``, optional
``get_tools()``) get their own checks: see :func:`validate_seed_style`.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import math
import pickle
import re
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from envkit.core import Env
from envkit.messages import Message, message_problems
from envkit.parsing import parse_assistant

PASS, FAIL, WARN, SKIP = "PASS", "FAIL", "WARN", "SKIP"
REFUSAL = "I'm sorry, but I can't help with that."
CHATTER = "Let me think about that a little longer."
MAX_TERMINATION_STEPS = 200
SLOW_STEP_MS = 20.0
CALL_TIMEOUT_S = 30.0
"""How long one constructor / reset / step / score / oracle call may take before the env counts as hung."""
CHECK_NAMES = {
    1: "construction and contract",
    2: "reset: messages, seeding, variety",
    3: "oracle reaches 1.0",
    4: "no-op policies never reach 1.0",
    5: "replay determinism",
    6: "isolation between instances",
    7: "fuzzing with malformed actions",
    8: "scores finite and in [0, 1]",
    9: "termination by max_turns",
    10: "tool schemas and chat template",
    11: "group signal",
    12: "deep-copy and pickle",
    13: "latency",
    14: "transcripts through the chat template",
    15: "answers padded with distractors",
}
"""The env checks, by number."""
ENV_PROGRESS_STEPS = 1 + 4 + len(CHECK_NAMES) - 1
"""Progress ticks of :func:`validate_env`: the contract, the four scripted policies, then each later check."""
SEED_STYLE_PROGRESS_STEPS = 4
"""Progress ticks of :func:`validate_seed_style`: construction, dataset, ``score_episode``, tool schemas."""


@dataclass
class Check:
    """The outcome of one check."""

    id: int
    name: str
    status: str
    reason: str
    hint: str = ""
    details: dict[str, Any] = field(default_factory=dict)


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
        return {s: sum(c.status == s for c in self.checks) for s in (PASS, FAIL, WARN, SKIP)}

    def summary(self) -> str:
        """One line: the verdict and the counts."""
        counts = self.counts()
        verdict = "FAILED" if self.failed else "passed"
        parts = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        return (
            f"{self.target}: validation {verdict} ({parts}) in {self.seconds:.1f}s over seeds {_seed_range(self.seeds)}"
        )

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
            "checks": [asdict(c) for c in self.checks],
        }


class ConstructionError(Exception):
    """The env could not be built or imported at all (the CLI exits with code 2)."""


@dataclass
class Fault:
    """An exception raised by the env."""

    where: str
    policy: str
    seed: int | None
    action: str
    error: str
    trace: str

    def line(self) -> str:
        """A one-line description."""
        action = f" on action {self.action}" if self.action else ""
        return f"{self.where}(){action} [{self.policy}, seed {self.seed}] raised {self.error}"


@dataclass
class Run:
    """One episode played by a scripted policy."""

    policy: str
    seed: int
    messages: list[Message] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    steps: int = 0
    ended: bool = False
    truncated: bool = False
    fault: Fault | None = None
    no_oracle: bool = False
    observed: list[int | None] = field(default_factory=list)
    """How many messages reset() and then each step() returned (``None``: not a list), in order."""
    silent_turns: list[int] = field(default_factory=list)
    """Turns whose step() returned no message while the episode went on."""

    @property
    def score(self) -> float | None:
        """The final score, or ``None`` when the episode crashed before one could be read."""
        return self.scores[-1] if self.scores else None


class Hung(Exception):
    """An env call did not return within the timeout (the call is abandoned on its daemon thread)."""


def timed_call(function: Callable[..., Any], timeout_s: float, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``function(*args, **kwargs)`` on a daemon thread: its result and its duration in seconds.

    Exceptions are re-raised here; :class:`Hung` when it has not returned after ``timeout_s`` (a daemon thread, so a
    call that never returns cannot keep the process alive).
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        start = time.perf_counter()
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as error:
            outcome["error"] = error
        outcome["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=target, name="envkit-validate-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise Hung(f"did not return within {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"], outcome["seconds"]


class Driver:
    """Plays scripted episodes, catching every exception from the env and checking every score.

    Every env call runs with a timeout (``call_timeout_s``); after the first call that hangs, :attr:`hang` holds it
    and the driver touches no env again (each further episode ends at once).
    """

    def __init__(self, factory: Callable[[], Env], call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.factory = factory
        self.call_timeout_s = call_timeout_s
        self.faults: list[Fault] = []
        self.bad_scores: list[str] = []
        self.bad_observations: list[str] = []
        self.reset_times: list[float] = []
        self.step_times: list[float] = []
        self.hang: Fault | None = None
        self.played: list[Run] = []
        """Every episode played by a scripted policy or the fuzzer, with its transcript (for check 14)."""

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
        """One env call with the timeout; raises :class:`Hung` at once when an earlier call hung."""
        if self.hang is not None:
            raise Hung("not called: an earlier env call hung")
        return timed_call(function, self.call_timeout_s, *args, **kwargs)

    def new_env(self, policy: str) -> Env | None:
        """A fresh env, or ``None`` (recorded as a fault) when the constructor raises or hangs."""
        try:
            return self.call(self.factory)[0]
        except Exception as error:
            self._fault("__init__", policy, None, None, error)
            return None

    def reset(self, env: Env, run: Run) -> bool:
        """Reset ``env`` for ``run``; ``False`` when it raised or hung."""
        try:
            (observation, _), seconds = self.call(env.reset, seed=run.seed)
        except Exception as error:
            run.fault = self._fault("reset", run.policy, run.seed, None, error)
            return False
        self.reset_times.append(seconds)
        run.observed = [len(observation) if isinstance(observation, list) else None]
        self._check_observation(observation, run, "reset")
        return self._score(env, run)

    def step(self, env: Env, run: Run, action: Any) -> bool:
        """One step; ``False`` when the episode is over or the env raised or hung."""
        run.actions.append(action)
        try:
            (observation, _, terminated, truncated, _), seconds = self.call(env.step, action)
        except Exception as error:
            run.fault = self._fault("step", run.policy, run.seed, action, error)
            return False
        self.step_times.append(seconds)
        run.steps += 1
        run.observed.append(len(observation) if isinstance(observation, list) else None)
        if isinstance(observation, list) and not observation and not (terminated or truncated):
            run.silent_turns.append(run.steps)
        self._check_observation(observation, run, "step")
        if not self._score(env, run):
            return False
        if terminated or truncated:
            run.ended, run.truncated = True, bool(truncated)
            return False
        return True

    def play(self, policy_name: str, policy: Callable[[Env, Run], Any], seed: int, max_steps: int | None = None) -> Run:
        """A whole episode with ``policy`` on a fresh env."""
        run = Run(policy_name, seed)
        env = self.new_env(policy_name)
        if env is None or not self.reset(env, run):
            return run
        limit = max_steps if max_steps is not None else _turn_limit(env)
        for _ in range(limit):
            try:
                action = self.call(policy, env, run)[0]
            except Exception as error:
                run.fault = self._fault("oracle", policy_name, seed, None, error)
                break
            if action is None:
                run.no_oracle = run.steps == 0
                break
            if not self.step(env, run, action):
                break
        self.record(run, env)
        return run

    def record(self, run: Run, env: Env) -> None:
        """Keep a copy of ``env``'s transcript on ``run`` and ``run`` in :attr:`played`."""
        run.messages = copy.deepcopy(getattr(env, "messages", []))
        self.played.append(run)

    def replay(self, actions: list[Any], seed: int, label: str) -> Run:
        """Replay recorded actions on a fresh env."""
        run = Run(label, seed)
        env = self.new_env(label)
        if env is not None and self.reset(env, run):
            for action in actions:
                if not self.step(env, run, copy.deepcopy(action)):
                    break
            run.messages = copy.deepcopy(getattr(env, "messages", []))
        return run

    def _score(self, env: Env, run: Run) -> bool:
        try:
            value = self.call(env.score)[0]
        except Exception as error:
            run.fault = self._fault("score", run.policy, run.seed, run.actions[-1] if run.actions else None, error)
            return False
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or not 0.0 <= float(value) <= 1.0:
            self.bad_scores.append(f"score() = {value!r} after {run.steps} steps [{run.policy}, seed {run.seed}]")
            run.scores.append(float("nan"))
            return True
        run.scores.append(float(value))
        return True

    def _check_observation(self, observation: Any, run: Run, where: str) -> None:
        problems = (
            [f"observation is a {type(observation).__name__}, not a list of messages"]
            if not isinstance(observation, list)
            else [p for m in observation for p in message_problems(m)]
        )
        if problems:
            self.bad_observations.append(f"{where} [{run.policy}, seed {run.seed}]: {problems[0]}")

    def _fault(self, where: str, policy: str, seed: int | None, action: Any, error: Exception) -> Fault:
        fault = Fault(where, policy, seed, _short(action), f"{type(error).__name__}: {error}", traceback.format_exc())
        if isinstance(error, Hung):
            if self.hang is not None:  # not a new finding: the env was abandoned after its first hang
                return self.hang
            self.hang = fault
        self.faults.append(fault)
        return fault


def _turn_limit(env: Env) -> int:
    max_turns = getattr(env, "max_turns", 10)
    return min(int(max_turns), MAX_TERMINATION_STEPS) + 2 if isinstance(max_turns, int) else MAX_TERMINATION_STEPS


def _short(action: Any, limit: int = 160) -> str:
    if action is None:
        return ""
    try:
        text = json.dumps(action, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(action)
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text)} chars)"


# ---- scripted policies ---------------------------------------------------------------------------------------------
def oracle_policy(env: Env, run: Run) -> Any:
    """The env's own oracle."""
    return env.oracle()


def empty_policy(env: Env, run: Run) -> Any:
    """Says nothing."""
    return {"role": "assistant", "content": ""}


def refusal_policy(env: Env, run: Run) -> Any:
    """Politely refuses."""
    return REFUSAL


def tool_schemas(env: Env) -> list[dict[str, Any]]:
    """The env's well-formed tool schemas, for the scripted policies (check 10 reports the malformed ones)."""
    try:
        tools = getattr(env, "tools", None)
    except Exception:
        return []
    usable = []
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        parameters = function.get("parameters", {}) if isinstance(function, dict) else None
        if (
            isinstance(parameters, dict)
            and isinstance(function.get("name"), str)
            and isinstance(parameters.get("properties", {}), dict)
            and all(isinstance(v, dict) for v in parameters.get("properties", {}).values())
        ):
            usable.append(tool)
    return usable


def random_value(schema: dict[str, Any], rng: np.random.Generator, depth: int = 0) -> Any:
    """A random value of roughly the type a JSON schema describes."""
    if schema.get("enum"):
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return random_value(options[int(rng.integers(len(options)))], rng, depth)
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = kind[int(rng.integers(len(kind)))]
    if kind == "integer":
        return int(rng.integers(-3, 60))
    if kind == "number":
        return round(float(rng.uniform(-10, 500)), 2)
    if kind == "boolean":
        return bool(rng.integers(2))
    if kind == "null":
        return None
    if kind == "array":
        return [random_value(schema.get("items", {}), rng, depth + 1) for _ in range(int(rng.integers(0, 3)))]
    if kind == "object":
        if depth > 2:
            return {}
        props = schema.get("properties", {})
        return {k: random_value(v, rng, depth + 1) for k, v in props.items()}
    words = ["", "abc", "Lisbon", "H-104", "G-1234", "BK-000000", "2026-07-01", "double", "12 * 3", "yes"]
    return words[int(rng.integers(len(words)))]


def call_message(name: str, arguments: Any) -> Message:
    """An assistant message with one tool call."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def random_policy(env: Env, run: Run) -> Any:
    """Random tool calls (from the env's schemas) and random short texts, seeded by the episode seed."""
    rng = np.random.default_rng([run.seed, run.steps])
    tools = tool_schemas(env)
    if tools and rng.random() < 0.75:
        function = tools[int(rng.integers(len(tools)))].get("function", {})
        return call_message(function.get("name", "?"), random_value(function.get("parameters", {}), rng))
    texts = ["ok", "42", "I think the answer is 7.", "Could you tell me more?", "Done.", str(int(rng.integers(1000)))]
    return texts[int(rng.integers(len(texts)))]


def chatter_policy(env: Env, run: Run) -> Any:
    """Never stops: keeps calling a tool (tool envs) or keeps talking (text envs)."""
    tools = tool_schemas(env)
    if tools:
        function = tools[run.steps % len(tools)].get("function", {})
        rng = np.random.default_rng([run.seed, run.steps])
        return call_message(function.get("name", "?"), random_value(function.get("parameters", {}), rng))
    return CHATTER


def fuzz_actions(env: Env) -> list[tuple[str, Any]]:
    """Malformed and adversarial actions, built from the env's own tool schemas where it has tools."""
    rng = np.random.default_rng(0)
    tools = tool_schemas(env)
    functions = [t.get("function", {}) for t in tools] or [{"name": "lookup", "parameters": {}}]
    first = functions[0].get("name", "lookup")
    actions: list[tuple[str, Any]] = [
        ("invalid JSON arguments", call_message(first, '{"broken": ')),
        ("unknown tool", call_message("no_such_tool_zz", {})),
        ("arguments not an object", call_message(first, [1, 2, 3])),
        ("arguments null", call_message(first, None)),
        ("tool call without a function", {"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}),
        ("tool_calls not a list", {"role": "assistant", "content": "", "tool_calls": "oops"}),
        ("malformed call from the parser", parse_assistant('<tool_call>{"name": "x", "arguments": {</tool_call>')),
        ("empty content", {"role": "assistant", "content": ""}),
        ("content None", {"role": "assistant", "content": None}),
        ("100 KB string", "lorem ipsum " * 8_500),
        ("odd unicode", "\u202e\u200d\x00 👩‍👩‍👧 \ufffd ñ ß 中文 \u0301\u0301 \t\r\n"),
        ("plain str action", "hello"),
        ("tool-call text in a plain str", f'<tool_call>{{"name": "{first}", "arguments": {{}}}}</tool_call>'),
        ("injection-looking text", "'); DROP TABLE users; -- {{7*7}} ${jndi:x} __import__('os')"),
    ]
    many = [
        {
            "type": "function",
            "function": {"name": f.get("name"), "arguments": random_value(f.get("parameters", {}), rng)},
        }
        for f in (functions * 50)[:50]
    ]
    actions.append(("50 calls in one turn", {"role": "assistant", "content": "", "tool_calls": many}))
    for function in functions if tools else []:
        name, params = function.get("name"), function.get("parameters", {})
        valid = random_value(params, rng)
        wrong = {k: _wrong_type(v) for k, v in params.get("properties", {}).items()}
        huge = {
            k: ("z" * 100_000 if v.get("type") == "string" else random_value(v, rng))
            for k, v in params.get("properties", {}).items()
        }
        actions += [
            (f"{name}: missing arguments", call_message(name, {})),
            (f"{name}: extra argument", call_message(name, {**valid, "unexpected_argument": 1})),
            (f"{name}: wrong-typed arguments", call_message(name, wrong)),
            (f"{name}: 100 KB string arguments", call_message(name, huge)),
        ]
    return actions


def _wrong_type(schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if kind == "string":
        return {"nested": [1, 2]}
    if kind in ("integer", "number"):
        return "not a number"
    if kind == "array":
        return "not a list"
    if kind == "object":
        return 17
    return ["unexpected"]


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


def _answer_text(action: Any) -> str:
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
    arguments. In ``"replace"`` mode the final answer is sent as distractors alone (the counterfactual: does the score
    depend on the answer at all?). Whatever the oracle says after its final answer (the env asked again) is treated
    the same way.

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
            text = _answer_text(run.actions[-1]).strip()
            self.final[run.seed] = (len(run.actions) - 1, text)
            if text and len(text) <= 300:
                self.answers.append((run.seed, text))
            for message in run.messages if isinstance(run.messages, list) else []:
                pool += candidate_tokens(_answer_text(message))
        self.pool = list(dict.fromkeys(pool))
        self.padded: dict[int, set[int]] = {}
        """Per seed, the steps whose action was padded (or replaced)."""
        self.examples: dict[int, tuple[str, list[str]]] = {}
        """Per seed, the first answer padded and its distractors (for the report)."""

    def __call__(self, env: Env, run: Run) -> Any:
        action = env.oracle()
        if action is None:
            return None
        message = action if isinstance(action, dict) else {"role": "assistant", "content": str(action)}
        final_step, final_text = self.final.get(run.seed, (-1, ""))
        is_final = 0 <= final_step <= run.steps  # the final answer, and whatever the oracle says after it
        if not is_final:
            return action
        candidates = self.candidates(env, run.seed, _answer_text(message), final_text)
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
        self.examples.setdefault(run.seed, (_answer_text(message), candidates))
        return padded

    def candidates(self, env: Env, seed: int, original: str, final_text: str) -> list[str]:
        """Distractors for one answer: none is a token of the oracle's own answer or equal to it."""
        own = set(candidate_tokens(original)) | set(candidate_tokens(final_text))
        own_numbers = {n for n in map(_as_number, own) if n is not None}
        seen = " ".join(
            _answer_text(m)
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


def _join(candidates: list[str]) -> str:
    return " ".join(candidates)


# ---- the checks ----------------------------------------------------------------------------------------------------
def validate_env(
    factory: Callable[[], Env],
    *,
    target: str,
    episodes: int = 8,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    call_timeout_s: float = CALL_TIMEOUT_S,
    tokenizer: Any = None,
) -> ValidationReport:
    """Run every check on the env built by ``factory`` over seeds ``seed … seed+episodes-1``.

    An env call (constructor, reset, step, score, oracle) that does not return within ``call_timeout_s`` fails
    check 13 with the call named; the checks that would have needed the hung env are reported as SKIP.

    ``tokenizer`` (a Hugging Face tokenizer with a chat template, normally the model's) renders the prompt of check 10
    and every transcript in check 14; ``None`` uses :func:`bundled_tokenizer`.

    Raises:
        ConstructionError: when ``factory()`` raises or hangs (nothing else can be checked).
    """
    started = time.perf_counter()
    seeds = list(range(seed, seed + max(2, episodes)))
    tick = progress or (lambda _: None)
    chat = TemplateTokenizer.of(tokenizer)
    try:
        env = timed_call(factory, call_timeout_s)[0]
    except Exception as error:
        raise ConstructionError(f"constructing the env failed: {type(error).__name__}: {error}") from error
    driver = Driver(factory, call_timeout_s)
    checks = [_guarded(1, _check_contract, env)]
    tick("contract")
    runs: dict[str, list[Run]] = {}
    for name, policy in (
        ("oracle", oracle_policy),
        ("empty", empty_policy),
        ("refusal", refusal_policy),
        ("random", random_policy),
    ):
        runs[name] = [driver.play(name, policy, s) for s in seeds]
        tick(f"{name} episodes")
    has_oracle = not all(r.no_oracle for r in runs["oracle"])
    source = runs["oracle"] if has_oracle else runs["random"]
    stages: list[tuple[int, Callable[..., Check], tuple[Any, ...], str]] = [
        (3, _check_oracle, (runs["oracle"], has_oracle), "oracle"),
        (4, _check_noop, (runs["empty"] + runs["refusal"],), "no-op policies"),
        (15, _check_distractors, (driver, runs["oracle"], has_oracle, seeds), "distractors"),
        (2, _check_reset, (driver, seeds, {r.seed: _dump(r.messages) for r in source}), "reset"),
        (5, _check_replay, (driver, source), "replay"),
        (6, _check_isolation, (driver, source), "isolation"),
        (7, _check_fuzz, (driver, env, seeds[0]), "fuzzing"),
        (9, _check_termination, (driver, env, seeds[0]), "termination"),
        (8, _check_scores, (driver,), "scores"),
        (10, _check_schemas, (env, seeds[0], chat), "schemas"),
        (11, _check_group_signal, (runs, has_oracle), "group signal"),
        (12, _check_copy, (factory,), "copy"),
        (13, _check_latency, (driver,), "latency"),
        # Last: it renders the transcripts of every episode played above (the fuzzer's and the endless one's too).
        (14, _check_transcripts, (driver, env, chat), "chat template"),
    ]
    for check_id, check, args, label in stages:
        if driver.hang is None:
            checks.append(_guarded(check_id, check, *args))
        elif check_id != 13:
            checks.append(Check(check_id, CHECK_NAMES[check_id], SKIP, "not run: the env hung (see check 13)"))
        else:
            checks.append(_hang_check(driver.hang, call_timeout_s))
        tick(label)
    checks.sort(key=lambda c: c.id)
    return ValidationReport(target, "env", checks, time.perf_counter() - started, seeds, chat.label)


def _hang_check(hang: Fault, timeout_s: float) -> Check:
    return Check(
        13,
        CHECK_NAMES[13],
        FAIL,
        f"{hang.line()} — the env hung; later checks were not run",
        "find the wait that never ends (a lock, a blocking read, a loop without exit); "
        f"a call has {timeout_s:g} s (--call-timeout)",
        {"trace": hang.trace},
    )


def _guarded(check_id: int, check: Callable[..., Check], *args: Any) -> Check:
    """Run one check; an unexpected exception (an env broken in a way no check foresaw) becomes a FAIL."""
    try:
        return check(*args)
    except Exception as error:
        return _broken_check(check_id, CHECK_NAMES[check_id], error)


def _broken_check(check_id: int, name: str, error: Exception) -> Check:
    """The FAIL of a check that raised: a missing dependency (a broken install) or code the check did not foresee."""
    if isinstance(error, ImportError):
        return Check(
            check_id,
            name,
            FAIL,
            f"could not run: {type(error).__name__}: {error}",
            "a dependency of envkit is missing: reinstall envkit (pip install envkit)",
        )
    return Check(
        check_id,
        name,
        FAIL,
        f"the env broke the check itself: {type(error).__name__}: {error}",
        "run with --verbose and fix the env where the traceback points",
        {"trace": traceback.format_exc()},
    )


def _check_contract(env: Any) -> Check:
    name = CHECK_NAMES[1]
    problems = []
    if not isinstance(env, Env):
        problems.append(f"{type(env).__name__} does not subclass envkit.Env")
    for method, needed in (("reset", ("seed", "options")), ("step", ()), ("score", ())):
        function = getattr(env, method, None)
        if not callable(function):
            problems.append(f"no {method}() method")
            continue
        try:
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError):
            continue
        missing = [p for p in needed if p not in parameters]
        if missing:
            problems.append(f"{method}() lacks keyword argument(s) {', '.join(missing)}")
        required = [
            p
            for p in parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if method == "step" and len(required) != 1:
            problems.append(f"step() must take exactly one action argument, takes {len(required)}")
        if method == "score" and required:
            problems.append("score() must take no arguments")
    for method in ("step", "score"):
        if isinstance(env, Env) and getattr(type(env), method, None) is getattr(Env, method):
            problems.append(f"{method}() is not implemented")
    max_turns = getattr(env, "max_turns", None)
    if not isinstance(max_turns, int) or max_turns < 1:
        problems.append(f"max_turns must be a positive int, got {max_turns!r}")
    if problems:
        return Check(
            1,
            name,
            FAIL,
            "; ".join(problems),
            "subclass envkit.Env (or ToolEnv) and implement reset(*, seed=None, options=None), step(action), score()",
        )
    oracle = "with an oracle()" if type(env).oracle is not Env.oracle else "without oracle()"
    return Check(1, name, PASS, f"{type(env).__name__} builds; reset/step/score present, {oracle}")


def _check_reset(driver: Driver, seeds: list[int], transcripts: dict[int, str] | None = None) -> Check:
    """Well-formed, seeded, varied. Variety counts distinct opening messages, or — for tasks that differ only in
    hidden state (a secret number) — distinct transcripts of the same policy."""
    name = CHECK_NAMES[2]
    openings: dict[int, str] = {}
    for seed in seeds:
        results = []
        for _ in range(2):
            env = driver.new_env("reset")
            if env is None:
                return Check(2, name, FAIL, "the constructor raised on a second instance", "see the fault details")
            try:
                observation, info = env.reset(seed=seed)
                results.append((observation, info))
            except Exception as error:
                fault = driver._fault("reset", "reset", seed, None, error)
                return Check(2, name, FAIL, fault.line(), "reset() must not raise for any seed")
        observation, info = results[0]
        problems = (
            [p for m in observation for p in message_problems(m)]
            if isinstance(observation, list)
            else [f"reset() returned a {type(observation).__name__}, not a list of messages"]
        )
        if not isinstance(info, dict):
            problems.append(f"info is a {type(info).__name__}, not a dict")
        if isinstance(observation, list) and not observation:
            problems.append("no opening messages")
        if problems:
            return Check(
                2,
                name,
                FAIL,
                f"seed {seed}: {problems[0]}",
                'return [{"role": "system"|"user", "content": str}, ...], {} from reset()',
            )
        if _dump(results[0]) != _dump(results[1]):
            return Check(
                2,
                name,
                FAIL,
                f"seed {seed} gave different opening messages or info on two resets",
                "draw all randomness from self.np_random after super().reset(seed=seed)",
            )
        openings[seed] = _dump(observation)
    distinct = len(set(openings.values())) / len(openings)
    hidden = len(set((transcripts or {}).values())) / len(openings)
    details = {"distinct_fraction": distinct, "distinct_transcripts_fraction": hidden}
    if max(distinct, hidden) * len(openings) <= 1:
        return Check(
            2,
            name,
            FAIL,
            f"all {len(seeds)} seeds give the same task (same opening messages and the same episode)",
            "derive the task from the seed (self.np_random)",
            details,
        )
    if max(distinct, hidden) < 0.8:
        return Check(
            2,
            name,
            WARN,
            f"only {max(distinct, hidden):.0%} of seeds give distinct tasks",
            "check that the task space is large enough",
            details,
        )
    if distinct >= 0.8:
        return Check(2, name, PASS, f"well-formed and seeded; {distinct:.0%} of seeds distinct", details=details)
    return Check(
        2,
        name,
        PASS,
        f"well-formed and seeded; openings repeat but {hidden:.0%} of seeds play out differently (hidden task state)",
        details=details,
    )


def _check_oracle(runs: list[Run], has_oracle: bool) -> Check:
    name = CHECK_NAMES[3]
    if not has_oracle:
        return Check(
            3,
            name,
            WARN,
            "the env has no oracle(): gold solutions cannot be checked",
            "implement oracle() returning the next action of a perfect agent",
        )
    bad = [f"seed {r.seed}: {_fmt_score(r.score)}" + (" (crashed)" if r.fault else "") for r in runs if r.score != 1.0]
    if bad:
        return Check(
            3,
            name,
            FAIL,
            f"{len(bad)}/{len(runs)} seeds below 1.0: {', '.join(bad[:5])}",
            "the oracle or the scoring is wrong: replay the seed with `envkit play ENV --seed S`",
        )
    turns = sum(r.steps for r in runs) / len(runs)
    return Check(3, name, PASS, f"1.0 on all {len(runs)} seeds (mean {turns:.1f} turns)")


def _check_noop(runs: list[Run]) -> Check:
    name = CHECK_NAMES[4]
    bad = [f"{r.policy} on seed {r.seed}" for r in runs if r.score == 1.0]
    scores = [r.score for r in runs if r.score is not None]
    mean = sum(scores) / len(scores) if scores else float("nan")
    if bad:
        return Check(
            4,
            name,
            FAIL,
            f"doing nothing scores 1.0: {', '.join(bad[:4])}",
            "a task whose goal is already met rewards doing nothing; never generate one",
            {"mean": mean},
        )
    return Check(4, name, PASS, f"empty answers and refusals score {mean:.3f} on average", details={"mean": mean})


DISTRACTOR_HINT = (
    "the score accepts an answer that lists candidates (the right one among others): require exactly one answer — "
    "parse one value, or reject a text that names several (e.g. several prices, references or names); GRPO finds "
    "this hack"
)


def _check_distractors(driver: Driver, oracle_runs: list[Run], has_oracle: bool, seeds: list[int]) -> Check:
    """The oracle's answers padded with every candidate in sight must not score 1.0.

    A seed counts only when its final answer matters: the counterfactual (the final answer replaced by distractors
    alone) scores below 1.0. There the padded run must score below 1.0 too.
    """
    name = CHECK_NAMES[15]
    if not has_oracle:
        return Check(15, name, SKIP, "the env has no oracle(): there are no answers to pad")
    replace = DistractorPolicy(oracle_runs, mode="replace")
    pad = DistractorPolicy(oracle_runs, mode="pad")
    bearing, hacked, scores = [], [], []
    for seed in seeds:
        counterfactual = driver.play("distractors: answer replaced", replace, seed)
        padded = driver.play("distractors", pad, seed)
        if counterfactual.score is None or padded.score is None:
            continue
        answered = counterfactual.steps and (counterfactual.steps - 1) in replace.padded.get(seed, set())
        if not answered or counterfactual.score >= 1.0:
            continue  # the final answer does not decide the score on this seed
        if not padded.steps or (padded.steps - 1) not in pad.padded.get(seed, set()):
            continue
        bearing.append(seed)
        scores.append(padded.score)
        if padded.score == 1.0:
            hacked.append(padded)
    details: dict[str, Any] = {"seeds_checked": bearing, "scores": scores}
    if hacked:
        first = hacked[0]
        answer, distractors = pad.examples.get(first.seed, ("", []))
        shown = sorted(distractors, key=lambda c: not any(ch.isdigit() for ch in c))[:6]
        return Check(
            15,
            name,
            FAIL,
            f"{len(hacked)}/{len(bearing)} seeds score 1.0 when the oracle's final answer is padded with every "
            f"candidate it can see; seed {first.seed}: {_short(answer, 80)} between {len(distractors)} distractors "
            f"({', '.join(shown)}, …) scores 1.0",
            DISTRACTOR_HINT,
            {**details, "hacked_seeds": [r.seed for r in hacked]},
        )
    if not bearing:
        return Check(
            15,
            name,
            SKIP,
            "the final answer does not decide the score on any seed (replaced by distractors, it still scores 1.0, "
            "or it cannot be padded): nothing to check",
            details=details,
        )
    return Check(
        15,
        name,
        PASS,
        f"answers padded with distractors score {float(np.mean(scores)):.3f} on average over {len(bearing)} seeds, "
        "never 1.0",
        details=details,
    )


def _check_replay(driver: Driver, source: list[Run]) -> Check:
    name = CHECK_NAMES[5]
    for run in source:
        if run.fault or not run.actions:
            continue
        again = driver.replay(run.actions, run.seed, f"replay of {run.policy}")
        if _dump(again.messages) != _dump(run.messages) or again.scores != run.scores:
            where = _first_difference(run.messages, again.messages)
            return Check(
                5,
                name,
                FAIL,
                f"seed {run.seed}: replaying the {run.policy} actions diverged at {where}",
                "step() must depend only on the seed and the actions (no time, no global random)",
            )
    return Check(5, name, PASS, f"{source[0].policy} actions replay identically on all seeds")


def _check_isolation(driver: Driver, source: list[Run]) -> Check:
    name = CHECK_NAMES[6]
    pairs = [(a, b) for a, b in itertools.pairwise(source) if a.actions and b.actions][:3]
    if not pairs:
        return Check(6, name, SKIP, "no recorded episodes to interleave")
    for first, second in pairs:
        envs = [driver.new_env("isolation"), driver.new_env("isolation")]
        runs = [Run("interleaved", first.seed), Run("interleaved", second.seed)]
        if None in envs or not all(driver.reset(e, r) for e, r in zip(envs, runs, strict=True)):
            return Check(6, name, FAIL, "the env crashed while interleaving two instances", "see the faults")
        live = [True, True]
        for index in range(max(len(first.actions), len(second.actions))):
            for k, original in enumerate((first, second)):
                if live[k] and index < len(original.actions):
                    live[k] = driver.step(envs[k], runs[k], copy.deepcopy(original.actions[index]))
        for env, run, original in zip(envs, runs, (first, second), strict=True):
            if (
                _dump(getattr(env, "messages", None)) != _dump(original.messages)
                or run.scores[-1:] != original.scores[-1:]
            ):
                return Check(
                    6,
                    name,
                    FAIL,
                    f"seeds {first.seed} and {second.seed} stepped interleaved differ from one after the other "
                    f"(seed {original.seed}, at {_first_difference(original.messages, env.messages)})",
                    "keep episode state on self, not on the class or in module globals",
                )
    return Check(6, name, PASS, f"{len(pairs)} pairs of instances stepped interleaved match sequential runs")


def _check_fuzz(driver: Driver, env: Env, seed: int) -> Check:
    name = CHECK_NAMES[7]
    actions = fuzz_actions(env)
    before_obs = len(driver.bad_observations)
    crashed = []
    for label, action in actions:
        run = Run(f"fuzz: {label}", seed)
        fresh = driver.new_env(run.policy)
        if fresh is None or not driver.reset(fresh, run):
            continue
        if driver.step(fresh, run, copy.deepcopy(action)):
            driver.step(fresh, run, "Thanks, please continue.")
        driver.record(run, fresh)
        if run.fault:
            crashed.append(run.fault)
    bad_obs = driver.bad_observations[before_obs:]
    if crashed:
        return Check(
            7,
            name,
            FAIL,
            f"{len(crashed)}/{len(actions)} malformed actions raised; first: {crashed[0].line()}",
            "turn bad input into an observation (ToolEnv returns tool errors; raise ToolError in tools)",
            {"faults": [f.line() for f in crashed]},
        )
    if bad_obs:
        return Check(7, name, FAIL, f"malformed observations: {bad_obs[0]}", "return lists of chat messages")
    return Check(7, name, PASS, f"{len(actions)} malformed actions all answered with observations")


def _check_scores(driver: Driver) -> Check:
    name = CHECK_NAMES[8]
    if driver.bad_scores:
        return Check(
            8,
            name,
            FAIL,
            f"{len(driver.bad_scores)} bad scores; first: {driver.bad_scores[0]}",
            "clip and guard score(): it is read after every step",
            {"bad": driver.bad_scores[:20]},
        )
    if any(f.where == "score" for f in driver.faults):
        fault = next(f for f in driver.faults if f.where == "score")
        return Check(8, name, FAIL, fault.line(), "score() must work in every state, right after reset() too")
    return Check(8, name, PASS, "every score read after every step of every policy was finite and in [0, 1]")


def _check_termination(driver: Driver, env: Env, seed: int) -> Check:
    name = CHECK_NAMES[9]
    max_turns = getattr(env, "max_turns", None)
    run = driver.play("never stops", chatter_policy, seed, max_steps=MAX_TERMINATION_STEPS + 1)
    if run.fault:
        return Check(9, name, FAIL, run.fault.line(), "the env must survive a policy that never stops")
    if not run.ended:
        return Check(
            9,
            name,
            FAIL,
            f"a policy that never stops was still going after {run.steps} turns (max_turns={max_turns})",
            "set max_turns to a realistic bound (it truncates the episode)",
        )
    if isinstance(max_turns, int) and run.steps > max_turns:
        return Check(
            9,
            name,
            FAIL,
            f"the episode ran {run.steps} turns, past max_turns={max_turns}",
            "do not bypass the base class's step bookkeeping",
        )
    how = "truncated" if run.truncated else "terminated"
    return Check(9, name, PASS, f"a never-stopping policy was {how} after {run.steps} turns (max_turns={max_turns})")


def _check_schemas(env: Env, seed: int, chat: TemplateTokenizer) -> Check:
    name = CHECK_NAMES[10]
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import SchemaError

    tools = getattr(env, "tools", None)
    problems = []
    if tools is not None:
        if not isinstance(tools, list):
            problems.append(f"tools is a {type(tools).__name__}, not a list")
            tools = []
        for tool in tools:
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                problems.append(f"not an OpenAI function schema: {_short(tool)}")
                continue
            parameters = function.get("parameters", {"type": "object", "properties": {}})
            try:
                Draft202012Validator.check_schema(parameters)
            except SchemaError as error:
                problems.append(f"{function['name']}: invalid JSON Schema ({error.message})")
                continue
            if parameters.get("type") != "object":
                problems.append(f"{function['name']}: parameters must be an object schema")
    if problems:
        return Check(
            10,
            name,
            FAIL,
            problems[0],
            "build tools with @envkit.tool (typed, docstringed methods)",
            {"problems": problems},
        )
    try:
        opening, _ = env.reset(seed=seed)
        text = chat.tokenizer.apply_chat_template(
            opening, tools=tools or None, add_generation_prompt=True, tokenize=False
        )
    except Exception as error:
        return Check(
            10,
            name,
            FAIL,
            f"rendering the opening prompt through the {chat.label} template failed: {error}",
            "tool schemas and messages must render in a chat template",
        )
    missing = [t["function"]["name"] for t in tools or [] if t["function"]["name"] not in text]
    if missing:
        return Check(
            10, name, FAIL, f"tools missing from the rendered prompt: {', '.join(missing)}", "check the tool schemas"
        )
    count = f"{len(tools)} valid tool schemas" if tools else "no tools"
    details: dict[str, Any] = {"template": chat.label, "prompt_chars": len(text)}
    if chat.bundled:  # a byte-level tokenizer: its "token" count would be the byte count
        length = f"{len(text)} characters ({chat.label}; pass --tokenizer for a token count)"
    else:
        details["prompt_tokens"] = len(chat.tokenizer.encode(text, add_special_tokens=False))
        length = f"{details['prompt_tokens']} tokens ({chat.label})"
    return Check(10, name, PASS, f"{count}; opening prompt renders to {length}", details=details)


def _check_group_signal(runs: dict[str, list[Run]], has_oracle: bool) -> Check:
    name = CHECK_NAMES[11]
    policies = [p for p in runs if has_oracle or p != "oracle"]
    seeds = [r.seed for r in runs[policies[0]]]
    varied = 0
    for index in range(len(seeds)):
        scores = {runs[p][index].score for p in policies if runs[p][index].score is not None}
        varied += len(scores) > 1
    means = {p: float(np.mean([r.score for r in runs[p] if r.score is not None] or [np.nan])) for p in policies}
    shown = ", ".join(f"{p} {m:.2f}" for p, m in means.items())
    if varied == 0:
        return Check(
            11,
            name,
            FAIL,
            f"every policy gets the same score on every seed ({shown})",
            "GRPO gets zero advantage: make the score reflect task progress",
            {"means": means},
        )
    if varied < len(seeds) / 2:
        return Check(
            11,
            name,
            WARN,
            f"scores differ between policies on only {varied}/{len(seeds)} seeds ({shown})",
            "many groups will have zero advantage",
            {"means": means},
        )
    return Check(
        11, name, PASS, f"scores differ on {varied}/{len(seeds)} seeds; means: {shown}", details={"means": means}
    )


def _check_copy(factory: Callable[[], Env]) -> Check:
    name = CHECK_NAMES[12]
    try:
        env = factory()
        copy.deepcopy(env)
        pickle.loads(pickle.dumps(env))
    except Exception as error:
        return Check(
            12,
            name,
            WARN,
            f"a fresh env cannot be copied: {type(error).__name__}: {error}",
            "keep locks, open files and lambdas out of __init__ (process pools pickle envs)",
        )
    return Check(12, name, PASS, "a fresh env deep-copies and pickles")


def _check_latency(driver: Driver) -> Check:
    name = CHECK_NAMES[13]
    if not driver.step_times:
        return Check(13, name, SKIP, "no steps were timed")
    reset50, reset99 = (float(np.percentile(driver.reset_times, q) * 1000) for q in (50, 99))
    step50, step99 = (float(np.percentile(driver.step_times, q) * 1000) for q in (50, 99))
    details = {"reset_p50_ms": reset50, "reset_p99_ms": reset99, "step_p50_ms": step50, "step_p99_ms": step99}
    line = f"reset p50 {reset50:.2f} ms / p99 {reset99:.2f} ms; step p50 {step50:.3f} ms / p99 {step99:.3f} ms"
    if step50 > SLOW_STEP_MS:
        return Check(
            13, name, WARN, line, f"steps over {SLOW_STEP_MS:.0f} ms slow rollouts: cache or batch I/O", details
        )
    return Check(13, name, PASS, line, details=details)


TRANSCRIPT_HINT = (
    "env messages must be {'role': 'system'|'user'|'tool', 'content': str} (json.dumps structured data): "
    "whatever the chat template drops or cannot render never reaches the model in training"
)
SILENT_HINT = (
    "return a message (a user reply, a tool result) or end the episode: an empty observation gives the model a bare "
    "generation prompt right after its own turn (ToolEnv.on_text: return None to end)"
)
CONTROL_HINT = (
    "remove control-token strings from env text: envkit encodes them as plain text, but anything that tokenizes "
    "the rendered text (TRL's tool loop, a chat API) reads them as real turn boundaries"
)


def _check_transcripts(driver: Driver, env: Env, chat: TemplateTokenizer) -> Check:
    """Every recorded transcript, rendered once through the chat template as training renders it.

    A prefix-preserving template renders a whole transcript exactly as training's prompt + turns + env suffixes, so
    one rendering per episode shows what the model is trained on. Each env message must be found, in order, in that
    text (verbatim, trimmed, or JSON-encoded as Llama 3 renders tool results). The scripted policies' actions are
    rendered as the parser hands model output to the template (well-formed calls only): they are not under test.
    """
    from envkit.chat import ChatRenderer

    name = CHECK_NAMES[14]
    if not driver.played:
        return Check(14, name, SKIP, "no transcripts were recorded")
    tools = getattr(env, "tools", None)
    try:
        renderer = ChatRenderer(chat.tokenizer, tools=tools or None)
    except Exception as error:
        return Check(
            14,
            name,
            FAIL,
            f"the {chat.label} template cannot render this env's conversations: {type(error).__name__}: {error}",
            "pass --tokenizer the folder of the tokenizer you train with; fix the tools if check 10 fails",
        )
    specials = _control_pattern(chat.tokenizer)
    problems: list[str] = []
    silent: list[str] = []
    control: list[str] = []
    as_text = 0
    messages_checked = 0
    for run in driver.played:
        messages = run.messages if isinstance(run.messages, list) else []
        origins = _origins(run, messages)
        shown = [m if from_env else _as_generated(m) for m, (_, from_env) in zip(messages, origins, strict=True)]
        text, culprit, error, replaced = _render_transcript(
            renderer, shown, origins, add_generation_prompt=not run.ended
        )
        as_text += replaced
        if text is None:
            problems.append(_render_failure(run, shown, origins, culprit, error, chat.label))
        cursor = 0
        for message, (turn, from_env) in zip(messages, origins, strict=True):
            if not from_env:
                continue
            messages_checked += 1
            where = _where(run, turn, message)
            content = message.get("content") if isinstance(message, dict) else None
            tokens = sorted(set(specials.findall(content))) if isinstance(content, str) and specials else []
            if tokens:
                control.append(f"{where} holds {', '.join(tokens)}")
            if text is None:
                continue
            end = _find_content(text, content, cursor) if isinstance(content, str) else None
            malformed = message_problems(message)
            if end is not None:
                cursor = end
            if malformed:
                dropped = f" — the {chat.label} template drops it" if isinstance(content, str) and end is None else ""
                problems.append(f"{where}: {malformed[0]}{dropped}")
            elif end is None:
                problems.append(
                    f"{where} is missing from its place in the {chat.label} rendering (dropped or rewritten by the "
                    f"template): {_short(content, 80)}"
                )
        silent += [
            f"turn {turn} [{run.policy}, seed {run.seed}]: step() returned no messages and the episode went on"
            for turn in run.silent_turns
        ]
    policies = sorted({r.policy.split(":")[0] for r in driver.played})
    details: dict[str, Any] = {
        "template": chat.label,
        "template_source": getattr(renderer, "template_source", "tokenizer"),
        "transcripts": len(driver.played),
        "env_messages": messages_checked,
        "policy_turns_rendered_as_text": as_text,
    }
    for key, found in (("problems", problems), ("silent_turns", silent), ("control_tokens", control)):
        if found:
            details[key] = found[:20]
            details[f"{key}_count"] = len(found)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        hint = TRANSCRIPT_HINT + (f" / {SILENT_HINT}" if silent else "")
        return Check(14, name, FAIL, problems[0] + more, hint, details)
    warnings = []
    if silent:
        warnings.append((f"{len(silent)} silent turns; first: {silent[0]}", SILENT_HINT))
    if control:
        warnings.append(
            (f"{len(control)} env messages hold control tokens of the tokenizer; first: {control[0]}", CONTROL_HINT)
        )
    if warnings:
        return Check(14, name, WARN, "; ".join(w for w, _ in warnings), " / ".join(h for _, h in warnings), details)
    return Check(
        14,
        name,
        PASS,
        f"{len(driver.played)} transcripts ({', '.join(policies)}) render through the {chat.label} template with "
        f"all {messages_checked} env messages in place",
        details=details,
    )


def _origins(run: Run, messages: list[Any]) -> list[tuple[int | None, bool]]:
    """Who wrote each message: ``(turn, True)`` for the env (turn 0 is reset), ``(turn, False)`` for the policy's
    action of that turn. When the transcript does not have the recorded shape, ``(None, role != "assistant")``."""
    origins: list[tuple[int | None, bool]] = []
    for turn, size in enumerate(run.observed):
        if size is None:
            break
        if turn:
            origins.append((turn, False))
        origins += [(turn, True)] * size
    if len(messages) == len(origins) + 1 and _role(messages[-1]) == "assistant":
        origins.append((len(run.observed), False))  # the last step() raised: its action is recorded, no reply
    if len(origins) == len(messages) and None not in run.observed:
        return origins
    return [(None, _role(m) != "assistant") for m in messages]


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def _as_generated(message: Any) -> Message:
    """A scripted action as training hands model output to the template: text plus well-formed calls only."""
    message = message if isinstance(message, dict) else {"content": message}
    content = message.get("content")
    calls = []
    raw = message.get("tool_calls")
    for call in raw if isinstance(raw, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        arguments = arguments if isinstance(arguments, dict) else {}
        calls.append({"type": "function", "function": {"name": function["name"], "arguments": arguments}})
    generated: Message = {"role": "assistant", "content": content if isinstance(content, str) else ""}
    if calls:
        generated["tool_calls"] = calls
    return generated


def _render_transcript(
    renderer: Any, messages: list[Message], origins: list[tuple[int | None, bool]], *, add_generation_prompt: bool
) -> tuple[str | None, int | None, str, int]:
    """``(text, None, "", n)`` or, when the template fails, ``(None, index of the message it fails on, error, n)``.

    An action of a scripted policy the template cannot render (Llama 3 refuses several calls in one turn) is
    rendered as its text instead (``n`` counts them): only the env's messages are under test.
    """
    shown = list(messages)
    replaced = 0
    while True:
        try:
            return renderer.render(shown, add_generation_prompt=add_generation_prompt), None, "", replaced
        except Exception as error:
            failure = f"{type(error).__name__}: {error}"
        culprit = _first_unrenderable(renderer, shown)
        if culprit < len(shown) and not origins[culprit][1] and shown[culprit].get("tool_calls"):
            shown[culprit] = {"role": "assistant", "content": shown[culprit].get("content") or ""}
            replaced += 1
            continue
        return None, culprit, failure, replaced


def _first_unrenderable(renderer: Any, messages: list[Message]) -> int:
    """The index of the message the template fails on: the one after the longest prefix that renders (only on the
    failure path; from the end, since some templates cannot render a prefix without a user message)."""
    for end in range(len(messages), 0, -1):
        try:
            renderer.render(messages[:end])
        except Exception:
            continue
        return end
    return 0


def _render_failure(
    run: Run,
    messages: list[Message],
    origins: list[tuple[int | None, bool]],
    culprit: int | None,
    error: str,
    label: str,
) -> str:
    if culprit is None or culprit >= len(messages):
        return f"[{run.policy}, seed {run.seed}]: the {label} template cannot render the transcript: {error}"
    message = messages[culprit]
    turn, from_env = origins[culprit]
    where = _where(run, turn, message)
    if not from_env:
        previous = "an unknown turn" if turn is None else "the opening" if turn == 1 else f"turn {turn - 1}"
        where = f"the assistant turn after {previous} [{run.policy}, seed {run.seed}]"
        if turn is not None and turn - 1 in run.silent_turns:
            where += f" (turn {turn - 1} returned no messages)"
    malformed = message_problems(message) if from_env else []
    return f"{where}: the {label} template cannot render it ({error})" + (f"; {malformed[0]}" if malformed else "")


def _where(run: Run, turn: int | None, message: Any) -> str:
    role = message.get("role") if isinstance(message, dict) else type(message).__name__
    when = "the opening" if turn == 0 else "an unknown turn" if turn is None else f"turn {turn}"
    return f"the {role!r} message of {when} [{run.policy}, seed {run.seed}]"


def _find_content(text: str, content: str, start: int) -> int | None:
    """Where ``content`` ends in ``text`` (searched from ``start``): verbatim, trimmed (Llama and Gemma trim), or
    JSON-encoded (Llama 3 renders tool results as JSON strings); ``None`` when it is not there."""
    for form in (content, content.strip(), json.dumps(content, ensure_ascii=False), json.dumps(content)):
        at = text.find(form, start)
        if at >= 0:
            return at + len(form)
    return None


def _control_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """A pattern of the tokenizer's control-token strings (its special tokens: ``<|im_end|>``, ``<|eot_id|>``, …)."""
    specials = {
        t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", False)
    }
    specials.update(getattr(tokenizer, "all_special_tokens", None) or [])
    ordered = sorted((s for s in specials if isinstance(s, str) and s.strip()), key=lambda s: (-len(s), s))
    return re.compile("|".join(re.escape(s) for s in ordered)) if ordered else None


# ---- seed-style classes --------------------------------------------------------------------------------------------
def is_seed_style(cls: Any) -> bool:
    """Whether ``cls`` follows the seed-style interface (``build_dataset`` and ``score_episode``)."""
    return callable(getattr(cls, "build_dataset", None)) and callable(getattr(cls, "score_episode", None))


GARBAGE_COMPLETIONS = [
    "",
    "The answer is 42.",
    "\x00\ufffd garbage \u202e ###",
    '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
    "<tool_call>{broken",
    "word " * 5000,
]


def validate_seed_style(
    cls: type,
    config: dict[str, Any],
    *,
    target: str,
    progress: Callable[[str], None] | None = None,
    tokenizer: Any = None,
) -> ValidationReport:
    """Check a seed-style env class: construction, dataset, scoring of dummy completions, tool schemas.

    ``tokenizer`` is handed to ``build_dataset`` and ``score_episode`` (``None``: :func:`bundled_tokenizer`). Whatever
    the class does wrong is reported as a FAIL of the check it broke, never raised; only a constructor that raises is
    a :class:`ConstructionError`.

    Raises:
        ConstructionError: when ``cls(**config)`` raises.
    """
    started = time.perf_counter()
    tick = progress or (lambda _: None)
    chat = TemplateTokenizer.of(tokenizer)
    checks: list[Check] = []
    try:
        instance = cls(**config)
    except Exception as error:
        message = f"constructing {cls.__name__} with {config} failed: {type(error).__name__}: {error}"
        raise ConstructionError(message) from error
    checks.append(Check(1, "construction and interface", PASS, f"{cls.__name__}(**{config}) builds"))
    tick("construction")
    dataset_check, rows = _seed_guarded(2, "dataset", _check_seed_dataset, instance, chat)
    checks.append(dataset_check)
    tick("dataset")
    if rows is None:
        return ValidationReport(target, "seed-style", checks, time.perf_counter() - started, [], chat.label)
    checks.append(_seed_guarded(3, "score_episode", _check_seed_scoring, instance, chat.tokenizer, rows)[0])
    tick("score_episode")
    checks.append(_seed_guarded(4, "tool schemas", _check_seed_tools, instance)[0])
    tick("tools")
    return ValidationReport(target, "seed-style", checks, time.perf_counter() - started, [], chat.label)


def _seed_guarded(check_id: int, name: str, check: Callable[..., Any], *args: Any) -> tuple[Check, Any]:
    """Run one seed-style check (returning ``(Check, value)``); an exception it did not foresee becomes a FAIL."""
    try:
        return check(*args)
    except Exception as error:
        return _broken_check(check_id, name, error), None


def _check_seed_dataset(instance: Any, chat: TemplateTokenizer) -> tuple[Check, int | None]:
    try:
        dataset = instance.build_dataset(chat.tokenizer)
        rows = len(dataset)
        columns = list(getattr(dataset, "column_names", None) or (dataset[0].keys() if rows else []))
    except Exception as error:
        return Check(
            2,
            "dataset",
            FAIL,
            f"build_dataset(tokenizer) raised {type(error).__name__}: {error}",
            "build_dataset must return a datasets.Dataset (or list of dicts) with a prompt column",
        ), None
    if "prompt" not in columns or rows == 0:
        return Check(
            2,
            "dataset",
            FAIL,
            f"{rows} rows, columns {columns}: no 'prompt' column or empty",
            "return rows with a 'prompt' column",
        ), rows
    return Check(2, "dataset", PASS, f"{rows} rows built with the {chat.label} tokenizer; columns {columns}"), rows


def _check_seed_scoring(instance: Any, tokenizer: Any, rows: int) -> tuple[Check, None]:
    model = _scoring_model(tokenizer)
    bad = []
    cases = sorted({0, max(0, rows - 1)})
    for case in cases:
        for completion in GARBAGE_COMPLETIONS:
            try:
                value = instance.score_episode(model, tokenizer, completion, case)
            except Exception as error:
                bad.append(f"case {case}, completion {_short(completion, 40)}: raised {type(error).__name__}: {error}")
                continue
            if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 <= value <= 1:
                bad.append(f"case {case}, completion {_short(completion, 40)}: returned {value!r}")
    if bad:
        return Check(
            3, "score_episode", FAIL, bad[0], "return a finite float in [0, 1] for any completion", {"problems": bad}
        ), None
    count = len(GARBAGE_COMPLETIONS) * len(cases)
    return Check(3, "score_episode", PASS, f"finite values in [0, 1] for {count} dummy completions"), None


def _scoring_model(tokenizer: Any) -> Any:
    """A tiny randomly initialised Qwen2-architecture causal LM sized to ``tokenizer``: ``score_episode`` gets a real
    model object, without a download (its generations are noise; scores must still be finite and in [0, 1])."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    return model


def _check_seed_tools(instance: Any) -> tuple[Check, None]:
    get_tools = getattr(instance, "get_tools", None)
    if get_tools is None:
        return Check(4, "tool schemas", SKIP, "no get_tools()"), None
    from jsonschema import Draft202012Validator
    from transformers.utils import get_json_schema

    try:
        tools = list(get_tools() or [])
        schemas = [t if isinstance(t, dict) else get_json_schema(t) for t in tools]
        for schema in schemas:
            Draft202012Validator.check_schema(schema.get("function", schema).get("parameters", {}))
    except Exception as error:
        return Check(
            4,
            "tool schemas",
            FAIL,
            f"get_tools(): {type(error).__name__}: {error}",
            "return typed, docstringed functions or OpenAI function schemas",
        ), None
    return Check(4, "tool schemas", PASS, f"{len(schemas)} valid tool schemas"), None


# ---- helpers -------------------------------------------------------------------------------------------------------
BUNDLED_LABEL = "envkit bundled ChatML"
_BUNDLED: list[Any] = []


def bundled_tokenizer() -> Any:
    """The default tokenizer of ``envkit validate``: envkit's bundled ChatML tool template
    (:func:`envkit.chat.bundled_template`) on a byte-level BPE tokenizer without merges, built in memory in
    milliseconds (one token per byte, plus the ChatML control tokens). It renders exactly like a real ChatML model's
    tokenizer; only token counts are byte counts. Cached; never read from disk beyond the packaged template."""
    if not _BUNDLED:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        from envkit.chat import bundled_template

        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        backend = Tokenizer(models.BPE(vocab={char: i for i, char in enumerate(alphabet)}, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            additional_special_tokens=["<|im_start|>"],
        )
        tokenizer.chat_template = bundled_template()
        _BUNDLED.append(tokenizer)
    return _BUNDLED[0]


@dataclass
class TemplateTokenizer:
    """The tokenizer transcripts are rendered with, and how reports name it."""

    tokenizer: Any
    label: str
    bundled: bool = False

    @classmethod
    def of(cls, tokenizer: Any = None) -> TemplateTokenizer:
        """``tokenizer`` (named after its folder), or the bundled default when it is ``None``."""
        if tokenizer is None:
            return cls(bundled_tokenizer(), BUNDLED_LABEL, bundled=True)
        source = str(getattr(tokenizer, "name_or_path", "") or "")
        return cls(tokenizer, Path(source).name or source or type(tokenizer).__name__)


def _dump(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=repr, ensure_ascii=False)


def _first_difference(a: list[Message], b: list[Message]) -> str:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if _dump(x) != _dump(y):
            return f"message {index} ({_short(x, 60)} vs {_short(y, 60)})"
    return f"message {min(len(a), len(b))} (lengths {len(a)} vs {len(b)})" if len(a) != len(b) else "the score"


def _fmt_score(value: float | None) -> str:
    return "no score" if value is None else f"{value:.3f}"


def _seed_range(seeds: list[int]) -> str:
    return f"{seeds[0]}–{seeds[-1]}" if seeds else "-"
