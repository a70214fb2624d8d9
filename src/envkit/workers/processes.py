"""Process env workers: each episode's env lives in a worker process of its own, which a hung call can be killed in.

:class:`ProcessWorkers` keeps a pool of up to ``concurrency`` worker processes. An episode leases one process for its
whole life: the env is built there from the picklable factory (:class:`envkit.workers.EnvFactory`, or a class or
``functools.partial`` importable by the worker), and ``reset`` / ``step`` / ``score`` run there; the engine parses
the model's turns and renders the env's messages in its own process. When the episode ends the env is closed and the
process goes back to the pool, for the next episode and the next run.

Faults stay in their episode:

* a call past its deadline: the process is killed (SIGKILL) and replaced; the call raises
  :class:`~envkit.workers.EnvTimeout` (the episode ends with ``finish_reason="timeout"``);
* a process that dies during a call (a crash in a native extension, ``os._exit``, the OOM killer, a SIGKILL from
  outside): the call raises :class:`~envkit.workers.EnvWorkerLost` naming the process and how it died (the episode
  ends with that ``error``); the process is replaced;
* an exception raised by the env comes back as itself (type and message; :class:`RemoteEnvError` when it cannot be
  pickled), which the engine records as the episode's ``error``. The process stays in the pool.

Time: waiting for a free process does not count toward the construction deadline (only building the env does), so an
episode takes at most ``(max_turns + 3) × step_timeout_s`` of env time (construct, reset, each step, score) plus its
generation time once it holds a process, and a run of ``N`` episodes on ``C`` processes ends within
``ceil(N / C)`` such episode times (plus process start-up), however many envs hang or crash.

Processes start lazily, in parallel, when episodes need them (with ``start_method="forkserver"``, the default where
available, a server process imports envkit once and forks each worker from it: tens of milliseconds each instead of
the seconds a ``"spawn"`` worker takes to import envkit). Workers are daemonic and ignore SIGINT; :meth:`close`, the
interpreter's exit, and the parent's death (a pipe each worker watches) all end them: no orphans. Workers get the
parent's ``sys.path``, so envs defined in modules the parent can import (tests, scripts' folders) load there too.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import functools
import multiprocessing
import multiprocessing.util
import os
import pickle
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from envkit.core.messages import Message
from envkit.workers.base import (
    EnvFactory,
    EnvTimeout,
    EnvWorkerLost,
    StepOutcome,
    check_picklable_factory,
    components_outcome,
    reset_outcome,
    score_outcome,
    step_outcome,
)
from envkit.workers.threads import ThreadWorkers

W = TypeVar("W")

START_TIMEOUT_S = 120.0
"""How long a new worker may take to start (import envkit) before it counts as failed."""
CLOSE_TIMEOUT_S = 30.0
"""How long an env's ``close()`` may take in its worker before the worker is killed instead of reused."""


class RemoteEnvError(RuntimeError):
    """An exception the env raised in a worker that could not be brought back as itself (it does not pickle): its
    message reads ``TypeName: message``; ``type_name`` and ``remote_traceback`` say more."""

    def __init__(self, message: str, type_name: str = "", remote_traceback: str = "") -> None:
        super().__init__(message)
        self.type_name = type_name
        self.remote_traceback = remote_traceback


# ---- the worker side (also what a Ray actor runs) ------------------------------------------------------------------
class EnvHost:
    """Holds at most one env and serves pickled requests ``(op, argument)`` with pickled replies: ``("ok", value)``
    or ``("error", exception_or_None, type_name, message, traceback)``. Never raises."""

    def __init__(self) -> None:
        self.env: Any = None

    def serve(self, request: bytes) -> bytes:
        try:
            op, argument = pickle.loads(request)
            value = self._run(op, argument)
            return pickle.dumps(("ok", value), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as error:  # everything goes back to the caller, SystemExit included
            return _error_reply(error)

    def _run(self, op: str, argument: Any) -> Any:
        if op == "load":  # import the env's code (unpickling the factory imports its module; a spec is resolved)
            if isinstance(argument, EnvFactory):
                from envkit.registry import resolve

                resolve(argument.spec)
            return None
        if op == "open":
            self.env = None
            self.env = argument()
            return None
        if op == "close":
            env, self.env = self.env, None
            close = getattr(env, "close", None)
            if callable(close):
                close()
            return None
        if self.env is None:
            raise RuntimeError(f"no env in this worker for {op}()")
        if op == "reset":
            return reset_outcome(self.env, argument)
        if op == "step":
            return step_outcome(self.env, argument)
        if op == "score":
            return score_outcome(self.env)
        if op == "score_components":
            return components_outcome(self.env)
        if op == "transcript":
            return list(getattr(self.env, "messages", []))
        raise ValueError(f"unknown request {op!r}")


def _error_reply(error: BaseException) -> bytes:
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    name, message = type(error).__name__, str(error)
    error.__traceback__ = None
    try:  # the exception itself when it survives a round trip (custom __init__ signatures often do not)
        if not isinstance(error, Exception):  # SystemExit & co. would end the caller's run: sent as a message
            raise TypeError(name)
        pickle.loads(pickle.dumps(error))
        carried: BaseException | None = error
        return pickle.dumps(("error", carried, name, message, text), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return pickle.dumps(("error", None, name, message, text), protocol=pickle.HIGHEST_PROTOCOL)


def unpack_reply(payload: bytes) -> Any:
    """The value of a reply from :class:`EnvHost`, or raise the env's exception."""
    try:
        reply = pickle.loads(payload)
    except Exception as error:  # e.g. an exception class the parent cannot import
        raise RemoteEnvError(f"the env worker's reply could not be read: {type(error).__name__}: {error}") from None
    if reply[0] == "ok":
        return reply[1]
    _, carried, name, message, text = reply
    if carried is None:
        carried = RemoteEnvError(f"{name}: {message}", name, text)
    with contextlib.suppress(Exception):
        carried.remote_traceback = text  # type: ignore[union-attr]
    raise carried


def extend_sys_path(entries: list[str]) -> None:
    """Append the parent's ``sys.path`` entries this process lacks (so envs in tests' and scripts' modules import)."""
    for entry in entries:
        if entry not in sys.path:
            sys.path.append(entry)


def _worker_main(conn: Any, lifeline: Any, sys_path: list[str]) -> None:
    """A worker process: serve requests until the parent closes the pipe or dies."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the parent, which ends its workers
    extend_sys_path(sys_path)

    def watch() -> None:  # the parent never writes: EOF means it is gone, even while the env hangs
        with contextlib.suppress(BaseException):
            lifeline.recv_bytes()
        os._exit(0)

    threading.Thread(target=watch, name="envkit-lifeline", daemon=True).start()
    host = EnvHost()
    conn.send_bytes(pickle.dumps(("ready", os.getpid())))
    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)
        conn.send_bytes(host.serve(request))


# ---- the lease pool (shared with Ray) -----------------------------------------------------------------------------
class LeasePool(Generic[W]):
    """Up to ``concurrency`` workers, started lazily and in parallel on daemon threads, leased one per episode.

    Event-loop agnostic (it serves one ``asyncio.run`` after another): waiters are futures completed with
    ``call_soon_threadsafe``. ``start()`` builds a ready worker (blocking) and ``kill(worker)`` ends one (never
    blocking for long). A worker that is discarded is replaced at once, so capacity never shrinks.
    """

    def __init__(
        self,
        concurrency: int,
        start: Callable[[], W],
        kill: Callable[[W], None],
        healthy: Callable[[W], bool] = lambda worker: True,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.concurrency = concurrency
        self._start, self._kill, self._healthy = start, kill, healthy
        self._lock = threading.RLock()
        self._idle: list[W] = []
        self._leased: set[W] = set()
        self._starting = 0
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[W]]] = collections.deque()
        self._generation = 0  # bumped by close(): starts that finish after it are killed
        self.waiting = 0
        """Callers of :meth:`acquire` waiting for a worker now."""
        self.started = 0
        """Workers started so far."""
        self.replaced = 0
        """Workers killed or lost (hung or crashed) and replaced."""

    @property
    def workers(self) -> list[W]:
        """The ready workers, idle and leased."""
        with self._lock:
            return [*self._idle, *self._leased]

    @property
    def leased(self) -> list[W]:
        """The workers leased to episodes now."""
        with self._lock:
            return list(self._leased)

    @property
    def size(self) -> int:
        """Workers ready or starting."""
        with self._lock:
            return len(self._idle) + len(self._leased) + self._starting

    async def acquire(self) -> W:
        """A worker of this caller's own (waiting, without a deadline, for one to be free)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[W] = loop.create_future()
        with self._lock:
            self._waiters.append((loop, future))
            self._dispatch()
            self.waiting += 1
        try:
            return await future
        except BaseException:
            with self._lock, contextlib.suppress(ValueError):
                self._waiters.remove((loop, future))
            if future.done() and not future.cancelled() and future.exception() is None:
                self.release(future.result())
            raise
        finally:
            with self._lock:
                self.waiting -= 1

    def release(self, worker: W) -> None:
        """Give a healthy worker back."""
        with self._lock:
            self._leased.discard(worker)
            if getattr(worker, "generation", self._generation) != self._generation:
                self._kill(worker)
                return
            self._idle.append(worker)
            self._dispatch()

    def discard(self, worker: W) -> None:
        """Kill a worker (hung, dead, unusable) and start its replacement."""
        with self._lock:
            current = getattr(worker, "generation", self._generation) == self._generation
            known = worker in self._leased or worker in self._idle
            self._leased.discard(worker)
            with contextlib.suppress(ValueError):
                self._idle.remove(worker)
            if current and known:
                self.replaced += 1
                self._spawn()
        self._kill(worker)

    def close(self) -> None:
        """Kill every worker; waiting callers get :class:`EnvWorkerLost`. The pool starts afresh if used again."""
        with self._lock:
            self._generation += 1
            workers = [*self._idle, *self._leased]
            self._idle.clear()
            self._leased.clear()
            waiters = list(self._waiters)
            self._waiters.clear()
        for loop, future in waiters:
            self._settle(loop, future, EnvWorkerLost("the env workers were closed"))
        for worker in workers:
            self._kill(worker)

    # lock held
    def _dispatch(self) -> None:
        while self._waiters and self._idle:
            worker = self._idle.pop()
            if not self._healthy(worker):  # died while idle (killed from outside): replace it, lease another
                self.replaced += 1
                self._kill(worker)
                self._spawn()
                continue
            loop, future = self._waiters.popleft()
            self._leased.add(worker)
            if not self._settle(loop, future, worker):
                self._leased.discard(worker)
                self._idle.append(worker)
        while len(self._waiters) > self._starting and self.size < self.concurrency:
            self._spawn()

    def _spawn(self) -> None:
        self._starting += 1
        threading.Thread(target=self._start_one, args=(self._generation,), name="envkit-start", daemon=True).start()

    def _start_one(self, generation: int) -> None:
        try:
            worker = self._start()
        except BaseException as error:
            with self._lock:
                self._starting -= 1
                if generation == self._generation and self._waiters:  # one waiter fails per failed start: no loop
                    loop, future = self._waiters.popleft()
                    self._settle(loop, future, EnvWorkerLost(f"an env worker failed to start: {error}"))
                    self._dispatch()
            return
        with contextlib.suppress(AttributeError):
            worker.generation = generation  # type: ignore[attr-defined]
        with self._lock:
            self._starting -= 1
            if generation == self._generation:
                self.started += 1
                self._idle.append(worker)
                self._dispatch()
                return
        self._kill(worker)

    def _settle(self, loop: asyncio.AbstractEventLoop, future: asyncio.Future[W], outcome: Any) -> bool:
        """Complete a waiter's future in its own loop; False when that loop is gone."""

        def deliver() -> None:
            if future.done():  # the waiter gave up meanwhile
                if not isinstance(outcome, BaseException):
                    self.release(outcome)
            elif isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

        try:
            loop.call_soon_threadsafe(deliver)
        except RuntimeError:  # the loop is closed
            return False
        return True


# ---- processes -----------------------------------------------------------------------------------------------------
class _Process:
    """A worker process, its request pipe and the lifeline it watches."""

    def __init__(self, process: Any, conn: Any, lifeline: Any) -> None:
        self.process, self.conn, self.lifeline = process, conn, lifeline
        self.pid: int = process.pid
        self.generation = 0
        self._reap_lock = threading.Lock()

    def kill(self) -> None:
        with contextlib.suppress(Exception):  # multiprocessing skips a process it already reaped (no pid reuse)
            self.process.kill()
        threading.Thread(target=self.reap, name="envkit-reap", daemon=True).start()

    def reap(self, timeout: float = 5.0) -> int | None:
        """Wait for the process to end (killed or dead); its exit code."""
        with self._reap_lock:
            self.process.join(timeout)
            return self.process.exitcode

    def alive(self) -> bool:
        return self.process.is_alive()

    def __repr__(self) -> str:
        return f"env worker process {self.pid}"


def describe_exit(exitcode: int | None) -> str:
    """``killed by SIGKILL``, ``exit code 1``, …"""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-exitcode).name}"
        return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


_POOLS: weakref.WeakSet[Any] = weakref.WeakSet()


def _close_all() -> None:  # at exit, before multiprocessing's own handler (atexit runs last-registered first)
    for pool in list(_POOLS):
        with contextlib.suppress(Exception):
            pool.close()


atexit.register(_close_all)


class ProcessWorkers:
    """Env workers in processes: each episode leases a worker process for its whole life (see the module docstring).

    Args:
        concurrency: Worker processes at most, i.e. episodes alive at once (the rest wait for a free process).
        start_method: ``"forkserver"`` (default where available: workers fork from a server that imported envkit)
            or ``"spawn"`` (each worker starts a fresh interpreter).
        start_timeout_s: How long a new worker may take to start before the episode waiting for it fails.
        preload: More modules for the fork server to import once (it imports envkit and torch, which transformers
            needs to build tool schemas), e.g. your env's heavy dependencies: each worker then starts with them.
    """

    in_process = False
    kind = "processes"

    def __init__(
        self,
        concurrency: int = 32,
        *,
        start_method: str | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        preload: list[str] | None = None,
    ) -> None:
        methods = multiprocessing.get_all_start_methods()
        if start_method is None:
            start_method = "forkserver" if "forkserver" in methods else "spawn"
        if start_method not in ("spawn", "forkserver") or start_method not in methods:
            raise ValueError(
                f"start_method must be 'spawn' or 'forkserver' (available here: {', '.join(methods)}); "
                f"got {start_method!r}"
            )
        self.start_method = start_method
        self.start_timeout_s = start_timeout_s
        self._context = multiprocessing.get_context(start_method)
        if start_method == "forkserver":  # torch too: transformers imports it to build any tool's JSON schema
            self._context.set_forkserver_preload(["envkit.workers.processes", "torch", *(preload or [])])
        start = functools.partial(_start_process, self._context, start_timeout_s)  # no reference to self
        self.pool: LeasePool[_Process] = LeasePool(concurrency, start, _Process.kill, _Process.alive)
        self.concurrency = concurrency
        self._threads = ThreadWorkers(concurrency)
        _POOLS.add(self)
        weakref.finalize(self, self.pool.close)  # dropped without close(): its processes end with it

    @property
    def pids(self) -> list[int]:
        """Process ids of the ready workers (idle and leased)."""
        return [worker.pid for worker in self.pool.workers]

    @property
    def waiting(self) -> int:
        """Episodes waiting for a free worker now (the engine's batcher does not wait for them)."""
        return self.pool.waiting

    async def open(self, env_factory: Callable[[], Any], *, timeout_s: float) -> ProcessSession:
        """Lease a worker (waiting for a free one, without a deadline) and build the env there within ``timeout_s``."""
        check_picklable_factory(env_factory, self.kind)
        worker = await self.pool.acquire()
        session = ProcessSession(self.pool, worker)
        try:
            await session.load(env_factory, timeout_s=self.start_timeout_s)
            await session.request("open", env_factory, timeout_s=timeout_s, what="construction")
        except BaseException:
            session.close()
            raise
        return session

    async def call(self, function: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` in this process off the event loop (as :class:`ThreadWorkers` does)."""
        return await self._threads.call(function, *args, timeout_s=timeout_s, **kwargs)

    def close(self) -> None:
        """Kill every worker process (calls still running are lost); a later :meth:`open` starts new ones."""
        self.pool.close()
        self._threads.close()


def _start_process(context: Any, start_timeout_s: float) -> _Process:
    """Start a worker process and wait until it is ready to serve (blocking: runs on a pool thread)."""
    conn, child_conn = context.Pipe()
    lifeline_reader, lifeline = context.Pipe(duplex=False)
    process = context.Process(
        target=_worker_main,
        args=(child_conn, lifeline_reader, list(sys.path)),
        name="envkit-env-worker",
        daemon=True,
    )
    process.start()
    child_conn.close()
    lifeline_reader.close()
    worker = _Process(process, conn, lifeline)
    try:
        if not conn.poll(start_timeout_s):
            raise RuntimeError(f"worker process {process.pid} did not start within {start_timeout_s:g}s")
        pickle.loads(conn.recv_bytes())  # ("ready", pid)
    except (EOFError, OSError):
        raise RuntimeError(
            f"worker process {process.pid} exited while starting ({describe_exit(worker.reap(1.0))})"
        ) from None
    except BaseException:
        worker.kill()
        raise
    return worker


class RemoteSession:
    """One episode's env in a leased worker of another process: each call is one :meth:`request`."""

    async def request(self, op: str, argument: Any, *, timeout_s: float, what: str) -> Any:
        raise NotImplementedError

    async def load(self, env_factory: Any, *, timeout_s: float) -> None:
        """Import the env's code in the worker (once per worker in effect: later loads find it imported). Part of
        starting a worker, so not under the construction deadline: a worker stuck longer is lost, not timed out."""
        try:
            await self.request("load", env_factory, timeout_s=timeout_s, what="loading the env's code")
        except EnvTimeout as error:
            raise EnvWorkerLost(str(error)) from None

    async def reset(self, seed: int, *, timeout_s: float) -> tuple[list[Message], dict[str, Any], list[Any] | None]:
        return await self.request("reset", seed, timeout_s=timeout_s, what="reset()")

    async def step(self, action: Message, *, timeout_s: float) -> StepOutcome:
        return await self.request("step", action, timeout_s=timeout_s, what="step()")

    async def score(self, *, timeout_s: float) -> float:
        return float(await self.request("score", None, timeout_s=timeout_s, what="score()"))

    async def score_components(self, *, timeout_s: float) -> dict[str, float]:
        """``env.score_components()``, checked (``{}`` for an env without them)."""
        return await self.request("score_components", None, timeout_s=timeout_s, what="score_components()")

    async def transcript(self, *, timeout_s: float) -> list[Message]:
        return await self.request("transcript", None, timeout_s=timeout_s, what="transcript")


class ProcessSession(RemoteSession):
    """One episode's env in a leased worker process."""

    def __init__(self, pool: LeasePool[_Process], worker: _Process) -> None:
        self.pool = pool
        self.worker: _Process | None = worker

    async def request(self, op: str, argument: Any, *, timeout_s: float, what: str) -> Any:
        """Send one request to the worker and wait for its reply, at most ``timeout_s`` seconds."""
        worker = self.worker
        if worker is None:
            raise EnvWorkerLost("this episode's env worker is gone (an earlier call failed or the session closed)")
        payload = pickle.dumps((op, argument), protocol=pickle.HIGHEST_PROTOCOL)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[tuple[bool, Any]] = loop.create_future()

        def settle(outcome: tuple[bool, Any]) -> None:
            if not future.done():
                future.set_result(outcome)

        def exchange() -> None:  # on its own thread: a hung env blocks only this thread, until the kill
            try:
                worker.conn.send_bytes(payload)
                outcome: tuple[bool, Any] = (True, worker.conn.recv_bytes())
            except (EOFError, OSError):
                outcome = (False, worker.reap(2.0))
            with contextlib.suppress(RuntimeError):  # the loop is gone: the caller gave up long ago
                loop.call_soon_threadsafe(settle, outcome)

        threading.Thread(target=exchange, name="envkit-env-call", daemon=True).start()
        try:
            ok, value = await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            self._lose()
            raise EnvTimeout(
                f"{what} took longer than {timeout_s:g}s (env worker process {worker.pid} killed and replaced)"
            ) from None
        except BaseException:  # cancelled mid-call: the worker's state is unknown
            self._lose()
            raise
        if not ok:
            self._lose()
            raise EnvWorkerLost(f"env worker process {worker.pid} died during {what} ({describe_exit(value)})")
        return unpack_reply(value)

    def _lose(self) -> None:
        worker, self.worker = self.worker, None
        if worker is not None:
            self.pool.discard(worker)

    def close(self) -> None:
        """Close the env in its worker and give the worker back (on a thread: never blocks)."""
        worker, self.worker = self.worker, None
        if worker is None:
            return

        def recycle() -> None:
            try:
                worker.conn.send_bytes(pickle.dumps(("close", None)))
                if worker.conn.poll(CLOSE_TIMEOUT_S):
                    worker.conn.recv_bytes()  # an error in the env's close() is ignored
                    self.pool.release(worker)
                    return
            except (EOFError, OSError):
                pass
            self.pool.discard(worker)

        threading.Thread(target=recycle, name="envkit-env-close", daemon=True).start()
