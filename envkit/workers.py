"""Env workers: where an episode's env calls (construct, reset, step, score) run, off the rollout event loop.

Every call is submitted with a deadline. A call past its deadline raises :class:`EnvTimeout` in the caller at once;
its worker is abandoned (it cannot be killed) and its slot is given back, so capacity never shrinks and a run returns
within its timeouts even when every env hangs forever. Abandoned workers are daemon threads: they never keep the
interpreter from exiting.

:class:`ThreadWorkers` is the default. Other kinds (processes, Ray actors) implement the same :class:`EnvWorkers`
interface.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable


class EnvTimeout(TimeoutError):
    """An env call did not finish before its deadline."""


@runtime_checkable
class EnvWorkers(Protocol):
    """Runs env calls off the event loop, each bounded by a timeout."""

    async def call(self, function: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` on a worker; its result, its exception, or :class:`EnvTimeout`."""
        ...

    def close(self) -> None:
        """Release the workers (calls still running are abandoned)."""
        ...


class ThreadWorkers:
    """Each env call on its own daemon thread, at most ``concurrency`` at once.

    A thread per call costs tens of microseconds, small beside an env step plus its rendering, and makes abandoning
    a hung call trivial: its slot is released when the deadline passes, not when the thread ends.
    """

    def __init__(self, concurrency: int = 32) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency
        self._slots: dict[int, asyncio.Semaphore] = {}  # one per event loop
        self.abandoned = 0
        """Calls given up at their deadline whose threads may still be running."""

    async def call(self, function: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """Run ``function`` on a daemon thread; raise :class:`EnvTimeout` ``timeout_s`` seconds after submission
        (waiting for a free worker counts: a run of hung envs ends within its timeout, not timeout × rounds)."""
        loop = asyncio.get_running_loop()
        slots = self._slots.setdefault(id(loop), asyncio.Semaphore(self.concurrency))
        try:
            return await asyncio.wait_for(self._run(loop, slots, function, args, kwargs), timeout_s)
        except asyncio.TimeoutError:  # not the builtin TimeoutError before Python 3.11
            raise EnvTimeout(f"took longer than {timeout_s:g}s") from None

    async def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        slots: asyncio.Semaphore,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        async with slots:  # released when this coroutine is cancelled at the deadline, not when the thread ends
            future: asyncio.Future[Any] = loop.create_future()

            def settle(outcome: Any, failed: bool) -> None:
                if not future.done():
                    (future.set_exception if failed else future.set_result)(outcome)

            def target() -> None:
                try:
                    outcome, failed = function(*args, **kwargs), False
                except BaseException as error:  # handed to the caller, whatever it is
                    outcome, failed = error, True
                with contextlib.suppress(RuntimeError):  # the loop is gone: the caller gave up long ago
                    loop.call_soon_threadsafe(settle, outcome, failed)

            threading.Thread(target=target, name="envkit-env", daemon=True).start()
            try:
                return await future
            except asyncio.CancelledError:
                self.abandoned += 1
                raise

    def close(self) -> None:
        """Nothing to release: threads end with their calls, and abandoned ones are daemons."""
        self._slots.clear()
