"""The MCP client side of :mod:`envkit.adapters.mcp`: where the server is (:func:`parse_target`), one session with
it (:class:`MCPSession`, on one event loop shared by every session of the process), its errors, and MCP results as
envkit tool messages (:func:`to_function_schema`, :func:`result_text`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shlex
import tempfile
import threading
from datetime import timedelta
from typing import Any

from envkit.registry import EnvSpecError
from envkit.util import children
from envkit.util.background import BackgroundLoop
from envkit.util.text import one_line

_URL = re.compile(r"^https?://[^/\s]+", re.IGNORECASE)


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


class MCPSession:
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

            # The SDK starts the server itself; under a guard it cannot outlive this process (envkit.util.children).
            command, *args = children.guarded(self.target)
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


def close_quietly(session: MCPSession) -> None:
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
    return one_line(error, 300)


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


def result_values(result: Any) -> list[Any]:
    """The JSON values a successful MCP ``CallToolResult`` may stand for, to compare with an expected value that is
    not text: its ``structuredContent`` (and the value inside, when it is ``{"result": value}``: how the SDK's FastMCP
    wraps a return value that is not an object), its text parsed as JSON (FastMCP indents a dict), its text items each
    parsed (FastMCP sends a list as one item per element), and ``None`` for a result with no content (a tool that
    returned ``None``)."""
    values: list[Any] = []
    structured = result.structuredContent
    if structured is not None:
        values.append(structured)
        if isinstance(structured, dict) and list(structured) == ["result"]:
            values.append(structured["result"])
    texts = [item.text for item in result.content or [] if getattr(item, "type", "") == "text"]
    if not result.content:
        values.append(None)
    with contextlib.suppress(ValueError):
        values.append(json.loads("\n".join(texts)))
    if len(texts) > 1:
        with contextlib.suppress(ValueError):
            values.append([json.loads(text) for text in texts])
    return values
