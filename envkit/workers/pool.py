"""The caller's side of process and Ray env workers: a pool of workers that each host many env sessions
(:class:`MuxPool`), a session that routes its calls to the worker holding its env (:class:`RemoteSession`), and
the env workers built on both (:class:`RemoteWorkers`, what process and Ray workers share).

A session holds one of the pool's ``sessions_max`` slots from :meth:`MuxPool.acquire` to its
:meth:`~RemoteSession.close`, on one worker (at most ``ceil(sessions_max / workers_max)`` sessions a worker). New
sessions go to an empty worker while the pool can still start one, then to the least-loaded worker.

Faults end only the episodes they must. A call that hangs past its deadline ends its own episode
(:class:`~envkit.workers.base.EnvTimeout`) and *retires* its worker: a replacement starts at once, the retired worker
takes no new session and serves its other sessions to their end, then is killed with its hung call (a second hang on
it, or more retired workers than ``workers_max``, kills it at once). A worker that dies (or is killed) ends the
sessions it hosted, and only those, with :class:`~envkit.workers.base.EnvWorkerLost` at their pending or next call,
and is replaced. :attr:`MuxPool.timeouts`, :attr:`MuxPool.replaced` and :attr:`MuxPool.lost_sessions` count them.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import math
import pickle
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from envkit.core.env import Ending
from envkit.core.messages import Message
from envkit.workers.base import (
    EnvTimeout,
    EnvWorkerLost,
    HistoryMirror,
    StepDelta,
    StepOutcome,
    check_picklable_factory,
)
from envkit.workers.host import unpack_reply
from envkit.workers.threads import ThreadWorkers

W = TypeVar("W")

START_TIMEOUT_S = 120.0
"""How long a new worker may take to start (import envkit) before it counts as failed."""
CLOSE_TIMEOUT_S = 30.0
"""How long an env's ``close()`` may take in its worker (kept for callers; a close never blocks the caller)."""


class MuxPool(Generic[W]):
    """Up to ``workers_max`` workers, started lazily and in parallel on daemon threads, hosting at most
    ``sessions_max`` sessions in all (see the module docstring).

    Event-loop agnostic (it serves one ``asyncio.run`` after another): waiters are futures completed with
    ``call_soon_threadsafe``. ``start()`` builds a ready worker (blocking) and ``kill(worker)`` ends one (never
    blocking for long). Workers carry ``generation`` and ``fate`` attributes (``fate``: why a worker ended, once it
    has; None while it serves).
    """

    def __init__(
        self,
        workers_max: int,
        sessions_max: int,
        start: Callable[[], W],
        kill: Callable[[W], None],
        healthy: Callable[[W], bool] = lambda worker: True,
    ) -> None:
        if workers_max < 1 or sessions_max < 1:
            raise ValueError("a pool needs at least one worker and one session")
        self.workers_max = workers_max
        self.sessions_max = sessions_max
        self.per_worker = math.ceil(sessions_max / workers_max)
        """Sessions one worker hosts at most."""
        self._start, self._kill, self._healthy = start, kill, healthy
        self._lock = threading.RLock()
        self._ready: dict[W, int] = {}  # worker -> sessions it hosts now
        self._retiring: dict[W, int] = {}  # workers with a hung call, serving their other sessions to the end
        self._starting = 0
        self._sessions = 0
        self._waiters: collections.deque[tuple[asyncio.AbstractEventLoop, asyncio.Future[W]]] = collections.deque()
        self._generation = 0  # bumped by close(): starts that finish after it are killed
        self.waiting = 0
        """Callers of :meth:`acquire` waiting for a slot now."""
        self.started = 0
        """Workers started so far."""
        self.replaced = 0
        """Workers killed or lost (hung or crashed) and replaced."""
        self.lost_sessions = 0
        """Sessions whose worker was killed or died under them: each ends its episode with an error."""
        self.timeouts = 0
        """Calls that hung past their deadline (each retires its worker, see :meth:`retire`)."""
        self.peak_sessions = 0
        """The most sessions alive at once."""

    @property
    def workers(self) -> list[W]:
        """The ready workers."""
        with self._lock:
            return list(self._ready)

    @property
    def retiring(self) -> list[W]:
        """Workers with a hung call, serving their other sessions to the end (then killed)."""
        with self._lock:
            return list(self._retiring)

    @property
    def leased(self) -> list[W]:
        """The workers hosting at least one session now."""
        with self._lock:
            return [worker for worker, load in self._ready.items() if load]

    @property
    def sessions(self) -> int:
        """Sessions alive now."""
        return self._sessions

    @property
    def size(self) -> int:
        """Workers ready or starting."""
        with self._lock:
            return len(self._ready) + self._starting

    def load(self, worker: W) -> int:
        """Sessions ``worker`` hosts now."""
        with self._lock:
            return self._ready.get(worker, 0)

    async def acquire(self) -> W:
        """A slot on a worker (waiting, without a deadline, for one): the worker to open the session on."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[W] = loop.create_future()
        with self._lock:
            self._waiters.append((loop, future))
            self.waiting += 1
            self._dispatch()
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

    async def prepare(self, sessions: int, timeout_s: float) -> None:
        """Start, in parallel, the workers that ``sessions`` new sessions will be spread over, and wait until every
        start has finished (ready or failed; at most ``timeout_s``). A run that calls this before its episodes open
        their sessions starts them together: without it the sessions placed on the workers already running begin
        while the others wait for their worker, and their episodes run ahead in batches of their own that never
        re-merge with the rest (measured: 32 episodes x 5 turns on 4 processes, 2 of them warm, made 10-28 backend
        calls instead of 5). A failed start is not raised here: the session that needs the worker gets it."""
        with self._lock:
            free = max(0, self.sessions_max - self._sessions)
            empty = sum(1 for load in self._ready.values() if load == 0)
            more = min(sessions, free) - empty  # the spread-first placement starts a worker per session past these
            for _ in range(max(0, min(more, self.workers_max - self.size))):
                self._spawn()
        deadline = asyncio.get_running_loop().time() + timeout_s
        pause = 0.005
        while self._starting > 0 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(pause)
            pause = min(2 * pause, 0.05)

    def release(self, worker: W) -> None:
        """A session on ``worker`` ended: give its slot back (a retired worker whose last session this was is
        killed)."""
        drained = False
        with self._lock:
            if getattr(worker, "generation", self._generation) != self._generation:
                return  # a session from before close(), which gave every slot back: counting it again would drift
            self._sessions -= 1
            if worker in self._ready:
                self._ready[worker] -= 1
            elif worker in self._retiring:
                self._retiring[worker] -= 1
                if self._retiring[worker] <= 0:
                    del self._retiring[worker]
                    drained = True
            self._dispatch()
        if drained:
            self._kill(worker)

    def retire(self, worker: W, fate: str) -> None:
        """A call on ``worker`` hung past its deadline: the worker takes no new session and a replacement starts at
        once; its other sessions go on to their end, then it is killed (with its hung call). A second hang on a
        retired worker, or more retired workers than ``workers_max``, kills it at once (its sessions are lost)."""
        with self._lock:
            self.timeouts += 1
            oldest = None
            if worker in self._retiring:
                again = True
            else:
                again = False
                hosted = self._ready.pop(worker, None)
                if hosted is None:
                    return
                with contextlib.suppress(AttributeError):
                    worker.retired = fate  # type: ignore[attr-defined]
                self._retiring[worker] = hosted
                if getattr(worker, "generation", self._generation) == self._generation:
                    self.replaced += 1
                    self._spawn()
                oldest = next(iter(self._retiring)) if len(self._retiring) > self.workers_max else None
        if again:
            self.discard(worker, f"{fate} (a second call on it hung)")
        elif oldest is not None:
            self.discard(oldest, "killed by envkit: too many workers with hung calls")

    def discard(self, worker: W, fate: str = "") -> None:
        """Kill ``worker`` (hung, dead) and start its replacement; ``fate`` says why (its sessions' errors name it)."""
        with self._lock:
            if fate and getattr(worker, "fate", None) is None:
                with contextlib.suppress(AttributeError):
                    worker.fate = fate  # type: ignore[attr-defined]
            hosted = self._ready.pop(worker, None)
            if hosted is not None and getattr(worker, "generation", self._generation) == self._generation:
                self.replaced += 1
                self.lost_sessions += hosted
                self._spawn()
            retired = self._retiring.pop(worker, None)
            if retired is not None:  # replaced when it was retired
                self.lost_sessions += retired
        self._kill(worker)

    def close(self) -> None:
        """Kill every worker; waiting callers get :class:`EnvWorkerLost`. The pool starts afresh if used again."""
        with self._lock:
            self._generation += 1
            workers = [*self._ready, *self._retiring]
            self._ready.clear()
            self._retiring.clear()
            self._sessions = 0
            waiters = list(self._waiters)
            self._waiters.clear()
        for loop, future in waiters:
            self._settle(loop, future, EnvWorkerLost("the env workers were closed"))
        for worker in workers:
            with contextlib.suppress(AttributeError):
                worker.fate = worker.fate or "the env workers were closed"  # type: ignore[attr-defined]
            self._kill(worker)

    # lock held
    def _dispatch(self) -> None:
        while self._waiters and self._sessions < self.sessions_max:
            worker = self._least_loaded()
            if worker is None or self._ready[worker] > 0:  # spread first: an empty worker, started now or soon
                if self.size < self.workers_max and self._starting < len(self._waiters):
                    self._spawn()
                    continue
                if worker is None or self._starting:
                    return
            loop, future = self._waiters.popleft()
            self._ready[worker] += 1
            self._sessions += 1
            self.peak_sessions = max(self.peak_sessions, self._sessions)
            if not self._settle(loop, future, worker):
                self._ready[worker] -= 1
                self._sessions -= 1

    def _least_loaded(self) -> W | None:
        while True:
            open_ = [(load, i, w) for i, (w, load) in enumerate(self._ready.items()) if load < self.per_worker]
            if not open_:
                return None
            worker = min(open_, key=lambda entry: entry[:2])[2]
            if self._healthy(worker) and getattr(worker, "fate", None) is None:
                return worker
            # died while idle or between calls: replace it, place elsewhere; its sessions are lost (the discard its
            # death also calls finds it gone and counts nothing)
            self.lost_sessions += self._ready.pop(worker)
            self.replaced += 1
            self._kill(worker)
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
                self._ready[worker] = 0
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


POOLS: weakref.WeakSet[Any] = weakref.WeakSet()


def _close_all() -> None:  # at exit, before multiprocessing's own handler (atexit runs last-registered first)
    for pool in list(POOLS):
        with contextlib.suppress(Exception):
            pool.close()


atexit.register(_close_all)


class RemoteSession:
    """One episode's env on a worker of a :class:`MuxPool` in another process: each call is one :meth:`request`
    routed to that worker. Steps come back as :class:`~envkit.workers.base.StepDelta` objects; the transcript is kept
    here (:class:`~envkit.workers.base.HistoryMirror`). Subclasses provide :meth:`_exchange` and :meth:`_post`."""

    _ids = iter(range(1, 1 << 62))
    _ids_lock = threading.Lock()

    def __init__(self, pool: MuxPool[Any], worker: Any) -> None:
        self.pool = pool
        self.worker: Any = worker
        """The worker hosting this session's env (None once it is lost or the session closed)."""
        with RemoteSession._ids_lock:
            self.id = next(RemoteSession._ids)
        self.placement: dict[str, Any] = dict(getattr(worker, "placement", {}))
        """Where the env lives (``pid``; on Ray also ``node`` and ``actor``), recorded on the episode."""
        self.bytes_sent = 0
        """Bytes of this session's last request."""
        self.bytes_received = 0
        """Bytes of this session's last reply."""
        self._history = HistoryMirror()
        self._home: Any = worker  # the worker whose slot this session holds, until close()
        self._opened = False
        self._hung = False  # a call of this session still runs in the worker: never close its env under it

    async def _exchange(self, worker: Any, payload: bytes, timeout_s: float, what: str) -> bytes:
        """Send one request to ``worker``; its reply (raise :class:`EnvTimeout` / :class:`EnvWorkerLost`)."""
        raise NotImplementedError

    def _post(self, worker: Any, payload: bytes) -> None:
        """Send a request whose reply nobody waits for (never blocks)."""
        raise NotImplementedError

    async def request(self, op: str, argument: Any, *, timeout_s: float, what: str) -> Any:
        """One call on the env's worker, at most ``timeout_s`` seconds."""
        worker = self.worker
        if worker is None:
            raise EnvWorkerLost("this episode's env worker is gone (an earlier call failed or the session closed)")
        if worker.fate is not None:
            self._lost()
            raise EnvWorkerLost(f"{worker} was lost before {what} ({worker.fate})")
        payload = pickle.dumps((self.id, op, argument), protocol=pickle.HIGHEST_PROTOCOL)
        self.bytes_sent = len(payload)
        reply = await self._exchange(worker, payload, timeout_s, what)
        self.bytes_received = len(reply)
        return unpack_reply(reply)

    def _timed_out(self, worker: Any, timeout_s: float, what: str) -> EnvTimeout:
        """This session's call (``what``) on ``worker`` hung: the session is done, its worker retired
        (:meth:`MuxPool.retire`). Returns the :class:`EnvTimeout` for :meth:`_exchange` to raise."""
        self.worker, self._hung = None, True
        self.pool.retire(worker, f"killed by envkit: another episode's call on it took longer than {timeout_s:g}s")
        return EnvTimeout(
            f"{what} took longer than {timeout_s:g}s ({worker} retired: replaced now, killed once its other episodes "
            "end)"
        )

    def _lost(self, kill: str = "") -> None:
        """This session's worker is unusable: forget it (``kill``: kill it too, saying why, and replace it)."""
        worker, self.worker = self.worker, None
        if worker is not None and (kill or worker.fate is not None):
            self.pool.discard(worker, kill)

    async def load(self, env_factory: Any, *, timeout_s: float) -> None:
        """Import the env's code in the worker (once per worker and factory). Part of starting a worker, so not under
        the construction deadline: a worker stuck longer is lost, not timed out."""
        key = pickle.dumps(env_factory)
        if key in self.worker.loaded:
            return
        try:
            await self.request("load", env_factory, timeout_s=timeout_s, what="loading the env's code")
        except EnvTimeout as error:
            raise EnvWorkerLost(str(error)) from None
        self.worker.loaded.add(key)

    async def open(self, env_factory: Any, *, timeout_s: float) -> None:
        """Build the env on the worker."""
        self._opened = True
        try:
            await self.request("open", env_factory, timeout_s=timeout_s, what="construction")
        except asyncio.CancelledError:  # the env may still be built: close() must reach the worker
            raise
        except BaseException:  # no env was built: nothing to close there
            self._opened = False
            raise

    async def reset(self, seed: int, *, timeout_s: float) -> tuple[list[Message], dict[str, Any], list[Any] | None]:
        opening, info, tools = await self.request("reset", seed, timeout_s=timeout_s, what="reset()")
        self._history = HistoryMirror()
        self._history.messages = list(opening)
        return opening, info, tools

    async def step(self, action: Message, *, timeout_s: float) -> StepOutcome:
        delta: StepDelta = await self.request("step", action, timeout_s=timeout_s, what="step()")
        return self._history.apply(delta)

    async def score(self, *, timeout_s: float, ending: Ending | None = None) -> float:
        """``env.end(ending)`` (when given), then ``env.score()``, checked, in the env's worker (one request)."""
        value = None if ending is None else Ending(ending).value  # plain data across the process boundary
        return float(await self.request("score", value, timeout_s=timeout_s, what="score()"))

    async def score_components(self, *, timeout_s: float) -> dict[str, float]:
        """``env.score_components()``, checked (``{}`` for an env without them)."""
        return await self.request("score_components", None, timeout_s=timeout_s, what="score_components()")

    async def transcript(self, *, timeout_s: float) -> list[Message]:
        return await self.request("transcript", None, timeout_s=timeout_s, what="transcript")

    async def call(self, function: Callable[..., Any], *args: Any, timeout_s: float, what: str) -> Any:
        """``function(env, *args)`` in the env's worker, at most ``timeout_s`` seconds: its result (``function`` and
        ``args`` are pickled: a module-level function the worker can import). What ``envkit serve-env`` runs."""
        return await self.request("call", (function, args), timeout_s=timeout_s, what=what)

    def close(self) -> None:
        """Close the env in its worker (its reply is not awaited) and give the session's slot back: never blocks."""
        home, self._home, self.worker = self._home, None, None
        if home is None:
            return
        if self._opened and home.fate is None and not self._hung:
            with contextlib.suppress(Exception):
                self._post(home, pickle.dumps((self.id, "close", None), protocol=pickle.HIGHEST_PROTOCOL))
        self.pool.release(home)

    async def aclose(self, *, timeout_s: float) -> None:
        """Close the env in its worker and wait for the worker's reply (at most ``timeout_s``: a hung ``close()``
        retires the worker as a hung call does), then give the session's slot back."""
        home, self._home, self.worker = self._home, None, None
        if home is None:
            return
        try:
            if self._opened and home.fate is None and not self._hung:
                payload = pickle.dumps((self.id, "close", None), protocol=pickle.HIGHEST_PROTOCOL)
                with contextlib.suppress(Exception):  # the env's close() failing is not the episode's fault
                    unpack_reply(await self._exchange(home, payload, timeout_s, "close()"))
        finally:
            self.pool.release(home)


S = TypeVar("S", bound=RemoteSession)


class RemoteWorkers(Generic[S]):
    """Env workers in other processes, each hosting many envs: what
    :class:`~envkit.workers.processes.ProcessWorkers` and :class:`~envkit.workers.ray_actors.RayWorkers` share.

    Each env is a session (a :attr:`session_class`) on a worker of :attr:`pool` (a worker process or a Ray actor);
    the engine's own calls (rendering, parsing) run on threads of this process. A subclass builds the pool, then
    calls ``RemoteWorkers.__init__``, which closes it when the workers are dropped without :meth:`close` or the
    interpreter exits.

    Args:
        pool: The workers, started lazily by the pool.
        concurrency: Envs alive at once (the pool's ``sessions_max``); also the most :meth:`call` calls at once.
        start_timeout_s: How long a new worker may take to start, and to load an env's code, before the episode
            waiting for it fails.
    """

    in_process = False
    kind = ""
    """The ``env_workers`` kind (``"processes"``, ``"ray"``), named in errors."""
    session_class: type[S]
    """The session class :meth:`open` builds on a worker."""

    def __init__(self, pool: MuxPool[Any], concurrency: int, start_timeout_s: float) -> None:
        self.pool = pool
        """The workers and their sessions' slots."""
        self.concurrency = concurrency
        """Envs alive at once."""
        self.start_timeout_s = start_timeout_s
        """How long a new worker may take to start."""
        self._threads = ThreadWorkers(concurrency)
        POOLS.add(self)
        weakref.finalize(self, pool.close)  # dropped without close(): its workers end with it

    @property
    def pids(self) -> list[int]:
        """Process ids of the ready workers."""
        return [worker.pid for worker in self.pool.workers]

    @property
    def waiting(self) -> int:
        """Episodes waiting for a free slot now (the engine's batcher does not wait for them)."""
        return self.pool.waiting

    async def prepare(self, episodes: int) -> None:
        """Start the workers that ``episodes`` new episodes will be spread over, in parallel, and wait until they are
        ready (at most ``start_timeout_s``), so that a run's episodes begin together (the engine calls this before a
        run: see :meth:`MuxPool.prepare`).

        Args:
            episodes: The episodes about to open their sessions.
        """
        await self.pool.prepare(episodes, self.start_timeout_s)

    def _session(self, worker: Any) -> S:
        """A new session on ``worker`` (a subclass may set more on it)."""
        return self.session_class(self.pool, worker)

    async def open(self, env_factory: Callable[[], Any], *, timeout_s: float) -> S:
        """Take a slot on a worker (waiting for one, without a deadline) and build the env there within
        ``timeout_s``.

        Args:
            env_factory: Builds the env; pickled to the worker (an :class:`~envkit.workers.EnvFactory`).
            timeout_s: The construction deadline. Loading the env's code (once per worker and factory) counts
                toward ``start_timeout_s`` instead.

        Raises:
            ValueError: ``env_factory`` cannot be pickled (one line naming the fix).
        """
        check_picklable_factory(env_factory, self.kind)
        worker = await self.pool.acquire()
        session = self._session(worker)
        try:
            await session.load(env_factory, timeout_s=self.start_timeout_s)
            await session.open(env_factory, timeout_s=timeout_s)
        except BaseException:
            session.close()
            raise
        return session

    async def call(self, function: Callable[..., Any], *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` in this process off the event loop (as :class:`ThreadWorkers` does)."""
        return await self._threads.call(function, *args, timeout_s=timeout_s, **kwargs)

    def close(self) -> None:
        """Kill every worker (calls still running are lost); a later :meth:`open` starts new ones."""
        self.pool.close()
        self._threads.close()
