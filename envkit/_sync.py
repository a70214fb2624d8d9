"""Run a coroutine from synchronous code (the blocking faces of the rollout engine and the async backends), and await
with a deadline that cannot be confused with the awaited call's own ``TimeoutError``."""

from __future__ import annotations

import asyncio
import concurrent.futures
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
