"""The envkit side of :mod:`envkit.adapters.mcp`: :class:`MCPEnv`, a :class:`~envkit.ToolEnv` over one MCP
session, its tasks (a task class, or ``tasks=[...]`` with expected results), and :func:`env_class` (one subclass per
``mcp:`` spec)."""

from __future__ import annotations

import os
import re
import weakref
from typing import Any, ClassVar

from envkit.adapters._adapted import rebuild, reward_range_config, scaled_score
from envkit.adapters.mcp.client import (
    MCPConnectionError,
    MCPProtocolError,
    MCPSession,
    MCPToolError,
    close_quietly,
    parse_target,
    result_text,
    result_values,
    to_function_schema,
)
from envkit.core.messages import Message
from envkit.core.tools import ToolEnv, decode_tool_call
from envkit.registry import EnvSpecError
from envkit.registry.loading import import_entry_point, load_file

DEFAULT_MAX_TURNS = 10
"""Turns per episode unless the task class or the config says otherwise."""


# ---- tasks -----------------------------------------------------------------------------------------------------------
def _task_class(value: Any, spec: str) -> type:
    if isinstance(value, type):
        return value
    if not isinstance(value, str) or ":" not in value:
        raise EnvSpecError(
            f"{spec}: task must be a class or 'package.module:Class' (or 'path/file.py:Class'), got {value!r}"
        )
    module_name, _, class_name = value.rpartition(":")
    module = (
        load_file(module_name) if module_name.endswith(".py") or "/" in module_name else import_entry_point(module_name)
    )
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise EnvSpecError(f"{spec}: {module_name} has no class {class_name!r} (the task class)")
    missing = [name for name in ("reset", "score") if not callable(getattr(cls, name, None))]
    if missing:
        raise EnvSpecError(f"{spec}: the task class {class_name} has no {' or '.join(missing)} method")
    return cls


EXPECT_KEYS = ("tool", "result", "arguments")
"""The keys of a ``tasks=`` entry's ``expect``: the tool, the result it must return, and (optional) the arguments the
oracle calls it with."""


def _tasks(value: Any, spec: str) -> list[dict[str, Any]]:
    """``tasks=`` checked in shape (before the server is reached; :func:`_check_expected_tools` follows)."""
    if not isinstance(value, (list, tuple)) or not value:
        raise EnvSpecError(f"{spec}: tasks must be a non-empty list of task dicts")
    for index, task in enumerate(value):
        where = f"{spec}: tasks[{index}]"
        if not isinstance(task, dict):
            raise EnvSpecError(f"{where} must be a dict, got {type(task).__name__}")
        if not isinstance(task.get("prompt"), str) and not isinstance(task.get("messages"), list):
            raise EnvSpecError(f"{where} needs a prompt (a string) or messages (a list of chat messages)")
        expect = task.get("expect")
        if not (isinstance(expect, dict) and isinstance(expect.get("tool"), str) and "result" in expect):
            raise EnvSpecError(f"{where} needs expect={{'tool': NAME, 'result': VALUE}} (how the episode is scored)")
        unknown = sorted(set(task) - {"prompt", "messages", "expect"})
        if unknown:
            raise EnvSpecError(
                f"{where} has unknown key(s) {', '.join(unknown)}: a task has prompt or messages, and expect"
            )
        unknown = sorted(set(expect) - set(EXPECT_KEYS))
        if unknown:
            raise EnvSpecError(f"{where}.expect has unknown key(s) {', '.join(unknown)}: its keys are {EXPECT_KEYS}")
        if "arguments" in expect and not isinstance(expect["arguments"], dict):
            raise EnvSpecError(
                f"{where}.expect's arguments must be a dict of the tool's arguments, got {expect['arguments']!r:.60}"
            )
    return [dict(task) for task in value]


def _check_expected_tools(tasks: list[dict[str, Any]], tools: list[str], spec: str) -> None:
    """Refuse a task whose ``expect`` names a tool the server does not have (``tools``): it could never score, and
    every episode would score 0 without an error."""
    for index, task in enumerate(tasks):
        if task["expect"]["tool"] not in tools:
            raise EnvSpecError(
                f"{spec}: tasks[{index}].expect names the tool {task['expect']['tool']!r}, which the server does not "
                f"have (its tools: {', '.join(tools) or 'none'})"
            )


def _returned_expected(expected: Any, text: str, values: list[Any]) -> bool:
    """Whether a call's result is the expected one: a string is compared with the result's text (both stripped), any
    other value with the JSON values the result stands for (:func:`~envkit.adapters.mcp.client.result_values`)."""
    if isinstance(expected, str):
        return text.strip() == expected.strip()
    return any(value == expected for value in values)


# ---- the envkit env --------------------------------------------------------------------------------------------------
class MCPEnv(ToolEnv):
    """An MCP tool server as an envkit :class:`~envkit.ToolEnv` (see the module docstring). ``env_class`` makes one
    subclass per spec; each instance holds one MCP session."""

    envkit_spec: ClassVar[str] = ""
    """The spec the class was built from, e.g. ``"mcp:http://127.0.0.1:8000/mcp"``."""
    mcp_kind: ClassVar[str] = "stdio"
    mcp_target: ClassVar[Any] = None
    max_turns: ClassVar[int] = DEFAULT_MAX_TURNS

    def __init__(
        self,
        *,
        task: Any = None,
        tasks: list[dict[str, Any]] | None = None,
        timeout_s: float = 60.0,
        max_turns: int | None = None,
        system_prompt: str | None = None,
        reward_range: Any = None,
    ) -> None:
        super().__init__()
        spec = self.envkit_spec
        self._config = {
            k: v
            for k, v in {
                "task": task,
                "tasks": tasks,
                "timeout_s": timeout_s,
                "max_turns": max_turns,
                "system_prompt": system_prompt,
                "reward_range": reward_range,
            }.items()
            if v is not None
        }
        if (task is None) == (tasks is None):
            raise EnvSpecError(
                f"{spec}: an MCP server has tools but no task: give task='package.module:Class' (reset/score) or "
                "tasks=[{'prompt': ..., 'expect': {'tool': NAME, 'result': TEXT}}] (envkit.make(..., task=...) or "
                "--env-config)"
            )
        if tasks is not None and reward_range is not None:
            raise EnvSpecError(
                f"{spec}: reward_range maps a task class's score onto [0, 1], and tasks= score 1 or 0: drop "
                "reward_range"
            )
        if not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
            raise EnvSpecError(f"{spec}: timeout_s must be a positive number of seconds, got {timeout_s!r}")
        self.reward_range = reward_range_config(reward_range, spec)
        self.task: Any = _task_class(task, spec)() if task is not None else None
        self.tasks = _tasks(tasks, spec) if tasks is not None else None
        turns = max_turns if max_turns is not None else getattr(self.task, "max_turns", None)
        if turns is not None:
            if not isinstance(turns, int) or turns < 1:
                raise EnvSpecError(f"{spec}: max_turns must be a whole number of at least 1, got {turns!r}")
            self.max_turns = turns  # type: ignore[misc]
        self.system_prompt = system_prompt if system_prompt is not None else getattr(self.task, "system_prompt", None)
        self.timeout_s = float(timeout_s)
        self._row: dict[str, Any] | None = None
        self._returned: list[tuple[str, str, list[Any]]] = []  # (tool, text, values) of the model's successful calls
        self._task_seed: int | None = None
        self._options: Any = None
        self._session = MCPSession(self.mcp_kind, self.mcp_target, self.timeout_s)
        self._session.open()
        self._finalizer = weakref.finalize(self, close_quietly, self._session)
        self._tools = [to_function_schema(t) for t in self._session.list_tools()]
        if self.tasks is not None:
            try:
                _check_expected_tools(self.tasks, [t["function"]["name"] for t in self._tools], spec)
            except EnvSpecError:
                self.close()
                raise

    @property
    def tools(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The server's tools (``list_tools``) as OpenAI function schemas."""
        return [dict(t) for t in self._tools]

    def close(self) -> None:
        """End the MCP session (a stdio server's process exits)."""
        self._finalizer.detach()
        self._session.close()
        super().close()

    # ---- tools -------------------------------------------------------------------------------------------------------
    def run_tool(self, name: str, **arguments: Any) -> str:
        """Call a server tool from a task class (setup in ``reset``, checks in ``score``): its result text.
        An error result raises :class:`MCPToolError`; these calls are not part of the transcript."""
        text, failed = result_text(self._session.call_tool(name, arguments))
        if failed:
            raise MCPToolError(f"{name}: {text}")
        return text

    def call_tool(self, call: Any) -> tuple[str, str, bool]:
        """One model tool call as one MCP ``tools/call``: ``(name, text, failed)``. Model mistakes are tool errors;
        a protocol or transport failure raises."""
        known = [t["function"]["name"] for t in self._tools]
        name, arguments, error = decode_tool_call(call, known, null_arguments=True)
        if error is not None:
            return name, error, True
        result = self._session.call_tool(name, arguments)
        text, failed = result_text(result)
        if not failed:
            self._returned.append((name, text, result_values(result)))
        return name, text, failed

    # ---- the episode -------------------------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start the task of ``seed`` (drawn from ``np_random`` when ``None``): its opening messages."""
        super().reset(seed=seed, options=options)
        task_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31 - 1))
        self._task_seed, self._options = task_seed, options
        self._returned = []
        if self.tasks is not None:
            self._row = self.tasks[task_seed % len(self.tasks)]
            opening: Any = self._row.get("messages", self._row.get("prompt"))
        else:
            opening = self.task.reset(self, task_seed)
        if isinstance(opening, str):
            messages: list[Message] = [{"role": "user", "content": opening}]
        elif isinstance(opening, list) and opening and all(isinstance(m, dict) and "role" in m for m in opening):
            messages = [dict(m) for m in opening]  # type: ignore[misc]
        else:
            raise ValueError(
                f"{self.envkit_spec}: the task's opening must be a string or a non-empty list of chat messages, "
                f"got {opening!r:.100}"
            )
        if self.system_prompt and messages[0].get("role") != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages, {}

    def score(self) -> float:
        """The task's score: the task class's ``score(env)``, or for ``tasks=`` 1.0 when the expected tool returned
        the expected result in this episode; mapped from ``reward_range`` (default [0, 1]) onto [0, 1]."""
        if self.tasks is None:
            return scaled_score(self.task.score(self), self.reward_range, self.envkit_spec, "task's score")
        if self._row is None:
            return 0.0
        expect = self._row["expect"]
        returned = [(text, values) for name, text, values in self._returned if name == expect["tool"]]
        return 1.0 if any(_returned_expected(expect["result"], *result) for result in returned) else 0.0

    def _results(self, tool: str) -> list[str]:
        """The successful results' texts of ``tool``'s calls by the model in this episode (kept as they come:
        ``score()`` is read inside ``step``, before the base class records the step's tool messages)."""
        return [text for name, text, _ in self._returned if name == tool]

    def oracle(self) -> Message | None:
        """The task class's ``oracle(env)``; for ``tasks=`` with ``expect["arguments"]``: call the expected tool with
        them, then answer with its result."""
        if self.tasks is None:
            oracle = getattr(self.task, "oracle", None)
            return oracle(self) if callable(oracle) else None
        if self._row is None or "arguments" not in self._row["expect"]:
            return None
        expect = self._row["expect"]
        results = self._results(expect["tool"])
        if results:
            return {"role": "assistant", "content": f"The result is {results[-1]}."}
        call = {"type": "function", "function": {"name": expect["tool"], "arguments": dict(expect["arguments"])}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}

    # ---- copies and pickles: by spec ---------------------------------------------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        actions = [m for m in getattr(self, "messages", []) if m.get("role") == "assistant"]
        return rebuild, (self.envkit_spec, self._config, self._task_seed, self._options, actions)


# ---- the adapter entry point -----------------------------------------------------------------------------------------
def env_class(rest: str) -> type[MCPEnv]:
    """The envkit env class of ``mcp:REST``: REST is ``stdio:COMMAND ARGS...``, a command line, or an HTTP URL. The
    server is tried once here (started and listed), so a wrong command or URL fails in one line naming it."""
    spec = f"mcp:{rest}"
    kind, target = parse_target(rest)
    probe = MCPSession(kind, target, 30.0)
    try:
        probe.open()
        probe.list_tools()
    except (MCPConnectionError, MCPProtocolError) as error:
        raise EnvSpecError(f"{spec}: {error}") from None
    finally:
        probe.close()
    name = target.split("://", 1)[1] if kind == "http" else os.path.basename(target[-1])
    attributes = {
        "envkit_spec": spec,
        "mcp_kind": kind,
        "mcp_target": target,
        "__module__": __name__,
        "__doc__": f"The MCP server {rest.strip()} as an envkit env.",
    }
    return type(f"MCP_{re.sub(r'[^0-9A-Za-z]+', '_', name).strip('_') or 'server'}", (MCPEnv,), attributes)
