"""Run a coroutine from synchronous code (the blocking faces of the rollout engine and the async backends), and await
with a deadline that cannot be confused with the awaited call's own ``TimeoutError``."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to completion on a private event loop, also when this thread already runs one (e.g. inside
    Jupyter: the coroutine then runs on a loop of its own in a helper thread)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class DeadlinePassed(Exception):
    """Raised by :func:`within` when the deadline passes (never raised by the awaited call itself)."""


async def within(awaitable: Awaitable[T], timeout_s: float | None) -> T:
    """``await awaitable``, cancelled and :class:`DeadlinePassed` raised once ``timeout_s`` has passed (None: no
    deadline). Unlike ``asyncio.wait_for``, a ``TimeoutError`` the awaited call raises itself (a socket timeout, a
    server's) comes back as itself, not as the deadline."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
    except BaseException:  # the caller was cancelled: so is the call
        task.cancel()
        raise
    if not done:
        task.cancel()
        await asyncio.wait({task})  # let it see its cancellation (e.g. count an abandoned call) before going on
        raise DeadlinePassed
    return task.result()


class BackgroundLoop:
    """An asyncio loop on a daemon thread, for clients that keep async sessions alive across synchronous calls
    (OpenEnv, MCP). Started on first use and again in a forked process (a child starts its own: a loop's thread
    does not survive ``fork``).

    Args:
        name: The thread's name (shows in stack dumps).
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid: int | None = None

    def get(self) -> asyncio.AbstractEventLoop:
        """The running loop of this process, started if needed."""
        with self._lock:
            if self._loop is None or self._pid != os.getpid() or not self._loop.is_running():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                threading.Thread(target=run, name=self.name, daemon=True).start()
                ready.wait(10)
                self._loop, self._pid = loop, os.getpid()
            return self._loop

    def run(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coroutine`` on the loop and wait for its result (from any thread but the loop's own); past
        ``timeout_s`` it is cancelled and ``TimeoutError`` raised."""
        future = asyncio.run_coroutine_threadsafe(coroutine, self.get())
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def submit(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Start ``coroutine`` on the loop without waiting (cleanup from finalizers); closed unrun when this process
        has no running loop."""
        loop = self._loop
        if loop is not None and self._pid == os.getpid() and loop.is_running():
            asyncio.run_coroutine_threadsafe(coroutine, loop)
        else:
            coroutine.close()
