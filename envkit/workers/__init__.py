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
* ``"processes"`` and ``"ray"`` — the env in another process (see :mod:`envkit.workers.processes` and
  :mod:`envkit.workers.ray_actors`); the env is built there from a picklable factory (:class:`EnvFactory`).
"""

from envkit.workers.base import (
    WORKER_KINDS,
    ClosingSession,
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
from envkit.workers.kinds import make_workers, workers_from_flags
from envkit.workers.threads import DaemonPool, ThreadWorkers

__all__ = [
    "WORKER_KINDS",
    "ClosingSession",
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
