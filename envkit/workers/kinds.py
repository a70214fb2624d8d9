"""Choosing env workers by kind (``--env-workers threads|processes|ray``)."""

from __future__ import annotations

from typing import Any

from envkit.workers.base import WORKER_KINDS, EnvWorkers
from envkit.workers.threads import CallOnly, ThreadWorkers


def make_workers(kind: str | EnvWorkers, *, concurrency: int = 32, **options: Any) -> EnvWorkers:
    """The env workers for ``kind``: ``"threads"``, ``"processes"`` or ``"ray"`` (or an :class:`EnvWorkers`, as
    is). ``options`` go to the kind's constructor (e.g. ``address=`` for Ray). Raises ValueError for an unknown kind
    and ImportError, naming the extra to install, when the kind's package is missing."""
    if not isinstance(kind, str):
        return kind if hasattr(kind, "open") else CallOnly(kind)
    if kind == "threads":
        return ThreadWorkers(concurrency)
    if kind == "processes":
        from envkit.workers.processes import ProcessWorkers

        return ProcessWorkers(concurrency, **options)
    if kind == "ray":
        from envkit.workers.ray_actors import RayWorkers

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
