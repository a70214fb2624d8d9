"""Where a served env lives (``envkit serve-env``): in env worker processes, never in the server's own process.

An env executing model input can hang in a C call that holds the GIL (``eval("9**9**9")``): in the server's process
that would freeze every session, every new handshake and ``/health``, and no deadline could end it. So each session's
env lives in a worker process of a :class:`~envkit.workers.processes.ProcessWorkers` pool (:class:`ServedEnvs`), every
call on it has a deadline (``step_timeout_s``), and the workers run under kernel limits
(:class:`~envkit.util.children.ResourceLimits`: CPU seconds per call, address space). A call past its deadline fails
its session (:class:`SessionFailed`: every later call of that session fails too, saying why) and retires its worker
as the rollout engine does: a replacement starts at once, and the worker is killed once its other sessions end (a
call of theirs that hangs as well kills it at once).

The functions below run *in the worker*, on the env (each is one request: the worker's
:class:`~envkit.workers.host.EnvHost` calls ``function(env, *args)``), and send back plain JSON data: the env's
messages, and its :class:`EnvState` after the call, which the server keeps so that OpenEnv's ``state`` (read on the
server's event loop) never waits for a worker.
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass
from typing import Any

from envkit.core.env import Env
from envkit.util.background import BackgroundLoop
from envkit.util.children import ResourceLimits
from envkit.workers.base import EnvFactory, EnvTimeout, EnvWorkerLost
from envkit.workers.processes import ProcessWorkers

DEFAULT_STEP_TIMEOUT_S = 20.0
"""Seconds one call of a served env (construct, reset, a turn, the end) may take: below OpenEnv's own 30 s limit on an
MCP tool call, so the session fails here, where the worker is retired, rather than there."""
DEFAULT_CPU_LIMIT_S = 60.0
"""CPU seconds a worker may use past the start of its latest call before the kernel ends it (``RLIMIT_CPU``)."""
DEFAULT_MEMORY_LIMIT_BYTES = 8 << 30
"""Address space of one worker process (``RLIMIT_AS``, 8 GiB: a worker with envkit and torch imported maps ~1 GiB)."""


class SessionFailed(RuntimeError):
    """A served session's call went past its deadline or lost its worker: the session is over (one line: why)."""


@dataclass
class EnvState:
    """What OpenEnv's ``state`` reports of a served env, as of its latest call."""

    turns: int = 0
    done: bool = False
    score: float | None = 0.0
    score_error: str | None = None
    oracle: Any = None
    oracle_error: str | None = None
    """What the exposed ``oracle()`` raised (``"ValueError: …"``), when it did: never read as "no oracle"."""


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (what crosses the wire), unknown objects as strings."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


# ---- in the worker: one request each ---------------------------------------------------------------------------------
def score_of(env: Any) -> tuple[float | None, str | None]:
    """``(score, None)``, or ``(None, why)`` when ``score()`` raised or gave no finite number (never a stand-in)."""
    try:
        value = env.score()
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        return None, f"score() returned {value!r}: a score must be a finite number in [0, 1]"
    return float(value), None


def state_of(env: Any, expose_oracle: bool) -> EnvState:
    """The env's :class:`EnvState` now (its ``oracle()`` only when exposed, and while the episode goes on)."""
    oracle, oracle_error = None, None
    if expose_oracle and type(env).oracle is not Env.oracle and env.messages and not env.done:
        try:
            oracle = jsonable(env.oracle())
        except Exception as error:
            oracle_error = f"{type(error).__name__}: {error}"
    score, score_error = score_of(env)
    return EnvState(int(env.turns), bool(env.done), score, score_error, oracle, oracle_error)


def describe(env: Any, expose_oracle: bool) -> dict[str, Any]:
    """What the server needs to know of the env once: its class, ``max_turns``, tool schemas, whether it requires a
    proper ending, exposes an oracle or withholds the one it has, defines ``canaries()``, and its :class:`EnvState`
    (key ``state``)."""
    return {
        "class": type(env).__name__,
        "max_turns": int(getattr(env, "max_turns", 10)),
        "tools": jsonable(list(getattr(env, "tools", None) or [])),
        "requires_proper_ending": bool(getattr(env, "requires_proper_ending", False)),
        "has_oracle": bool(expose_oracle and type(env).oracle is not Env.oracle),
        "oracle_withheld": bool(not expose_oracle and type(env).oracle is not Env.oracle),
        "defines_canaries": type(env).canaries is not Env.canaries,
        "state": state_of(env, expose_oracle),
    }


def canaries(env: Any) -> tuple[Any, str | None]:
    """``(env.canaries(), None)`` as plain data, or ``(None, why)`` when it raised (the consumer raises it)."""
    try:
        return jsonable(env.canaries()), None
    except Exception as error:
        return None, f"{type(error).__name__}: {error}"


def reset(
    env: Any, seed: int | None, options: dict[str, Any] | None, expose_oracle: bool
) -> tuple[list[Any], dict[str, Any], EnvState]:
    """``env.reset(seed=seed, options=options)``: its opening messages and info, and its state after."""
    messages, info = env.reset(seed=seed, options=options)
    return jsonable(list(messages)), jsonable(dict(info)), state_of(env, expose_oracle)


def turn(
    env: Any, message: dict[str, Any] | str, expose_oracle: bool
) -> tuple[list[Any], float, bool, bool, dict[str, Any], EnvState]:
    """``env.step(message)`` (a step reward that is not a finite number is an error of the step): its observation,
    reward, terminated, truncated and info, and the env's state after."""
    observation, reward, terminated, truncated, info = env.step(message)
    if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
        raise ValueError(f"step() returned the reward {reward!r}: a step reward must be a finite number")
    state = state_of(env, expose_oracle)
    return jsonable(list(observation)), float(reward), bool(terminated), bool(truncated), jsonable(info), state


def end(env: Any, ending: str, expose_oracle: bool) -> tuple[str | None, bool, EnvState]:
    """``env.end(ending)`` (an unknown ending raises ``ValueError`` naming the known ones): the ending the env holds
    then (its value, None if none), whether it is proper, and the env's state after."""
    env.end(ending)
    told = env.ending
    return (
        (told.value if told is not None else None),
        bool(told is not None and told.proper),
        state_of(env, expose_oracle),
    )


# ---- in the server ---------------------------------------------------------------------------------------------------
class ServedEnvs:
    """The worker processes a served env's sessions live in, and the deadline of every call (see the module
    docstring). Thread-safe: sessions are opened and called from OpenEnv's executor threads.

    Args:
        spec: Anything :func:`envkit.make` accepts.
        config: Constructor arguments of the env.
        sessions: Sessions alive at once at most (the server's ``max_sessions``).
        step_timeout_s: Seconds one call may take (construction included).
        processes: Worker processes at most (default: :func:`~envkit.workers.processes.default_workers`); sessions
            are spread over them, each hosting at most ``ceil(sessions / processes)``. A hung call also stops the
            other sessions of its worker (their calls then time out too): more processes, fewer sessions touched.
        limits: Kernel limits on each worker (None: none).
    """

    def __init__(
        self,
        spec: str,
        config: dict[str, Any] | None = None,
        *,
        sessions: int,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
        processes: int | None = None,
        limits: ResourceLimits | None = None,
    ) -> None:
        if not step_timeout_s > 0:
            raise ValueError("the step timeout must be a positive number of seconds")
        self.factory = EnvFactory(spec, dict(config or {}))
        self.step_timeout_s = step_timeout_s
        self.workers = ProcessWorkers(sessions, processes=processes, limits=limits, preload=[__name__])
        self._loop = BackgroundLoop("envkit-serve-env")

    def open(self) -> ServedSession:
        """A new session: an env built on a worker (blocking; raises what building it raised, or
        :class:`SessionFailed`)."""
        try:
            session = self._loop.run(self.workers.open(self.factory, timeout_s=self.step_timeout_s))
        except (EnvTimeout, EnvWorkerLost) as error:
            raise SessionFailed(f"building the env failed: {error}") from None
        return ServedSession(self, session)

    def run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` on the workers' event loop and wait for it (from any thread but that loop's)."""
        return self._loop.run(coroutine)

    def close(self) -> None:
        """Kill every worker process (sessions still open fail at their next call)."""
        self.workers.close()


class ServedSession:
    """One session's env on a worker: :meth:`call` runs a function of the env there, within the deadline."""

    def __init__(self, envs: ServedEnvs, session: Any) -> None:
        self.envs = envs
        self.session = session
        self.failed: str | None = None
        """Why the session is over (None while it serves)."""

    def call(self, function: Any, *args: Any, what: str) -> Any:
        """``function(env, *args)`` in the env's worker (blocking): its result, or what the env raised.

        Raises:
            SessionFailed: The call went past the deadline or the worker was lost (and every later call).
        """
        if self.failed is not None:
            raise SessionFailed(self.failed)
        deadline = self.envs.step_timeout_s
        try:
            return self.envs.run(self.session.call(function, *args, timeout_s=deadline, what=what))
        except (EnvTimeout, EnvWorkerLost) as error:
            self.failed = f"{error}; this session is over: open a new one"
            self.session.close()  # its slot back: a retired worker whose sessions have all ended is killed
            raise SessionFailed(self.failed) from None

    def close(self) -> None:
        """Close the env in its worker and give its slot back (never blocks; idempotent)."""
        self.session.close()
