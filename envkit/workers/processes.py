"""Process env workers: envs live in a few worker processes, each hosting many episodes' envs (sessions), where a
hung call can be killed.

:class:`ProcessWorkers` keeps up to ``processes`` worker processes (default: ``min(concurrency, 2 × cores)``) hosting
at most ``concurrency`` envs in all (:class:`~envkit.workers.pool.MuxPool`). An episode's env is built on one worker
from the picklable factory (:class:`envkit.workers.EnvFactory`, or a class or ``functools.partial`` importable by the
worker), and ``reset`` / ``step`` / ``score`` are routed there; each runs on a thread of the worker's own, so a slow
step of one episode does not hold up another's. The engine parses the model's turns and renders the env's messages in
its own process. A step sends back only the messages the engine does not have yet (its bytes do not grow with the
history). When the episode ends the env is closed and its slot goes back to the pool, for the next episode and run.

In this process, each worker has one reader and one writer thread (no thread per call): calls are multiplexed over
the worker's pipe by request id.

Faults stay with the episodes they touch:

* a call past its deadline: the call raises :class:`~envkit.workers.EnvTimeout` (the episode ends with
  ``finish_reason="timeout"``) and its worker is *retired*: a replacement starts at once, the retired worker takes no
  new env, serves its other episodes to their end, then is killed (SIGKILL: the only way to stop a hung call). A
  second hang on a retired worker, or more retired workers than ``processes``, kills it at once, ending the episodes
  it still hosts with :class:`~envkit.workers.EnvWorkerLost` saying so;
* a process that dies (a crash in a native extension, ``os._exit``, the OOM killer, a SIGKILL from outside): each
  episode it hosted ends with :class:`~envkit.workers.EnvWorkerLost` naming the process and how it died, at its
  pending or next call; the process is replaced;
* an exception raised by the env comes back as itself (type and message; :class:`RemoteEnvError` when it cannot be
  pickled), which the engine records as the episode's ``error``. The process stays in the pool.

``pool.timeouts`` counts hung calls, ``pool.replaced`` the workers retired, killed or lost, ``pool.lost_sessions`` the
episodes that ended because their worker went.

Time: waiting for a free slot does not count toward the construction deadline (only building the env does), so an
episode takes at most ``(max_turns + 3) × step_timeout_s`` of env time (construct, reset, each step, score) plus its
generation time once it holds a slot.

Processes start lazily, in parallel, when episodes need them (with ``start_method="forkserver"``, the default where
available, a server process imports envkit once and forks each worker from it: tens of milliseconds each instead of
the seconds a ``"spawn"`` worker takes to import envkit). Workers are daemonic and ignore SIGINT. Each leads a
process group of its own (what an env starts goes with it) and is a child of :mod:`envkit.util.children`'s kind:
:meth:`close`, the interpreter's exit, and the parent's death however it died (a lifeline each worker watches; with
``"forkserver"`` also the kernel's parent-death signal, which reaches a worker stuck in a C call that holds the GIL)
all end it and its group: no orphans. Workers get the parent's ``sys.path``, so envs defined in modules the parent
can import (tests, scripts' folders) load there too, and its process state as it is when each worker starts
(:class:`~envkit.workers.inherit.ParentState`: environment variables, umask, resource limits, CPU affinity, niceness;
not the fork server's, which are as they were when the server started).

``limits`` (:class:`~envkit.util.children.ResourceLimits`) puts kernel limits on each worker: CPU seconds past the
start of its latest call (``RLIMIT_CPU``: a call that spins past them kills its worker with SIGXCPU, even inside a C
call holding the GIL) and address space (``RLIMIT_AS``: an allocation past it raises ``MemoryError`` in the env).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import multiprocessing
import multiprocessing.util
import os
import pickle
import queue
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from envkit.util import children
from envkit.util.children import ResourceLimits
from envkit.workers.base import EnvWorkerLost
from envkit.workers.host import EnvHost, RemoteEnvError, extend_sys_path, unpack_reply
from envkit.workers.inherit import ParentState, match_torch_threads
from envkit.workers.pool import CLOSE_TIMEOUT_S, START_TIMEOUT_S, MuxPool, RemoteSession, RemoteWorkers
from envkit.workers.threads import DaemonPool

__all__ = [
    "CLOSE_TIMEOUT_S",
    "START_TIMEOUT_S",
    "EnvHost",
    "ProcessSession",
    "ProcessWorkers",
    "RemoteEnvError",
    "default_workers",
    "describe_exit",
    "unpack_reply",
]

_HEADER = 8  # bytes of request id before each request and reply; id 0: nobody waits for the reply


def default_workers(concurrency: int, cores: int | None = None) -> int:
    """Worker processes for ``concurrency`` envs when not given: at most two per core (at least 4) and never more
    than envs."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(concurrency, max(4, 2 * cores)))


# ---- the worker side -----------------------------------------------------------------------------------------------
def _worker_main(
    conn: Any,
    lifeline: Any,
    sys_path: list[str],
    forked_by_server: bool = False,
    limits: ResourceLimits | None = None,
    parent: ParentState | None = None,
) -> None:
    """A worker process: serve requests, each on a thread of its own, until the parent closes the pipe or dies."""
    # Ctrl-C goes to the parent, which ends its workers. A handler, not SIG_IGN: an ignored signal stays ignored
    # across exec, so every process an env started would ignore SIGINT too.
    signal.signal(signal.SIGINT, _ignore_signal)
    children.own_group()
    if forked_by_server:  # the fork server's one thread lives as long as the parent: its end is the parent's
        _release_fork_server()
        children.set_parent_death_signal(signal.SIGKILL)
        _reseed_global_generators()
    if parent is not None:
        server = ParentState.capture() if forked_by_server else None  # the fork server's, before it is replaced
        parent.adopt()
        if server is not None:
            match_torch_threads(server)
    if limits is not None:
        limits.apply()
    extend_sys_path(sys_path)
    # the parent never writes: EOF means it is gone, even while an env hangs
    children.watch_lifeline(lifeline.fileno(), children.end_own_group)
    host, threads, sending = EnvHost(), DaemonPool(), threading.Lock()
    conn.send_bytes(pickle.dumps(("ready", os.getpid())))

    def reply(header: bytes, payload: bytes) -> None:
        if header == bytes(_HEADER):
            return
        with sending:
            try:
                conn.send_bytes(header + payload)
            except OSError:
                os._exit(0)

    while True:
        try:
            request = conn.recv_bytes()
        except (EOFError, OSError):
            os._exit(0)
        header, body = request[:_HEADER], request[_HEADER:]
        if limits is not None:
            limits.renew_cpu()
        threads.submit(functools.partial(host.serve, body), functools.partial(reply, header))


def _ignore_signal(signum: int, frame: Any) -> None:
    """A signal handler that does nothing."""


def _reseed_global_generators() -> None:
    """Give numpy's and torch's global generators fresh seeds, as a spawned worker's get: a forked worker inherits
    the fork server's, so every worker of every pool would draw the same numbers (Python's ``random`` is reseeded at
    fork by Python itself). Envs should draw from their own seeded generator (``self.np_random``); this keeps those
    that do not from drawing the same "random" numbers in every worker."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()


def _release_fork_server() -> None:
    """Close this worker's copy of the fork server's "alive" pipe. The fork server runs until every holder of that
    pipe's write end has exited, and multiprocessing hands one to each process it forks: a worker stuck in a C call
    would keep the fork server, and so its own parent-death signal, from ever firing. Without it the fork server
    exits with the parent (a worker that starts processes of its own the forkserver way starts its own server)."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if isinstance(fd, int):
        server._forkserver_alive_fd = server._forkserver_address = None  # type: ignore[union-attr]
        with contextlib.suppress(OSError):
            os.close(fd)


# ---- this process's side -------------------------------------------------------------------------------------------
class _Process:
    """A worker process: its pipe, the lifeline it watches, and the calls in flight on it (by request id). One
    writer thread sends requests; one reader thread delivers replies and, at EOF, fails the calls still in flight."""

    def __init__(self, process: Any, conn: Any, lifeline: Any, lost: Callable[[Any], None]) -> None:
        self.process, self.conn, self.lifeline = process, conn, lifeline
        self.pid: int = process.pid
        self.generation = 0
        self.fate: str | None = None
        """Why this worker ended (None while it serves)."""
        self.loaded: set[bytes] = set()
        self.placement = {"pid": self.pid}
        self._lost = lost
        self._lock = threading.Lock()
        self._reap_lock = threading.Lock()
        self._pending: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Future[bytes], str]] = {}
        self._ids = itertools.count(1)
        self._outbox: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        threading.Thread(target=self._write, name="envkit-worker-send", daemon=True).start()
        threading.Thread(target=self._read, name="envkit-worker-receive", daemon=True).start()

    def submit(self, loop: asyncio.AbstractEventLoop, payload: bytes, what: str) -> tuple[int, asyncio.Future[bytes]]:
        """Send a request; its id and the future its reply (or the worker's death) settles."""
        future: asyncio.Future[bytes] = loop.create_future()
        with self._lock:
            if self.fate is not None:
                future.set_exception(EnvWorkerLost(f"{self} was lost before {what} ({self.fate})"))
                return 0, future
            request = next(self._ids)
            self._pending[request] = (loop, future, what)
        self._outbox.put(request.to_bytes(_HEADER, "big") + payload)
        return request, future

    def post(self, payload: bytes) -> None:
        """Send a request whose reply nobody waits for."""
        self._outbox.put(bytes(_HEADER) + payload)

    def forget(self, request: int) -> None:
        """Drop a call's future (its reply, if it ever comes, is ignored)."""
        with self._lock:
            self._pending.pop(request, None)

    def _write(self) -> None:
        while True:
            item = self._outbox.get()
            if item is None:
                return
            try:
                self.conn.send_bytes(item)
            except (OSError, ValueError):
                return

    def _read(self) -> None:
        while True:
            try:
                data = self.conn.recv_bytes()
            except (EOFError, OSError):
                break
            with self._lock:
                entry = self._pending.pop(int.from_bytes(data[:_HEADER], "big"), None)
            if entry is not None:
                _deliver(entry[0], entry[1], data[_HEADER:])
        self._end_group()
        how = describe_exit(self.reap(5.0))
        with self._lock:
            if self.fate is None:
                self.fate = how
            elif how not in self.fate:
                self.fate = f"{self.fate}; {how}"
            pending, self._pending = self._pending, {}
        for loop, future, what in pending.values():
            _deliver(loop, future, EnvWorkerLost(f"{self} died during {what} ({self.fate})"))
        self._outbox.put(None)
        self._lost(self)

    def kill(self) -> None:
        """SIGKILL the worker and its process group (what its envs started), at once; reaped on a thread."""
        if self._reap_lock.acquire(blocking=False):  # held: it is being reaped, so it is dead or dying already
            try:
                if self.process.exitcode is None:  # not seen to end: its pid is still its group's id
                    children.kill_group(self.pid)
            finally:
                self._reap_lock.release()
        with contextlib.suppress(Exception):  # multiprocessing skips a process it already reaped (no pid reuse)
            self.process.kill()
        threading.Thread(target=self.reap, name="envkit-reap", daemon=True).start()

    def _end_group(self) -> None:
        """SIGKILL the worker's process group (what its envs started: a game server, a sandbox) once its pipe closed:
        a worker that died on its own (a crash, the OOM killer, SIGXCPU) leaves the rest of its group running.

        A forked worker is the fork server's child, reaped there as it dies, so its pid cannot be checked here. The
        group id stays the worker's while any member lives (Linux does not hand out a pid that still names a group),
        so the signal reaches only the worker's group; with no member left it finds nothing, short of the pid being
        reused, in the milliseconds since, by a process that made a group of its own."""
        children.kill_group(self.pid)

    def reap(self, timeout: float = 5.0) -> int | None:
        """Wait for the process to end (killed or dead); its exit code."""
        with self._reap_lock:
            self.process.join(timeout)
            return self.process.exitcode

    def alive(self) -> bool:
        return self.fate is None and self.process.is_alive()

    def __repr__(self) -> str:
        return f"env worker process {self.pid}"


def _deliver(loop: asyncio.AbstractEventLoop, future: asyncio.Future[Any], outcome: Any) -> None:
    def settle() -> None:
        if not future.done():
            (future.set_exception if isinstance(outcome, BaseException) else future.set_result)(outcome)

    with contextlib.suppress(RuntimeError):  # the loop is gone: the caller gave up long ago
        loop.call_soon_threadsafe(settle)


def describe_exit(exitcode: int | None) -> str:
    """``killed by SIGKILL``, ``exit code 1``, …"""
    if exitcode is None:
        return "exit status unknown"
    if exitcode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-exitcode).name}"
        return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class ProcessSession(RemoteSession):
    """One episode's env on a worker process hosting many."""

    async def _exchange(self, worker: _Process, payload: bytes, timeout_s: float, what: str) -> bytes:
        loop = asyncio.get_running_loop()
        request, future = worker.submit(loop, payload, what)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            worker.forget(request)
            raise self._timed_out(worker, timeout_s, what) from None
        except EnvWorkerLost:
            self._lost()
            raise
        except BaseException:  # cancelled mid-call: this env's state is unknown; the worker's other envs are fine
            worker.forget(request)
            self.worker = None
            raise

    def _post(self, worker: _Process, payload: bytes) -> None:
        worker.post(payload)


class ProcessWorkers(RemoteWorkers[ProcessSession]):
    """Env workers in processes, each hosting many envs (see the module docstring). ``open``, ``prepare``, ``call``,
    ``close``, ``pids`` and ``waiting`` are :class:`~envkit.workers.pool.RemoteWorkers`'.

    Args:
        concurrency: Envs alive at once, i.e. episodes past construction (the rest wait for a free slot).
        processes: Worker processes at most (default :func:`default_workers`: ``min(concurrency, 2 × cores)``, at
            least 4); each hosts at most ``ceil(concurrency / processes)`` envs.
        start_method: ``"forkserver"`` (default where available: workers fork from a server that imported envkit)
            or ``"spawn"`` (each worker starts a fresh interpreter).
        start_timeout_s: How long a new worker may take to start before the episode waiting for it fails.
        preload: More modules for the fork server to import once (it imports envkit and torch, which transformers
            needs to build tool schemas), e.g. your env's heavy dependencies: each worker then starts with them.
        limits: Kernel limits on each worker process (CPU seconds per call, address space); None: none.
    """

    kind = "processes"
    session_class = ProcessSession

    def __init__(
        self,
        concurrency: int = 32,
        *,
        processes: int | None = None,
        start_method: str | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
        preload: list[str] | None = None,
        limits: ResourceLimits | None = None,
    ) -> None:
        methods = multiprocessing.get_all_start_methods()
        if start_method is None:
            start_method = "forkserver" if "forkserver" in methods else "spawn"
        if start_method not in ("spawn", "forkserver") or start_method not in methods:
            raise ValueError(
                f"start_method must be 'spawn' or 'forkserver' (available here: {', '.join(methods)}); "
                f"got {start_method!r}"
            )
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if processes is not None and processes < 1:
            raise ValueError("processes must be at least 1")
        self.start_method = start_method
        self.limits = limits
        self._context = multiprocessing.get_context(start_method)
        if start_method == "forkserver":  # torch too: transformers imports it to build any tool's JSON schema
            self._context.set_forkserver_preload(["envkit.workers.processes", "torch", *(preload or [])])
        self.processes = processes or default_workers(concurrency)
        lost = _Lost()
        start = functools.partial(_start_process, self._context, start_timeout_s, lost, limits)  # no ref to self
        pool: MuxPool[_Process] = MuxPool(self.processes, concurrency, start, _Process.kill, _Process.alive)
        lost.pool = weakref.ref(pool)
        super().__init__(pool, concurrency, start_timeout_s)


class _Lost:
    """Tells the pool (held weakly) that a worker died; picklable-free and without a reference to the workers."""

    pool: Any = None

    def __call__(self, worker: _Process) -> None:
        pool = self.pool() if self.pool is not None else None
        if pool is not None:
            pool.discard(worker)


def _start_process(
    context: Any, start_timeout_s: float, lost: Callable[[Any], None], limits: ResourceLimits | None = None
) -> _Process:
    """Start a worker process and wait until it is ready to serve (blocking: runs on a pool thread)."""
    conn, child_conn = context.Pipe()
    lifeline_reader, lifeline = context.Pipe(duplex=False)
    forked_by_server = context.get_start_method() == "forkserver"
    process = context.Process(
        target=_worker_main,
        args=(child_conn, lifeline_reader, list(sys.path), forked_by_server, limits, ParentState.capture()),
        name="envkit-env-worker",
        daemon=True,
    )
    process.start()
    child_conn.close()
    lifeline_reader.close()
    try:
        if not conn.poll(start_timeout_s):
            raise RuntimeError(f"worker process {process.pid} did not start within {start_timeout_s:g}s")
        pickle.loads(conn.recv_bytes())  # ("ready", pid)
    except BaseException as error:
        if isinstance(error, (EOFError, OSError)):
            process.join(1.0)
            error = RuntimeError(
                f"worker process {process.pid} exited while starting ({describe_exit(process.exitcode)})"
            )
        with contextlib.suppress(Exception):
            process.kill()
            process.join(5.0)
            process.close()  # its sentinel's descriptor
        for end in (conn, lifeline):  # each failed start would otherwise keep these descriptors open for good
            end.close()
        raise error from None
    return _Process(process, conn, lifeline, lost)
