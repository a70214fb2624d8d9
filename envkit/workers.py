"""Env workers: where an episode's env lives and its calls (construct, reset, step, score) run, off the event loop.

The rollout engine talks to an env only through an :class:`EnvSession` that a pool of :class:`EnvWorkers` opened for
one episode: ``reset``, ``step``, ``score``, ``transcript`` and ``close``, each ``async`` and bounded by a deadline
(``timeout_s`` of running time; how time spent waiting for a free worker counts depends on the kind). Past its
deadline a call raises :class:`EnvTimeout` in the caller at once and the session is unusable (the episode ends with
``finish_reason="timeout"``); a worker that dies raises :class:`EnvWorkerLost`. Capacity never shrinks: a hung worker
is abandoned or killed and replaced.

Kinds (:func:`make_workers`):

* ``"threads"`` (:class:`ThreadWorkers`, the default) — the env in this process, each call on its own daemon thread.
  A hung call cannot be killed: it is abandoned (daemon threads never keep the interpreter from exiting).
* ``"processes"`` and ``"ray"`` — the env in another process (see :mod:`envkit.process_workers` and
  :mod:`envkit.ray_workers`); the env is built there from a picklable factory (:class:`EnvFactory`).
"""

from __future__ import annotations

from typing import Any

from envkit.thread_workers import DaemonPool, ThreadWorkers, _CallOnly
from envkit.worker_protocol import (
    WORKER_KINDS,
    EnvExited,
    EnvFactory,
    EnvSession,
    EnvTimeout,
    EnvWorkerLost,
    EnvWorkers,
    LeakedThreadsError,
    ScoreError,
    StepOutcome,
    check_picklable_factory,
    checked_components,
    checked_reward,
    checked_score,
    components_outcome,
    has_score_components,
    reset_outcome,
    score_outcome,
    step_outcome,
)

__all__ = [
    "WORKER_KINDS",
    "DaemonPool",
    "EnvExited",
    "EnvFactory",
    "EnvSession",
    "EnvTimeout",
    "EnvWorkerLost",
    "EnvWorkers",
    "LeakedThreadsError",
    "ScoreError",
    "StepOutcome",
    "ThreadWorkers",
    "check_picklable_factory",
    "checked_components",
    "checked_reward",
    "checked_score",
    "components_outcome",
    "has_score_components",
    "make_workers",
    "reset_outcome",
    "score_outcome",
    "step_outcome",
    "workers_from_flags",
]


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
    as is, else a started pool. Raises ValueError (an unknown kind, ``--ray-address`` without Ray, or the pool
    failing to start, e.g. no Ray cluster at the address) or ImportError (Ray is not installed), each one line."""
    if kind not in WORKER_KINDS:
        raise ValueError(f"--env-workers must be one of {', '.join(WORKER_KINDS)}; got {kind!r}")
    if ray_address and kind != "ray":
        raise ValueError(f"--ray-address goes with --env-workers ray, not {kind}")
    if kind == "threads":
        return kind
    try:
        return make_workers(kind, concurrency=concurrency, **({"address": ray_address} if kind == "ray" else {}))
    except (ValueError, ImportError):
        raise
    except Exception as error:  # e.g. no Ray cluster at --ray-address
        text = (str(error).strip().splitlines() or [""])[0]
        raise ValueError(f"--env-workers {kind}: {type(error).__name__}: {text}") from None
