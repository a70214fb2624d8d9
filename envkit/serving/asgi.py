"""Serving an ASGI app (:func:`envkit.adapters.openenv.server.create_envkit_app`'s): limits a public server needs
(:class:`Limits`: WebSocket idle timeout, message and body size) and uvicorn on a socket (:func:`start_server`)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""The largest WebSocket message or HTTP request body served (4 MiB)."""


class Limits:
    """ASGI middleware: WebSocket idle timeout and message size, HTTP body size.

    A WebSocket client that sends nothing for ``idle_timeout_s`` (while the server waits for it) is disconnected: the
    app sees a disconnect, so OpenEnv destroys the session and frees its slot, and the client gets close code 1001. A
    message over ``max_bytes`` closes the socket with 1009; an HTTP request body over it gets 413. ``on_shutdown``
    runs when the server shuts the app down (ASGI lifespan), after the app's own shutdown.
    """

    envs: Any = None
    """What the app's envs live in (:class:`envkit.serving.hosted.ServedEnvs`), when it was set."""

    def __init__(
        self,
        app: Any,
        *,
        max_bytes: int,
        idle_timeout_s: float | None,
        on_shutdown: Callable[[], None] | None = None,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.idle_timeout_s = idle_timeout_s
        self.on_shutdown = on_shutdown

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan" and self.on_shutdown is not None:
            await self._lifespan(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _lifespan(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        async def watched_send(message: dict[str, Any]) -> None:
            if message["type"] in ("lifespan.shutdown.complete", "lifespan.shutdown.failed") and self.on_shutdown:
                shutdown, self.on_shutdown = self.on_shutdown, None
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(shutdown)
            await send(message)

        await self.app(scope, receive, watched_send)

    async def _websocket(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        state = {"accepted": False, "closed": False}

        async def guarded_send(message: dict[str, Any]) -> None:
            if state["closed"]:
                return  # the socket was closed here; the app's own close comes after
            if message["type"] == "websocket.accept":
                state["accepted"] = True
            if message["type"] != "websocket.close":
                await send(message)
                return
            with contextlib.suppress(Exception):  # the client may be gone (OpenEnv closes every socket at the end)
                await send(message)

        async def guarded_receive() -> dict[str, Any]:
            if state["closed"]:
                return {"type": "websocket.disconnect", "code": 1000}
            if not state["accepted"] or self.idle_timeout_s is None:
                message = await receive()
            else:
                try:
                    message = await asyncio.wait_for(receive(), self.idle_timeout_s)
                except asyncio.TimeoutError:
                    return await close(1001, f"idle for {self.idle_timeout_s:g} s (session timeout)")
            if message["type"] == "websocket.receive":
                data = message.get("text")
                size = len(data.encode()) if data is not None else len(message.get("bytes") or b"")
                if size > self.max_bytes:
                    return await close(1009, f"message of {size} bytes exceeds the limit of {self.max_bytes}")
            return message

        async def close(code: int, reason: str) -> dict[str, Any]:
            state["closed"] = True
            with contextlib.suppress(Exception):
                await send({"type": "websocket.close", "code": code, "reason": reason[:120]})
            return {"type": "websocket.disconnect", "code": code}

        await self.app(scope, guarded_receive, guarded_send)

    async def _http(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await _too_large(send, self.max_bytes)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                await _too_large(send, self.max_bytes)
                return
        body, replayed = b"".join(chunks), False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def _too_large(send: Any, limit: int) -> None:
    body = json.dumps({"detail": f"request body exceeds the limit of {limit} bytes"}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


@dataclass
class RunningServer:
    """A server started by :func:`start_server`: its ``url`` (``ws://host:port``) and ``stop()``."""

    url: str
    server: Any
    thread: threading.Thread | None

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and wait for the server thread."""
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout_s)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (port 0: any free port); raises ``OSError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(256)
    except OSError:
        sock.close()
        raise
    return sock


def start_server(
    app: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    background: bool = True,
    on_ready: Callable[[str], None] | None = None,
) -> RunningServer:
    """Serve ``app`` with uvicorn on ``host:port``.

    ``background``: in a daemon thread, returning once the server accepts connections; otherwise in this thread until
    interrupted (``on_ready(url)`` is called once the socket listens). Raises ``OSError`` when it cannot listen.
    """
    import uvicorn

    sock = listen(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    url = f"ws://{shown}:{bound}"
    config = uvicorn.Config(
        app,
        log_level="warning",
        ws_max_size=max_message_bytes,
        ws_ping_interval=20.0,
        ws_ping_timeout=20.0,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    if not background:
        if on_ready is not None:
            on_ready(url)
        server.run(sockets=[sock])
        return RunningServer(url, server, None)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="envkit-openenv-server", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise OSError(f"the server on {url} stopped during start-up")
        thread.join(0.02)
    if on_ready is not None:
        on_ready(url)
    return RunningServer(url, server, thread)
