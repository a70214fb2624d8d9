"""Ray env workers: envs live in a few Ray actors, on this machine or anywhere in a Ray cluster, each actor hosting
many episodes' envs (sessions).

:class:`RayWorkers` keeps up to ``actors`` actors (default: ``min(concurrency, 2 × the cluster's CPUs)``) hosting at
most ``concurrency`` envs in all (:class:`~envkit.workers.pool.MuxPool`), spread over the cluster's nodes (Ray's
``SPREAD`` scheduling unless ``actor_options`` say otherwise). An episode's env is built on one actor from the
picklable factory (:class:`envkit.workers.EnvFactory`) and its calls are routed there; the actor is async and runs
each call on a thread of its own, so one episode's slow step does not hold up another's. A step sends back only the
messages the engine does not have yet. Each episode records where its env lived (``Episode.worker``: ``node``,
``actor``, ``pid``) and :func:`envkit.rollout.summarize` counts episodes per node.

The faults are those of :mod:`envkit.workers.processes`: a call past its deadline raises
:class:`~envkit.workers.EnvTimeout` and retires its actor (a replacement starts at once; the actor serves its other
episodes to their end, then is killed with ``ray.kill``). An actor that dies (its process crashed, was killed, its
node went away) ends the episodes it hosted with :class:`~envkit.workers.EnvWorkerLost` and is replaced; an
exception raised by the env comes back as itself. Waiting for a free slot does not count toward the construction
deadline.

Ray is an optional dependency: ``pip install -e '.[ray]'``. ``RayWorkers(address=None)`` connects to the Ray
instance already initialised in this process, else calls ``ray.init(address=address)``: ``None`` starts a local
instance (or joins the cluster named by ``RAY_ADDRESS``), ``"auto"`` or ``"ray://host:10001"`` joins a cluster. Actors
get the driver's ``sys.path``; on a remote cluster envkit and the env's module must be installed on every node (or
shipped with ``init_options={"runtime_env": ...}``). Their environment variables are Ray's, not the driver's: those
of the process that started the local instance, as they were at ``ray.init``, or a node's own; a variable set later
(an API key, a data folder) reaches actors only through a ``runtime_env``, e.g.
``actor_options={"runtime_env": {"env_vars": {"MY_KEY": value}}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import sys
from typing import Any

from envkit.util.install import install_command
from envkit.workers.base import EnvWorkerLost
from envkit.workers.host import EnvHost, extend_sys_path
from envkit.workers.pool import START_TIMEOUT_S, MuxPool, RemoteSession, RemoteWorkers
from envkit.workers.threads import DaemonPool


def ray_missing() -> str:
    """The one-line error for Ray missing, with the command that installs it into this envkit."""
    return f"env_workers='ray' needs Ray, which is not installed: {install_command('ray')}"


def require_ray() -> Any:
    """The ``ray`` module, or ImportError naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise ImportError(ray_missing()) from None
    return ray


class EnvActor:
    """What a Ray actor runs: one :class:`~envkit.workers.host.EnvHost` for many sessions (requests and replies are
    pickled bytes, so the env's own classes are unpickled here, after ``sys.path`` is extended). Async: each call
    runs on a thread of its own while the actor's event loop takes the next."""

    def __init__(self, sys_path: list[str]) -> None:
        extend_sys_path(sys_path)
        self.host = EnvHost()
        self.threads = DaemonPool()

    async def ready(self) -> tuple[int, str]:
        """This actor's process id and Ray node id."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    async def serve(self, request: bytes) -> bytes:
        """One request's reply (see :class:`~envkit.workers.host.EnvHost`)."""
        return await self.threads.future(asyncio.get_running_loop(), functools.partial(self.host.serve, request))

    async def post(self, request: bytes) -> None:
        """A request whose reply nobody waits for (an env's ``close``)."""
        self.threads.submit(functools.partial(self.host.serve, request), lambda reply: None)


class _Actor:
    """A started actor: its handle, process and node."""

    def __init__(self, handle: Any, pid: int, node: str) -> None:
        self.handle, self.pid, self.node = handle, pid, node
        self.generation = 0
        self.fate: str | None = None
        """Why this actor ended (None while it serves)."""
        self.loaded: set[bytes] = set()
        self.placement = {"pid": pid, "node": node, "actor": handle._actor_id.hex()}

    def __repr__(self) -> str:
        return f"env worker Ray actor {self.handle._actor_id.hex()[:12]} (process {self.pid}, node {self.node[:12]})"


class RaySession(RemoteSession):
    """One episode's env on a Ray actor hosting many."""

    errors: Any = Exception
    """Ray's ``RayError`` (an actor that died): env errors come back as replies, never as these."""

    async def _exchange(self, worker: _Actor, payload: bytes, timeout_s: float, what: str) -> bytes:
        ref = worker.handle.serve.remote(payload)

        async def reply() -> bytes:
            return await ref

        try:
            return await asyncio.wait_for(reply(), timeout_s)
        except asyncio.TimeoutError:
            raise self._timed_out(worker, timeout_s, what) from None
        except self.errors as error:
            fate = worker.fate
            self._lost(kill=f"{type(error).__name__}: {_first_line(error)}")
            reason = f"{fate}; " if fate else ""
            raise EnvWorkerLost(
                f"{worker} died during {what} ({reason}{type(error).__name__}: {_first_line(error)})"
            ) from None
        except BaseException:  # cancelled mid-call: this env's state is unknown; the actor's other envs are fine
            self.worker = None
            raise

    def _post(self, worker: _Actor, payload: bytes) -> None:
        worker.handle.post.remote(payload)


class RayWorkers(RemoteWorkers[RaySession]):
    """Env workers as Ray actors, each hosting many envs (see the module docstring). ``open``, ``prepare``, ``call``,
    ``close``, ``pids`` and ``waiting`` are :class:`~envkit.workers.pool.RemoteWorkers`' (an actor is a worker;
    :meth:`close` kills every actor, Ray itself keeps running).

    Args:
        concurrency: Envs alive at once, i.e. episodes past construction (the rest wait for a free slot).
        actors: Actors at most (default: ``min(concurrency, 2 × the cluster's CPUs)``, at least 4); each hosts at most
            ``ceil(concurrency / actors)`` envs.
        address: The Ray cluster for ``ray.init`` when Ray is not initialised yet (``None``: a local instance).
        actor_options: ``ActorClass.options(...)`` for every actor, e.g. ``{"num_cpus": 1}``, a ``runtime_env`` or a
            ``scheduling_strategy`` (default ``"SPREAD"``: actors spread over the nodes).
        init_options: More ``ray.init`` arguments (e.g. ``{"num_cpus": 8, "include_dashboard": False}``).
        start_timeout_s: How long a new actor may take to start before the episode waiting for it fails.
    """

    kind = "ray"
    session_class = RaySession

    def __init__(
        self,
        concurrency: int = 32,
        *,
        actors: int | None = None,
        address: str | None = None,
        actor_options: dict[str, Any] | None = None,
        init_options: dict[str, Any] | None = None,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if actors is not None and actors < 1:
            raise ValueError("actors must be at least 1")
        ray = require_ray()
        if not ray.is_initialized():
            ray.init(address=address, **(init_options or {}))
        self._ray = ray
        self._actor_class = ray.remote(EnvActor)
        self.actor_options = {
            "max_restarts": 0,
            "max_concurrency": 1000,
            "scheduling_strategy": "SPREAD",
            **(actor_options or {}),
        }
        if actors is None:
            cpus = int(ray.cluster_resources().get("CPU", 0)) or os.cpu_count() or 1
            actors = max(1, min(concurrency, max(4, 2 * cpus)))
        self.actors = actors
        start = functools.partial(_start_actor, ray, self._actor_class, self.actor_options, start_timeout_s)
        pool: MuxPool[_Actor] = MuxPool(actors, concurrency, start, functools.partial(_kill_actor, ray))
        super().__init__(pool, concurrency, start_timeout_s)

    @property
    def nodes(self) -> dict[str, int]:
        """Ready actors per Ray node id."""
        counts: dict[str, int] = {}
        for actor in self.pool.workers:
            counts[actor.node] = counts.get(actor.node, 0) + 1
        return counts

    def _session(self, worker: _Actor) -> RaySession:
        """A session on ``worker`` that counts Ray's errors (an actor that died) as the worker lost."""
        session = super()._session(worker)
        session.errors = self._ray.exceptions.RayError
        return session


def _start_actor(ray: Any, actor_class: Any, options: dict[str, Any], start_timeout_s: float) -> _Actor:
    """Start an actor and wait until it is ready (blocking: runs on a pool thread)."""
    handle = actor_class.options(**options).remote(list(sys.path))
    try:
        pid, node = ray.get(handle.ready.remote(), timeout=start_timeout_s)
    except Exception as error:
        with contextlib.suppress(Exception):
            ray.kill(handle, no_restart=True)
        raise RuntimeError(f"a Ray actor did not start: {_first_line(error)}") from None
    return _Actor(handle, int(pid), str(node))


def _kill_actor(ray: Any, actor: _Actor) -> None:
    with contextlib.suppress(Exception):
        ray.kill(actor.handle, no_restart=True)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
