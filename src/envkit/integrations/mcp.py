"""MCP tool servers as envkit envs: ``envkit.make("mcp:stdio:COMMAND ARGS...", task=...)`` and
``envkit.make("mcp:http://HOST:PORT/mcp", task=...)``, through the official ``mcp`` Python SDK's client.

The spec names the server: ``mcp:stdio:COMMAND ARGS...`` (or ``mcp:COMMAND ARGS...``; the command line is split as
a shell would, with its environment inherited) starts it as a subprocess and talks MCP over its stdin/stdout;
``mcp:http://…`` / ``mcp:https://…`` connects to a running server over streamable HTTP. Each env instance holds one
MCP session (for stdio: its own server process), opened when the env is built and ended by ``close()`` (or when the
env is garbage-collected).

The env is a :class:`envkit.ToolEnv` whose tools are the server's (``list_tools``; each tool's ``inputSchema`` is the
function's ``parameters``). Each tool call of a turn is one ``call_tool``: the result's text items, joined by newlines,
are the tool message; a result with ``isError`` is an ``Error: …`` tool message and counts as a tool error; unknown
tools and bad JSON are answered locally. ToolEnv's caps apply (``max_tool_calls_per_turn``, ``max_tool_output_chars``).
A failure of the protocol or the transport (the server died, a JSON-RPC error, no reply within ``timeout_s``) is no
tool result: it raises, and the episode fails (over streamable HTTP the SDK's client notices a server that died
mid-call only at the ``timeout_s`` read timeout). A turn without tool calls ends the episode.

An MCP server has tools but no task, so the task comes from the config, in one of two forms:

* ``task="package.module:Class"`` (or ``"path/file.py:Class"``, or the class itself): one instance per env, with
  ``reset(env, seed) -> messages`` (a list of chat messages, or a string: one user message), which may set up the
  server through ``env.run_tool(name, **arguments)``; ``score(env) -> float`` (it may read the server the same way,
  and ``env.messages`` is the transcript); and optionally ``oracle(env) -> message | None``, ``system_prompt`` (a
  string prepended as a system message) and ``max_turns``.
* ``tasks=[{...}, ...]``: task seed ``s`` is ``tasks[s % len(tasks)]``, a dict with ``prompt`` (a string) or
  ``messages`` (chat messages), and ``expect={"tool": NAME, "result": TEXT}``: the score is 1.0 when a call of NAME in
  the episode returned exactly TEXT (stripped), else 0.0. With ``expect["arguments"]`` as well, the oracle calls NAME
  with them, then answers with the result.

Other keywords: ``timeout_s`` (seconds per server reply, default 60), ``max_turns`` (default 10),
``system_prompt``, and ``reward_range=[lo, hi]`` (the task's score is mapped from it onto [0, 1]; default [0, 1]; a
score outside it fails the episode instead of being clipped). Copies and pickles are rebuilt by spec (a new session,
reset with the episode's seed, its turns replayed), so process workers work; a server whose state outlives a session
(an HTTP server shared by envs) must be reset per episode by the task class for replays to agree.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import tempfile
import threading
import weakref
from datetime import timedelta
from typing import Any, ClassVar

from envkit.core.messages import Message
from envkit.core.tools import ToolEnv, decode_tool_call
from envkit.integrations._adapted import rebuild, reward_range_config, scaled_score
from envkit.registry import EnvSpecError
from envkit.registry.loading import _import, _load_file
from envkit.util.background import BackgroundLoop

_URL = re.compile(r"^https?://[^/\s]+", re.IGNORECASE)

DEFAULT_MAX_TURNS = 10


class MCPConnectionError(ConnectionError):
    """The MCP server cannot be started or reached, or its session broke; the message names the command or URL."""


class MCPProtocolError(RuntimeError):
    """The MCP server answered a request with a protocol error (a JSON-RPC error, a malformed reply)."""


class MCPToolError(RuntimeError):
    """A tool called by a task class through :meth:`MCPEnv.run_tool` returned an error result (``isError``)."""


# ---- one event loop for every MCP session of this process ------------------------------------------------------------
_LOOP = BackgroundLoop("envkit-mcp-loop")
"""The loop every MCP client of this process lives on."""


# ---- the server: where it is and one session with it -----------------------------------------------------------------
def parse_target(rest: str) -> tuple[str, Any]:
    """``("http", URL)`` or ``("stdio", [COMMAND, ARGS...])`` for the ``REST`` of an ``mcp:REST`` spec."""
    target = rest.strip()
    if _URL.match(target):
        return "http", target
    if target.startswith("stdio:"):
        target = target[len("stdio:") :].strip()
    try:
        argv = shlex.split(target)
    except ValueError as error:
        raise EnvSpecError(f"mcp:{rest}: cannot split the command line ({error})") from None
    if not argv:
        raise EnvSpecError(
            f"mcp:{rest}: give the server's command (mcp:stdio:COMMAND ARGS...) or URL (mcp:http://HOST:PORT/mcp)"
        )
    return "stdio", argv


class _Session:
    """One MCP client session (``mcp.ClientSession``) over stdio or streamable HTTP, held open by a task on the shared
    loop: the SDK's transports are anyio contexts that must be entered and left by one task."""

    def __init__(self, kind: str, target: Any, timeout_s: float) -> None:
        self.kind, self.target, self.timeout_s = kind, target, timeout_s
        self.where = f"the MCP server at {target}" if kind == "http" else f"the MCP server `{shlex.join(target)}`"
        self.session: Any = None
        self._closing: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._broken: BaseException | None = None
        # the server's stderr goes to a file (FastMCP logs every request there): its last line explains a failure
        self._stderr = (
            tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed by close()
            if kind == "stdio"
            else None
        )

    def _transport(self) -> Any:
        if self.kind == "stdio":
            from mcp import StdioServerParameters
            from mcp.client.stdio import stdio_client

            command, *args = self.target
            parameters = StdioServerParameters(command=command, args=args, env=dict(os.environ))
            return stdio_client(parameters, errlog=self._stderr)
        try:
            from mcp.client.streamable_http import streamable_http_client as client
        except ImportError:  # mcp < 1.24 has only the older name
            from mcp.client.streamable_http import streamablehttp_client as client
        return client(self.target)

    async def _hold(self, ready: asyncio.Future[None]) -> None:
        from mcp import ClientSession

        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(
                    ClientSession(streams[0], streams[1], read_timeout_seconds=timedelta(seconds=self.timeout_s))
                )
                await session.initialize()
                self.session = session
                ready.set_result(None)
                assert self._closing is not None
                await self._closing.wait()
        except BaseException as error:
            if not ready.done():
                ready.set_exception(_root(error))
            else:
                self._broken = _root(error)
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self.session = None

    def open(self) -> None:
        """Start the server (stdio) or connect (HTTP) and initialize the session; one line when that fails."""

        async def start() -> None:
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._closing = asyncio.Event()
            self._task = asyncio.ensure_future(self._hold(ready))
            await ready

        try:
            _LOOP.run(start(), self.timeout_s + 5.0)
        except BaseException as error:
            what = "could not be started" if self.kind == "stdio" else "could not be reached"
            if isinstance(_root(error), TimeoutError):
                what = f"did not finish the MCP handshake in {self.timeout_s:g} s"
            message = self._failure(what, error)  # before close(), which drops the stderr file
            self.close()
            raise MCPConnectionError(message) from None

    def _failure(self, what: str, error: BaseException) -> str:
        error = _root(error)
        reason = "no reply in time" if isinstance(error, TimeoutError) else _reason(error)
        text = f"{self.where} {what} ({reason})"
        tail = self._stderr_tail()
        return f"{text}; its stderr ended: {tail}" if tail else text

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        with contextlib.suppress(Exception):
            self._stderr.flush()
            self._stderr.seek(0)
            lines = [line.strip() for line in self._stderr.read()[-4000:].splitlines() if line.strip()]
            return _reason(ValueError(lines[-1])) if lines else ""
        return ""

    def request(self, name: str, call: Any) -> Any:
        """``await call(session)`` on the loop. A transport failure raises :class:`MCPConnectionError`, a protocol
        error :class:`MCPProtocolError`, both naming the server and the request."""
        import anyio
        import httpx
        from mcp.shared.exceptions import McpError
        from mcp.types import CONNECTION_CLOSED

        async def run() -> Any:
            if self.session is None:
                raise MCPConnectionError("the session is closed")
            return await call(self.session)

        if self._broken is not None or self.session is None:
            raise MCPConnectionError(
                self._failure(f"is gone ({name} was not sent)", self._broken or ConnectionError("session closed"))
            )
        try:
            return _LOOP.run(run(), self.timeout_s + 5.0)
        except McpError as error:
            code, text = getattr(error.error, "code", None), str(error).lower()
            if code == CONNECTION_CLOSED and "closed" in text:
                self._broken = self._broken or error
                raise MCPConnectionError(self._failure(f"closed the connection during {name}", error)) from None
            if code == 408 or "timed out" in text:  # the SDK's read timeout (HTTP 408 as the JSON-RPC code)
                raise MCPConnectionError(
                    self._failure(f"did not answer {name} in {self.timeout_s:g} s", error)
                ) from None
            raise MCPProtocolError(f"{self.where} answered {name} with an error: {_reason(error)}") from None
        except MCPConnectionError:
            raise
        except TimeoutError as error:
            raise MCPConnectionError(self._failure(f"did not answer {name} in {self.timeout_s:g} s", error)) from None
        except (
            ConnectionError,
            OSError,
            httpx.TransportError,
            anyio.ClosedResourceError,
            anyio.BrokenResourceError,
            anyio.EndOfStream,
        ) as error:
            self._broken = self._broken or error
            raise MCPConnectionError(self._failure(f"broke during {name}", error)) from None
        except Exception as error:
            if self._broken is not None:
                raise MCPConnectionError(self._failure(f"broke during {name}", self._broken)) from None
            raise MCPProtocolError(f"{self.where}: {name} failed: {type(error).__name__}: {_reason(error)}") from None

    def list_tools(self) -> list[Any]:
        """Every tool of the server (all pages of ``tools/list``)."""
        tools: list[Any] = []
        cursor: str | None = None
        while True:

            async def page(session: Any, cursor: str | None = cursor) -> Any:
                return await session.list_tools(cursor)

            result = self.request("tools/list", page)
            tools.extend(result.tools)
            cursor = result.nextCursor
            if not cursor:
                return tools

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        """One ``tools/call``: the server's ``CallToolResult``."""

        async def call(session: Any) -> Any:
            return await session.call_tool(name, arguments)

        return self.request(f"tools/call {name}", call)

    def close(self) -> None:
        """End the session (a stdio server gets its stdin closed, then is terminated if it lingers)."""
        task, closing = self._task, self._closing
        self._task = None
        if task is not None and closing is not None:

            async def stop() -> None:
                closing.set()
                if self.session is None:  # never got ready (open failed or timed out): nothing to close politely
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task, 10.0)  # cancels the task when the transport will not close

            loop = _LOOP.get()
            if threading.current_thread().name == "envkit-mcp-loop":  # a finalizer run on the loop: do not wait
                pending = asyncio.ensure_future(stop(), loop=loop)
                _PENDING.add(pending)
                pending.add_done_callback(_PENDING.discard)
            else:
                with contextlib.suppress(BaseException):
                    _LOOP.run(stop(), 15.0)
        if self._stderr is not None:
            with contextlib.suppress(Exception):
                self._stderr.close()


_PENDING: set[asyncio.Future[None]] = set()
"""Closes started from the loop's own thread (kept referenced until they finish)."""


def _close_quietly(session: _Session) -> None:
    with contextlib.suppress(BaseException):
        session.close()


def _root(error: BaseException) -> BaseException:
    """The first leaf of an (anyio) exception group: the error that actually happened."""
    while isinstance(getattr(error, "exceptions", None), tuple) and error.exceptions:  # type: ignore[attr-defined]
        error = error.exceptions[0]  # type: ignore[attr-defined]
    return error


def _reason(error: BaseException) -> str:
    if type(error).__name__ in ("BrokenResourceError", "ClosedResourceError"):
        # anyio's names for a pipe whose other end went away: whether the client was reading (the SDK's "Connection
        # closed") or writing when the server exited is a race, not a second cause.
        return "Connection closed"
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# ---- MCP -> envkit ---------------------------------------------------------------------------------------------------
def to_function_schema(tool: Any) -> dict[str, Any]:
    """An MCP ``Tool`` as an OpenAI function schema (envkit's ``tools``): its ``inputSchema`` is the parameters."""
    parameters = dict(getattr(tool, "inputSchema", None) or {"type": "object", "properties": {}})
    parameters.setdefault("type", "object")
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description or "", "parameters": parameters},
    }


def result_text(result: Any) -> tuple[str, bool]:
    """The tool message text of an MCP ``CallToolResult`` and whether it is an error (``Error: …``).

    Text items are joined by newlines; other items are described in brackets (an embedded text resource gives its
    text); a result with no content gives its ``structuredContent`` as JSON.
    """
    parts: list[str] = []
    for item in result.content or []:
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind == "resource" and isinstance(getattr(item.resource, "text", None), str):
            parts.append(item.resource.text)
        elif kind == "resource":
            parts.append(f"[resource {item.resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource {item.uri}]")
        else:
            parts.append(f"[{kind or 'content'}: {getattr(item, 'mimeType', None) or 'unknown type'}]")
    if not parts and result.structuredContent is not None:
        parts.append(json.dumps(result.structuredContent, ensure_ascii=False, default=str))
    text = "\n".join(parts)
    if result.isError:
        return (text if text.startswith("Error") else f"Error: {text or 'the tool failed'}"), True
    return text, False


# ---- tasks -----------------------------------------------------------------------------------------------------------
def _task_class(value: Any, spec: str) -> type:
    if isinstance(value, type):
        return value
    if not isinstance(value, str) or ":" not in value:
        raise EnvSpecError(
            f"{spec}: task must be a class or 'package.module:Class' (or 'path/file.py:Class'), got {value!r}"
        )
    module_name, _, class_name = value.rpartition(":")
    module = _load_file(module_name) if module_name.endswith(".py") or "/" in module_name else _import(module_name)
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        raise EnvSpecError(f"{spec}: {module_name} has no class {class_name!r} (the task class)")
    missing = [name for name in ("reset", "score") if not callable(getattr(cls, name, None))]
    if missing:
        raise EnvSpecError(f"{spec}: the task class {class_name} has no {' or '.join(missing)} method")
    return cls


def _tasks(value: Any, spec: str) -> list[dict[str, Any]]:
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
            raise EnvSpecError(f"{where} needs expect={{'tool': NAME, 'result': TEXT}} (how the episode is scored)")
        unknown = sorted(set(task) - {"prompt", "messages", "expect"})
        if unknown:
            raise EnvSpecError(
                f"{where} has unknown key(s) {', '.join(unknown)}: a task has prompt or messages, and expect"
            )
    return [dict(task) for task in value]


def _expected_text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


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
        self._returned: list[tuple[str, str]] = []  # (tool, text) of this episode's successful model calls
        self._task_seed: int | None = None
        self._options: Any = None
        self._session = _Session(self.mcp_kind, self.mcp_target, self.timeout_s)
        self._session.open()
        self._finalizer = weakref.finalize(self, _close_quietly, self._session)
        self._tools = [to_function_schema(t) for t in self._session.list_tools()]

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
        text, failed = result_text(self._session.call_tool(name, arguments))
        if not failed:
            self._returned.append((name, text))
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
        wanted = _expected_text(expect["result"])
        results = self._results(expect["tool"])
        return 1.0 if any(text.strip() == wanted for text in results) else 0.0

    def _results(self, tool: str) -> list[str]:
        """The successful results of ``tool``'s calls by the model in this episode (kept as they come: ``score()`` is
        read inside ``step``, before the base class records the step's tool messages)."""
        return [text for name, text in self._returned if name == tool]

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
    probe = _Session(kind, target, 30.0)
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
