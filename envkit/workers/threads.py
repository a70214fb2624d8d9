"""Thread env workers (the default kind): each env in this process, each call on a reused daemon thread
(:class:`DaemonPool`), at most ``concurrency`` calls at once; a hung call is abandoned at its deadline."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import math
import queue
import threading
import weakref
from collections.abc import Callable
from typing import Any

from envkit.core.env import Ending
from envkit.core.messages import Message
from envkit.util.background import DeadlinePassed
from envkit.workers.base import (
    EnvExited,
    EnvTimeout,
    LeakedThreadsError,
    StepOutcome,
    components_outcome,
    has_score_components,
    reset_outcome,
    score_outcome,
    step_outcome,
)


def _gym_close() -> Any:
    import gymnasium

    return gymnasium.Env.close


_GYM_CLOSE = _gym_close()


class DaemonPool:
    """Reusable daemon threads that never shrink the pool when a call hangs.

    A call is handed to an idle thread when there is one, else to a new thread; starting a thread makes the caller
    wait for it to run (about a millisecond on a busy machine, on the event loop), so threads are kept and reused.
    A thread whose call hangs is simply not idle: the next call finds no idle thread and starts a new one, so the
    pool grows instead of shrinking, and a hung call that ends one day returns its thread to the pool. Idle threads
    exit after ``idle_s`` seconds.
    """

    def __init__(self, idle_s: float = 10.0) -> None:
        self.idle_s = idle_s
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], Callable[[Any], None]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a task, minus tasks queued for them

    def submit(self, compute: Callable[[], Any], deliver: Callable[[Any], None]) -> None:
        """Run ``compute()`` on a pool thread, then ``deliver(its outcome)`` (after the thread is idle again, so a
        caller that submits its next call on delivery finds it free)."""
        with self._lock:
            if self._idle > 0:  # reserve an idle thread: exactly one waiting thread will take this task
                self._idle -= 1
                self._tasks.put((compute, deliver))
                return
        threading.Thread(target=self._work, args=(compute, deliver), name="envkit-env", daemon=True).start()

    def future(
        self,
        loop: asyncio.AbstractEventLoop,
        function: Callable[[], Any],
        base_exception: Callable[[str], Exception] = RuntimeError,
    ) -> asyncio.Future[Any]:
        """``function()`` on a pool thread, as a future of ``loop``: its result, or its exception (a
        ``BaseException`` that is not an ``Exception``, e.g. ``SystemExit``, comes back as ``base_exception``).
        Cancelling the future abandons the call: the thread runs on, and its outcome is dropped."""
        future: asyncio.Future[Any] = loop.create_future()

        def settle(outcome: Any, failed: bool) -> None:
            if not future.done():
                (future.set_exception if failed else future.set_result)(outcome)

        def compute() -> tuple[Any, bool]:
            try:
                return function(), False
            except Exception as error:  # handed to the caller
                return error, True
            except BaseException as error:
                return base_exception(f"{type(error).__name__}: {error}"), True

        def deliver(result: tuple[Any, bool]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is gone: the caller gave up long ago
                loop.call_soon_threadsafe(settle, *result)

        self.submit(compute, deliver)
        return future

    def _work(self, compute: Callable[[], Any], deliver: Callable[[Any], None]) -> None:
        while True:
            outcome = compute()
            with self._lock:
                self._idle += 1
            deliver(outcome)
            while True:
                try:
                    compute, deliver = self._tasks.get(timeout=self.idle_s)
                    break
                except queue.Empty:
                    with self._lock:
                        if self._tasks.empty():  # nobody reserved this thread: leave
                            self._idle -= 1
                            return


SHARED_POOL = DaemonPool()
"""The daemon threads every :class:`ThreadWorkers` of this process runs its calls on. Shared, so that the engines a
trainer builds (one per rollout call) or a benchmark builds (one per arm) reuse warm threads instead of each starting
``concurrency`` new ones (a thread start took ~2 ms on the loaded 2-core machine: 0.27 s of a 2.5 s, 128-episode
run)."""


class _Slots:
    """At most ``capacity`` calls at once on one event loop, handed out first come, first served.

    The pool is *jammed* while every slot is held and no call has finished for a whole timeout (the longest among the
    calls holding slots): a call that does not hang finishes within its timeout, so a freed slot's next call ends (or
    is abandoned) within one, and calls that are merely slow, however close to their timeout, never jam the pool.
    :meth:`jam_clock` adds up the time the pool was jammed, so a waiting caller can tell time lost to a stuck pool
    (which counts against its deadline) from time spent behind calls that turn over (load, which does not).
    """

    def __init__(self, capacity: int, now: float) -> None:
        self.capacity = capacity
        self._held: dict[int, float] = {}  # slot token -> its call's timeout
        self._waiters: collections.deque[tuple[asyncio.Future[int], float]] = collections.deque()
        self._tokens = itertools.count()
        self._finished_at = now  # the last time a call finished (returned or raised; not abandoned)
        self._jammed = 0.0  # jammed seconds up to self._seen
        self._seen = now

    def take(self, now: float, timeout_s: float) -> int | None:
        """A slot, now, if one is free and nobody is waiting for it; else None."""
        if len(self._held) >= self.capacity or self._waiters:
            return None
        return self._hold(now, timeout_s)

    def wait(self, loop: asyncio.AbstractEventLoop, timeout_s: float) -> asyncio.Future[int]:
        """A future that gets a slot's token when one is handed over (cancel it to leave the queue)."""
        waiter: asyncio.Future[int] = loop.create_future()
        self._waiters.append((waiter, timeout_s))
        return waiter

    def release(self, token: int, now: float, *, finished: bool) -> None:
        """Give a slot back (``finished``: its call returned or raised, rather than being abandoned); it goes straight
        to the longest-waiting caller."""
        self.jam_clock(now)
        self._held.pop(token, None)
        if finished:
            self._finished_at = now
        while self._waiters and len(self._held) < self.capacity:
            waiter, timeout_s = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(self._hold(now, timeout_s))

    def _hold(self, now: float, timeout_s: float) -> int:
        self.jam_clock(now)
        token = next(self._tokens)
        self._held[token] = timeout_s
        return token

    def jammed_from(self) -> float:
        """When the pool, as it is now, becomes jammed (infinity while a slot is free)."""
        if len(self._held) < self.capacity:
            return math.inf
        return self._finished_at + max(self._held.values())

    def jam_clock(self, now: float) -> float:
        """Seconds the pool has been jammed, in all, up to ``now`` (a monotonic clock)."""
        if now > self._seen:
            self._jammed += max(0.0, now - max(self._seen, self.jammed_from()))
            self._seen = now
        return self._jammed


class ThreadWorkers:
    """Each env in this process; each call on a daemon thread, at most ``concurrency`` calls at once.

    Threads are reused (:class:`DaemonPool`), and a hung call is abandoned at its deadline: its slot is released
    when the deadline passes, not when the thread ends, and the pool starts another thread for the next call, so
    capacity never shrinks.

    Deadlines: a call has ``timeout_s`` of running time, less the time it waited for a slot while the pool was
    *jammed* (every slot held, and no call finished for a whole timeout: hung envs). Waiting behind calls
    that keep finishing, however slowly, is load, not a fault: with many more episodes than workers, nothing times out
    for queueing. A call still waiting is given up once it has waited ``timeout_s`` in all and the pool is jammed, so a
    run of envs that all hang ends within about two timeouts, not a timeout per round of ``concurrency`` calls. A
    ``TimeoutError`` the function raises itself is its own error, not the deadline.

    Leaks: an abandoned call's thread (and the env it holds) lives until the call returns, perhaps for the life of
    the process. :attr:`leaked` counts those still running; past ``max_leaked`` (default ``max(64, 2 *
    concurrency)``) the call that times out, and every call after it while the count stays past the limit, raises
    :class:`LeakedThreadsError` (one line recommending process workers, which kill a hung call).
    """

    in_process = True

    def __init__(self, concurrency: int = 32, *, max_leaked: int | None = None) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if max_leaked is not None and max_leaked < 0:
            raise ValueError("max_leaked must not be negative")
        self.concurrency = concurrency
        self.max_leaked = max(64, 2 * concurrency) if max_leaked is None else max_leaked
        # One per event loop (each run() has its own), dropped with its loop.
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Slots] = weakref.WeakKeyDictionary()
        self._pool = SHARED_POOL  # threads outlive one pool of workers: an engine per trainer step starts none
        self._lock = threading.Lock()  # guards leaked: abandoned calls return on their own threads
        self.abandoned = 0
        """Calls given up at their deadline whose threads may still be running (all of them, ever)."""
        self.leaked = 0
        """Calls given up at their deadline whose threads are still running now (each holds its thread and env)."""

    async def open(self, env_factory: Callable[[], Any], *, timeout_s: float) -> _ThreadSession:
        """Build the env on a worker thread."""
        return _ThreadSession(self, await self.call(env_factory, timeout_s=timeout_s))

    async def call(self, function: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """Run ``function`` on a daemon thread; raise :class:`EnvTimeout` past its deadline, and
        :class:`LeakedThreadsError` while more than ``max_leaked`` abandoned calls still run (see the class)."""
        self._check_leaks()
        loop = asyncio.get_running_loop()
        slots = self._slots.get(loop)
        if slots is None:
            slots = self._slots[loop] = _Slots(self.concurrency, loop.time())
        budget = timeout_s
        token = slots.take(loop.time(), timeout_s)
        if token is None:
            token, jammed_wait = await self._queue(loop, slots, timeout_s)
            budget = timeout_s - jammed_wait
        finished = False
        try:
            if budget <= 0:
                raise EnvTimeout(
                    f"took longer than {timeout_s:g}s",
                    f"its timeout went on waiting for a free env worker while all {self.concurrency} were stuck",
                )
            try:
                outcome = await self._run(loop, function, args, kwargs, budget)
            except DeadlinePassed:
                self._check_leaks()
                raise EnvTimeout(f"took longer than {timeout_s:g}s") from None
            except Exception:
                finished = True  # the call raised: it ended, the pool is turning over
                raise
            finished = True
            return outcome
        finally:  # at the deadline, not when the abandoned thread ends
            slots.release(token, loop.time(), finished=finished)

    async def _queue(self, loop: asyncio.AbstractEventLoop, slots: _Slots, timeout_s: float) -> tuple[int, float]:
        """Wait for a slot; return it and the time waited while the pool was jammed. Give up (:class:`EnvTimeout`)
        once waited ``timeout_s`` in all while the pool is jammed, or ``timeout_s`` of jammed time."""
        submitted = loop.time()
        jam_at_submit = slots.jam_clock(submitted)
        waiter = slots.wait(loop, timeout_s)
        try:
            while True:
                now = loop.time()
                jammed_wait = slots.jam_clock(now) - jam_at_submit
                jammed_from = slots.jammed_from()
                give_up_at = min(
                    max(submitted + timeout_s, jammed_from),  # waited a timeout, and the pool is jammed
                    max(now, jammed_from) + timeout_s - jammed_wait,  # a timeout of jammed time
                )
                if now >= give_up_at:
                    raise EnvTimeout(
                        f"took longer than {timeout_s:g}s",
                        f"waited {now - submitted:.3g}s for a free env worker while all {self.concurrency} were stuck "
                        "(none finished a call for a whole timeout)",
                    )
                # Slots turning over move the jam later: waking early only re-checks.
                done, _ = await asyncio.wait({waiter}, timeout=None if math.isinf(give_up_at) else give_up_at - now)
                if done:
                    return waiter.result(), slots.jam_clock(loop.time()) - jam_at_submit
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # handed a slot in the same instant: give it back
                slots.release(waiter.result(), loop.time(), finished=False)
            waiter.cancel()
            raise

    async def _run(
        self,
        loop: asyncio.AbstractEventLoop,
        function: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        budget: float,
    ) -> Any:
        """``function(*args, **kwargs)`` on a pool thread; :class:`DeadlinePassed` after ``budget`` seconds.

        The deadline is a timer that fails the call's own future, not a task wrapped around it: an env call costs one
        hop to its thread and one back (measured: 32 concurrent steps of an instant env took 8.8 ms through a wrapping
        task, 8.1 ms with this timer; 5.2 ms called inline).
        """
        returned = abandoned = False  # under self._lock: whichever comes second settles the leak count

        def run() -> Any:
            nonlocal returned
            try:
                return function(*args, **kwargs)
            finally:
                with self._lock:
                    returned = True
                    if abandoned:
                        self.leaked -= 1

        # An env's sys.exit() comes back as EnvExited: raised in the caller's task as itself it would end the run.
        future = self._pool.future(loop, run, EnvExited)

        def expire() -> None:
            if not future.done():
                future.set_exception(DeadlinePassed())

        timer = loop.call_later(budget, expire) if math.isfinite(budget) else None
        try:
            return await future
        except (DeadlinePassed, asyncio.CancelledError):  # past the deadline, or the caller gave up: abandoned
            self.abandoned += 1
            with self._lock:
                if not returned:
                    abandoned = True
                    self.leaked += 1
            raise
        finally:
            if timer is not None:
                timer.cancel()

    def _check_leaks(self) -> None:
        if self.leaked > self.max_leaked:
            raise LeakedThreadsError(
                f"{self.leaked} env calls that timed out are still running on abandoned threads (more than "
                f"max_leaked={self.max_leaked}); a thread cannot be stopped and each keeps its env: use --env-workers "
                "processes (env_workers='processes'), which kills a hung call"
            )

    def close(self) -> None:
        """Nothing to release: idle threads exit on their own, and abandoned ones are daemons."""
        self._slots.clear()


class _ThreadSession:
    """An env object in this process; its calls run on :class:`ThreadWorkers` threads."""

    def __init__(self, workers: Any, env: Any) -> None:
        self.workers, self.env = workers, env
        self._closed = False

    async def reset(self, seed: int, *, timeout_s: float) -> tuple[list[Message], dict[str, Any], list[Any] | None]:
        return await self.workers.call(reset_outcome, self.env, seed, timeout_s=timeout_s)

    async def step(self, action: Message, *, timeout_s: float) -> StepOutcome:
        return await self.workers.call(step_outcome, self.env, action, timeout_s=timeout_s)

    async def score(self, *, timeout_s: float, ending: Ending | None = None) -> float:
        return await self.workers.call(score_outcome, self.env, ending, timeout_s=timeout_s)

    async def score_components(self, *, timeout_s: float) -> dict[str, float]:
        if not has_score_components(self.env):  # no thread hop for envs without them
            return {}
        return await self.workers.call(components_outcome, self.env, timeout_s=timeout_s)

    async def transcript(self, *, timeout_s: float) -> list[Message]:
        return list(getattr(self.env, "messages", []))

    def _closer(self) -> Callable[[], None] | None:
        """The env's ``close`` to run (once), wrapped to raise nothing; None when there is nothing to run: closed
        already, or gymnasium's default ``close()``, which does nothing."""
        close = getattr(self.env, "close", None)
        if self._closed or not callable(close) or getattr(type(self.env), "close", None) is _GYM_CLOSE:
            self._closed = True
            return None
        self._closed = True

        def run() -> None:
            with contextlib.suppress(Exception):
                close()

        return run

    def close(self) -> None:
        run = self._closer()
        if run is not None:  # on a daemon thread: it may hang
            threading.Thread(target=run, name="envkit-env-close", daemon=True).start()

    async def aclose(self, *, timeout_s: float) -> None:
        run = self._closer()
        if run is not None:
            with contextlib.suppress(EnvTimeout):  # a hung close() is abandoned on its thread
                await self.workers.call(run, timeout_s=timeout_s)


class CallOnly:
    """Workers that only run calls (``call(function, *args, timeout_s=)``) as in-process env workers."""

    in_process = True

    def __init__(self, workers: Any) -> None:
        self.workers = workers

    async def open(self, env_factory: Callable[[], Any], *, timeout_s: float) -> _ThreadSession:
        return _ThreadSession(self, await self.call(env_factory, timeout_s=timeout_s))

    async def call(self, function: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        return await self.workers.call(function, *args, timeout_s=timeout_s, **kwargs)

    def close(self) -> None:
        self.workers.close()
