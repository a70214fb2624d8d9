"""Env workers: where an episode's env lives and its calls (construct, reset, step, score) run, off the event loop.

The rollout engine talks to an env only through an :class:`EnvSession` that a pool of :class:`EnvWorkers` opened for
one episode: ``reset``, ``step``, ``score``, ``transcript`` and ``close``, each ``async`` and bounded by a deadline
counted from when the call was made. Past its deadline a call raises :class:`EnvTimeout` in the caller at once and
the session is unusable (the episode ends with ``finish_reason="timeout"``); a worker that dies raises
:class:`EnvWorkerLost`. Capacity never shrinks: a hung worker is abandoned or killed and replaced.

Kinds (:func:`make_workers`):

* ``"threads"`` (:class:`ThreadWorkers`, the default) — the env in this process, each call on its own daemon thread.
  A hung call cannot be killed: it is abandoned (daemon threads never keep the interpreter from exiting).
* ``"processes"`` and ``"ray"`` — the env in another process (see :mod:`envkit.process_workers` and
  :mod:`envkit.ray_workers`); the env is built there from a picklable factory (:class:`EnvFactory`).
"""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import queue
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from envkit.messages import Message


def _gym_close() -> Any:
    import gymnasium

    return gymnasium.Env.close


_GYM_CLOSE = _gym_close()
WORKER_KINDS = ("threads", "processes", "ray")


class EnvTimeout(TimeoutError):
    """An env call did not finish before its deadline."""


class EnvExited(RuntimeError):
    """An env call raised ``SystemExit`` (or another ``BaseException`` that is not an ``Exception``): it ends the
    episode, not the run."""


class EnvWorkerLost(RuntimeError):
    """The worker holding an env died (a crash in a native extension, killed by the OS, …) during a call."""


@dataclass
class StepOutcome:
    """What one ``step`` gave back, as plain data (it may cross a process boundary)."""

    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    history: list[Message]
    """The env's transcript before ``observation`` (what the chat template renders the observation after)."""


@dataclass(frozen=True)
class EnvFactory:
    """A picklable env factory: ``envkit.make(spec, **config)``. What process and Ray workers build envs from.

    ``spec`` is anything :func:`envkit.make` accepts: a registered name, ``"package.module:Class"`` or
    ``"path/to/file.py:Class"``.
    """

    spec: str
    config: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> Any:
        import envkit

        return envkit.make(self.spec, **self.config)


@runtime_checkable
class EnvSession(Protocol):
    """One episode's env, living in a worker."""

    async def reset(self, seed: int, *, timeout_s: float) -> tuple[list[Message], dict[str, Any], list[Any] | None]:
        """``env.reset(seed=seed)``: the opening messages, the reset info, and the env's tool schemas (or None)."""
        ...

    async def step(self, action: Message, *, timeout_s: float) -> StepOutcome:
        """``env.step(action)``."""
        ...

    async def score(self, *, timeout_s: float) -> float:
        """``env.score()``."""
        ...

    async def transcript(self, *, timeout_s: float) -> list[Message]:
        """The env's full transcript (``env.messages``)."""
        ...

    def close(self) -> None:
        """Release the env and give its worker back (never blocks)."""
        ...


@runtime_checkable
class EnvWorkers(Protocol):
    """A pool of workers that hold envs. ``in_process`` is True when envs live in this process (the engine may then
    hand the env object itself to :meth:`call`)."""

    in_process: bool

    async def open(self, env_factory: Callable[[], Any], *, timeout_s: float) -> EnvSession:
        """Build an env on a worker (waiting for a free one); raises :class:`EnvTimeout` if building takes longer."""
        ...

    async def call(self, function: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` in this process off the event loop (rendering, parsing), with a deadline."""
        ...

    def close(self) -> None:
        """Release every worker (calls still running are abandoned)."""
        ...


def check_picklable_factory(env_factory: Any, kind: str) -> None:
    """Raise ValueError (one line) when ``env_factory`` cannot be sent to another process (a lambda, a local class)."""
    try:
        pickle.dumps(env_factory)
    except Exception:
        name = getattr(env_factory, "__qualname__", None) or getattr(env_factory, "__name__", None)
        name = name.rsplit(".", 1)[-1] if name and name.endswith("<lambda>") else name
        raise ValueError(
            f"env_workers={kind!r} builds envs in other processes from a picklable factory: pass "
            "envkit.workers.EnvFactory('SPEC', {...config}) (or functools.partial(envkit.make, 'SPEC', **config)); "
            f"got {name or type(env_factory).__name__}"
        ) from None


def step_outcome(env: Any, action: Message) -> StepOutcome:
    """Run ``env.step(action)`` and package its result (shared by every kind of worker)."""
    observation, reward, terminated, truncated, info = env.step(action)
    observation = list(observation)
    messages = list(getattr(env, "messages", []))
    history = messages[: len(messages) - len(observation)]
    return StepOutcome(observation, float(reward), bool(terminated), bool(truncated), dict(info), history)


def reset_outcome(env: Any, seed: int) -> tuple[list[Message], dict[str, Any], list[Any] | None]:
    """Run ``env.reset(seed=seed)`` and return the opening messages, the info and the env's tools."""
    opening, info = env.reset(seed=seed)
    return list(opening), dict(info), list(getattr(env, "tools", None) or []) or None


class _DaemonPool:
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


class ThreadWorkers:
    """Each env in this process; each call on a daemon thread, at most ``concurrency`` calls at once.

    Threads are reused (:class:`_DaemonPool`), and a hung call is abandoned at its deadline: its slot is released
    when the deadline passes, not when the thread ends, and the pool starts another thread for the next call, so
    capacity never shrinks. Waiting for a slot counts toward a call's deadline, so a run of hung envs ends within its
    timeout, not timeout × rounds.
    """

    in_process = True

    def __init__(self, concurrency: int = 32) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency
        # One per event loop (each run() has its own), dropped with its loop.
        self._slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._pool = _DaemonPool()
        self.abandoned = 0
        """Calls given up at their deadline whose threads may still be running."""

    async def open(self, env_factory: Callable[[], Any], *, timeout_s: float) -> _ThreadSession:
        """Build the env on a worker thread."""
        return _ThreadSession(self, await self.call(env_factory, timeout_s=timeout_s))

    async def call(self, function: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """Run ``function`` on a daemon thread; raise :class:`EnvTimeout` ``timeout_s`` seconds after the call."""
        loop = asyncio.get_running_loop()
        slots = self._slots.get(loop)
        if slots is None:
            slots = self._slots[loop] = asyncio.Semaphore(self.concurrency)
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

            def compute() -> tuple[Any, bool]:
                try:
                    return function(*args, **kwargs), False
                except Exception as error:  # handed to the caller
                    return error, True
                except BaseException as error:  # an env's sys.exit(): raised in the caller's task it would end the run
                    return EnvExited(f"{type(error).__name__}: {error}"), True

            def deliver(result: tuple[Any, bool]) -> None:
                with contextlib.suppress(RuntimeError):  # the loop is gone: the caller gave up long ago
                    loop.call_soon_threadsafe(settle, *result)

            self._pool.submit(compute, deliver)
            try:
                return await future
            except asyncio.CancelledError:
                self.abandoned += 1
                raise

    def close(self) -> None:
        """Nothing to release: idle threads exit on their own, and abandoned ones are daemons."""
        self._slots.clear()


class _ThreadSession:
    """An env object in this process; its calls run on :class:`ThreadWorkers` threads."""

    def __init__(self, workers: Any, env: Any) -> None:
        self.workers, self.env = workers, env

    async def reset(self, seed: int, *, timeout_s: float) -> tuple[list[Message], dict[str, Any], list[Any] | None]:
        return await self.workers.call(reset_outcome, self.env, seed, timeout_s=timeout_s)

    async def step(self, action: Message, *, timeout_s: float) -> StepOutcome:
        return await self.workers.call(step_outcome, self.env, action, timeout_s=timeout_s)

    async def score(self, *, timeout_s: float) -> float:
        return float(await self.workers.call(self.env.score, timeout_s=timeout_s))

    async def transcript(self, *, timeout_s: float) -> list[Message]:
        return list(getattr(self.env, "messages", []))

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        # gymnasium's default close() does nothing: skip it. Any other runs on a daemon thread (it may hang).
        if callable(close) and getattr(type(self.env), "close", None) is not _GYM_CLOSE:

            def run() -> None:
                with contextlib.suppress(Exception):
                    close()

            threading.Thread(target=run, name="envkit-env-close", daemon=True).start()


def make_workers(kind: str | EnvWorkers, *, concurrency: int = 32, **options: Any) -> EnvWorkers:
    """The env workers for ``kind``: ``"threads"``, ``"processes"`` or ``"ray"`` (or an :class:`EnvWorkers`, as
    is). ``options`` go to the kind's constructor (e.g. ``address=`` for Ray). Raises ValueError for an unknown kind
    and ImportError, naming the extra to install, when the kind's package is missing."""
    if not isinstance(kind, str):
        return kind if hasattr(kind, "open") else _CallOnly(kind)
    if kind == "threads":
        return ThreadWorkers(concurrency)
    if kind == "processes":
        from envkit.process_workers import ProcessWorkers

        return ProcessWorkers(concurrency, **options)
    if kind == "ray":
        from envkit.ray_workers import RayWorkers

        return RayWorkers(concurrency, **options)
    raise ValueError(f"unknown env workers {kind!r}: choose one of {', '.join(WORKER_KINDS)}")


def workers_from_flags(kind: str, concurrency: int = 32, ray_address: str | None = None) -> str | EnvWorkers:
    """What ``RolloutEngine(env_workers=...)`` takes for ``--env-workers KIND [--ray-address ADDR]``: ``"threads"``
    as is, else a started pool. Raises ValueError (an unknown kind, ``--ray-address`` without Ray) or ImportError
    (Ray is not installed), each one line; Ray's own errors (an unreachable address) pass through."""
    if kind not in WORKER_KINDS:
        raise ValueError(f"--env-workers must be one of {', '.join(WORKER_KINDS)}; got {kind!r}")
    if ray_address and kind != "ray":
        raise ValueError(f"--ray-address goes with --env-workers ray, not {kind}")
    if kind == "threads":
        return kind
    return make_workers(kind, concurrency=concurrency, **({"address": ray_address} if kind == "ray" else {}))


class _CallOnly:
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
