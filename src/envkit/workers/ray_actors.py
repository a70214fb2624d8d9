"""Ray env workers: each episode's env lives in a Ray actor, on this machine or anywhere in a Ray cluster.

:class:`RayWorkers` keeps a pool of up to ``concurrency`` actors, each holding one env at a time: an episode leases an
actor for its whole life, builds its env there from the picklable factory (:class:`envkit.workers.EnvFactory`) and
gives the actor back when it ends, for the next episode and the next run. The faults are those of
:mod:`~envkit.workers.processes`: a call past its deadline kills the actor (``ray.kill``), starts a replacement and
raises :class:`~envkit.workers.EnvTimeout`; an actor that dies during a call (its process crashed, was killed, its node
went away) raises :class:`~envkit.workers.EnvWorkerLost` and is replaced; an exception raised by the env comes back as
itself. Waiting for a free actor does not count toward the construction deadline.

Ray is an optional dependency: ``pip install 'envkit[ray]'``. ``RayWorkers(address=None)`` connects to the Ray
instance already initialised in this process, else calls ``ray.init(address=address)``: ``None`` starts a local
instance (or joins the cluster named by ``RAY_ADDRESS``), ``"auto"`` or ``"ray://host:10001"`` joins a cluster. Actors
get the driver's ``sys.path``; on a remote cluster envkit and the env's module must be installed on every node (or
shipped with ``init_options={"runtime_env": ...}``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import pickle
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from envkit.workers.base import EnvTimeout, EnvWorkerLost, check_picklable_factory
from envkit.workers.processes import (
    _POOLS,
    CLOSE_TIMEOUT_S,
    START_TIMEOUT_S,
    EnvHost,
    LeasePool,
    RemoteSession,
    extend_sys_path,
    unpack_reply,
)
from envkit.workers.threads import ThreadWorkers

RAY_MISSING = "env_workers='ray' needs Ray, which is not installed: pip install 'envkit[ray]'"


def require_ray() -> Any:
    """The ``ray`` module, or ImportError naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise ImportError(RAY_MISSING) from None
    return ray


class EnvActor:
    """What a Ray actor runs: one :class:`~envkit.workers.processes.EnvHost` (requests and replies are pickled bytes,
    so the env's own classes are unpickled here, after ``sys.path`` is extended)."""

    def __init__(self, sys_path: list[str]) -> None:
        extend_sys_path(sys_path)
        self.host = EnvHost()

    def ready(self) -> int:
        return os.getpid()

    def serve(self, request: bytes) -> bytes:
        return self.host.serve(request)


class _Actor:
    """A started actor: its handle and process id."""

    def __init__(self, handle: Any, pid: int) -> None:
        self.handle, self.pid = handle, pid
        self.generation = 0

    def __repr__(self) -> str:
        return f"env worker Ray actor {self.handle._actor_id.hex()[:12]} (process {self.pid})"


class RayWorkers:
    """Env workers as Ray actors: each episode leases an actor for its whole life (see the module docstring).

    Args:
        concurrency: Actors at most, i.e. episodes alive at once (the rest wait for a free actor).
        address: The Ray cluster for ``ray.init`` when Ray is not initialised yet (``None``: a local instance).
        actor_options: ``ActorClass.options(...)`` for every actor, e.g. ``{"num_cpus": 1}`` or a ``runtime_env``.
        init_options: More ``ray.init`` arguments (e.g. ``{"num_cpus": 8, "include_dashboard": False}``).
        start_timeout_s: How long a new actor may take to start before the episode waiting for it fails.
    """

    in_process = False
    kind = "ray"

    def __init__(
        self,
        concurrency: int = 32,
        *,
        address: str | None = None,
        actor_options: dict[str, Any] | None = None,
        init_options: dict[str, Any] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        ray = require_ray()
        if not ray.is_initialized():
            ray.init(address=address, **(init_options or {}))
        self._ray = ray
        self._actor_class = ray.remote(EnvActor)
        self.actor_options = {"max_restarts": 0, "max_concurrency": 1, **(actor_options or {})}
        self.start_timeout_s = start_timeout_s
        self.concurrency = concurrency
        start = functools.partial(_start_actor, ray, self._actor_class, self.actor_options, start_timeout_s)
        self.pool: LeasePool[_Actor] = LeasePool(concurrency, start, functools.partial(_kill_actor, ray))
        self._threads = ThreadWorkers(concurrency)
        _POOLS.add(self)
        weakref.finalize(self, self.pool.close)  # dropped without close(): its actors end with it

    @property
    def pids(self) -> list[int]:
        """Process ids of the ready actors (idle and leased)."""
        return [actor.pid for actor in self.pool.workers]

    @property
    def waiting(self) -> int:
        """Episodes waiting for a free actor now (the engine's batcher does not wait for them)."""
        return self.pool.waiting

    async def open(self, env_factory: Callable[[], Any], *, timeout_s: float) -> RaySession:
        """Lease an actor (waiting for a free one, without a deadline) and build the env there within ``timeout_s``."""
        check_picklable_factory(env_factory, self.kind)
        actor = await self.pool.acquire()
        session = RaySession(self, actor)
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
        """Kill every actor (Ray itself keeps running); a later :meth:`open` starts new ones."""
        self.pool.close()
        self._threads.close()


def _start_actor(ray: Any, actor_class: Any, options: dict[str, Any], start_timeout_s: float) -> _Actor:
    """Start an actor and wait until it is ready (blocking: runs on a pool thread)."""
    handle = actor_class.options(**options).remote(list(sys.path))
    try:
        pid = ray.get(handle.ready.remote(), timeout=start_timeout_s)
    except Exception as error:
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)
        raise RuntimeError(f"a Ray actor did not start: {_first_line(error)}") from None
    return _Actor(handle, int(pid))


def _kill_actor(ray: Any, actor: _Actor) -> None:
    with contextlib.suppress(Exception):
        ray.kill(actor.handle, no_restart=True)


class RaySession(RemoteSession):
    """One episode's env in a leased Ray actor."""

    def __init__(self, workers: RayWorkers, actor: _Actor) -> None:
        self.workers = workers
        self.actor: _Actor | None = actor

    async def request(self, op: str, argument: Any, *, timeout_s: float, what: str) -> Any:
        """One call on the actor, at most ``timeout_s`` seconds."""
        actor = self.actor
        if actor is None:
            raise EnvWorkerLost("this episode's env actor is gone (an earlier call failed or the session closed)")
        payload = pickle.dumps((op, argument), protocol=pickle.HIGHEST_PROTOCOL)
        ref = actor.handle.serve.remote(payload)

        async def reply() -> bytes:
            return await ref

        try:
            value = await asyncio.wait_for(reply(), timeout_s)
        except asyncio.TimeoutError:
            self._lose()
            raise EnvTimeout(f"{what} took longer than {timeout_s:g}s ({actor} killed and replaced)") from None
        except self.workers._ray.exceptions.RayError as error:  # the actor died: env errors come back as replies
            self._lose()
            raise EnvWorkerLost(f"{actor} died during {what} ({type(error).__name__}: {_first_line(error)})") from None
        except BaseException:
            self._lose()
            raise
        return unpack_reply(value)

    def _lose(self) -> None:
        actor, self.actor = self.actor, None
        if actor is not None:
            self.workers.pool.discard(actor)

    def close(self) -> None:
        """Close the env in its actor and give the actor back (on a thread: never blocks)."""
        actor, self.actor = self.actor, None
        if actor is None:
            return
        ray, pool = self.workers._ray, self.workers.pool

        def recycle() -> None:
            try:
                ray.get(actor.handle.serve.remote(pickle.dumps(("close", None))), timeout=CLOSE_TIMEOUT_S)
            except Exception:
                pool.discard(actor)
                return
            pool.release(actor)

        threading.Thread(target=recycle, name="envkit-actor-close", daemon=True).start()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
