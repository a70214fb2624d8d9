"""The env-worker protocol, shared by every kind of worker: what a session and a pool of workers are
(:class:`EnvSession`, :class:`EnvWorkers`), the errors an env call ends with, the picklable env factory, and the
functions that run an env call and check its outcome where the env lives.

The lowest of the worker modules: :mod:`envkit.workers.threads`, :mod:`envkit.workers.processes` and
:mod:`envkit.workers.ray_actors` build on it, and :mod:`envkit.workers` re-exports all of them.
"""

from __future__ import annotations

import math
import numbers
import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from envkit.core import Env
from envkit.core.env import Ending
from envkit.core.messages import Message

WORKER_KINDS = ("threads", "processes", "ray")


class EnvTimeout(TimeoutError):
    """An env call did not finish before its deadline. ``detail`` says more when there is more to say (e.g. that the
    call never started: every worker was stuck)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(f"{message} ({detail})" if detail else message)
        self.detail = detail


class EnvExited(RuntimeError):
    """An env call raised ``SystemExit`` (or another ``BaseException`` that is not an ``Exception``): it ends the
    episode, not the run."""


class EnvWorkerLost(RuntimeError):
    """The worker holding an env died (a crash in a native extension, killed by the OS, …) during a call."""


class ScoreError(ValueError):
    """An env broke the score contract: ``score()`` returned something other than a finite number in [0, 1], or
    ``step`` a reward that is not a finite number. It ends the episode as an error (out of the loss, counted), never a
    reward. The message names the env class and the value."""


class LeakedThreadsError(RuntimeError):
    """Too many env calls that timed out are still running on abandoned threads (:class:`ThreadWorkers` cannot stop
    them): the message (one line) recommends process workers, which kill a hung call."""


def checked_score(value: Any, env: str) -> float:
    """``value`` (what ``env``'s ``score()`` returned) as a float; :class:`ScoreError` unless it is a real number
    (not a bool, a string or None), finite and in [0, 1]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        # NaN fails the range test too
        raise ScoreError(f"{env}.score() returned {value!r}: a score must be a finite number in [0, 1]")
    return float(value)


def checked_reward(value: Any, env: str) -> float:
    """``value`` (a step reward of ``env``) as a float; :class:`ScoreError` unless it is a finite real number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ScoreError(f"{env}.step() returned the reward {value!r}: a step reward must be a finite number")
    return float(value)


def score_outcome(env: Any, ending: Ending | str | None = None) -> float:
    """Tell ``env`` how its episode ended (``env.end(ending)``, when given), then run ``env.score()`` and check it
    (:func:`checked_score`; shared by every kind of worker).

    Args:
        env: The env, where it lives.
        ending: How the episode ended (an :class:`~envkit.core.env.Ending` or its value), or ``None`` to read the score
            without ending the episode.

    Returns:
        The checked score.
    """
    if ending is not None:
        env.end(Ending(ending))
    return checked_score(env.score(), type(env).__name__)


def checked_components(value: Any, env: str) -> dict[str, float]:
    """``value`` (what ``env``'s ``score_components()`` returned) as ``{name: float}``; :class:`ScoreError` unless it
    is a mapping of strings to finite real numbers."""
    if not isinstance(value, Mapping):
        raise ScoreError(f"{env}.score_components() returned {value!r:.80}: it must be a dict of name -> number")
    components = {}
    for name, number in value.items():
        if not isinstance(name, str) or isinstance(number, bool) or not isinstance(number, numbers.Real):
            raise ScoreError(f"{env}.score_components() has {name!r}: {number!r:.40}; names: strings, values: numbers")
        if not math.isfinite(number):
            raise ScoreError(f"{env}.score_components() has {name!r}: {number!r}; a component must be finite")
        components[name] = float(number)
    return components


def has_score_components(env: Any) -> bool:
    """Whether ``env`` defines ``score_components()`` (beyond :class:`envkit.Env`'s empty default)."""
    method = getattr(type(env), "score_components", None)
    return callable(method) and method is not Env.score_components


def components_outcome(env: Any) -> dict[str, float]:
    """Run ``env.score_components()`` and check it (:func:`checked_components`; ``{}`` for an env without one)."""
    if not has_score_components(env):
        return {}
    return checked_components(env.score_components(), type(env).__name__)


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
        from envkit.registry import make  # importing envkit (any part) registers the built-in envs

        return make(self.spec, **self.config)


@runtime_checkable
class EnvSession(Protocol):
    """One episode's env, living in a worker.

    The score call carries how the episode ended (``ending``): the env's :meth:`~envkit.Env.end` runs right before
    its ``score()``, in the same call, so the ending reaches the env wherever it lives.

    A session may also have ``async score_components(*, timeout_s) -> dict[str, float]`` (``env.score_components()``,
    checked by :func:`checked_components`): envkit's own sessions do; the engine records none on a session without it.
    """

    async def reset(self, seed: int, *, timeout_s: float) -> tuple[list[Message], dict[str, Any], list[Any] | None]:
        """``env.reset(seed=seed)``: the opening messages, the reset info, and the env's tool schemas (or None)."""
        ...

    async def step(self, action: Message, *, timeout_s: float) -> StepOutcome:
        """``env.step(action)``."""
        ...

    async def score(self, *, timeout_s: float, ending: Ending | None = None) -> float:
        """``env.end(ending)`` (when ``ending`` is given), then ``env.score()``, checked (:func:`score_outcome`)."""
        ...

    async def transcript(self, *, timeout_s: float) -> list[Message]:
        """The env's full transcript (``env.messages``)."""
        ...

    def close(self) -> None:
        """Release the env and give its worker back (never blocks)."""
        ...


@runtime_checkable
class ClosingSession(Protocol):
    """An :class:`EnvSession` that can also close its env and say when it is closed. The rollout engine awaits it at
    an episode's end, so that the next episode's env is built only once this one is gone (an env that is a server
    session has freed it); on a session without it, the engine calls :meth:`EnvSession.close` and goes on."""

    async def aclose(self, *, timeout_s: float) -> None:
        """Close the env, as :meth:`EnvSession.close` does, and return once it is closed, or after ``timeout_s`` (a
        hung ``close()`` is abandoned). Raises nothing the env's ``close()`` raised. Calling it (or ``close``) again
        does nothing."""
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
    observation, reward, terminated, truncated, info = checked_step(env, action)
    messages = list(getattr(env, "messages", []))
    history = messages[: len(messages) - len(observation)]
    return StepOutcome(observation, reward, terminated, truncated, info, history)


def reset_outcome(env: Any, seed: int) -> tuple[list[Message], dict[str, Any], list[Any] | None]:
    """Run ``env.reset(seed=seed)`` and return the opening messages, the info and the env's tools."""
    opening, info = env.reset(seed=seed)
    return list(opening), dict(info), list(getattr(env, "tools", None) or []) or None


@dataclass
class StepDelta:
    """What a step in another process sends back: its outcome and only the transcript messages the caller does not
    have yet, so a step's bytes do not grow with the history (the caller keeps the transcript: :class:`HistoryMirror`).
    """

    observation: list[Message]
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]
    appended: list[Message]
    """Messages the env added to its transcript before ``observation`` since the last sync (usually the action)."""
    replaced: list[Message] | None = None
    """The env's whole transcript before ``observation`` when it changed a message the caller already has (an env
    that rewrites or drops earlier messages); then ``appended`` is empty."""


class HistoryMirror:
    """The transcript one side of a remote session knows, synced by :class:`StepDelta` objects.

    Where the env lives, :meth:`delta` compares the env's transcript to what was sent so far (each message compared
    by value against a shallow copy taken when it was sent: a message replaced or a key reassigned is caught; a nested
    list mutated in place is not) and says what to send; in the caller, :meth:`apply` rebuilds the history from it.
    """

    def __init__(self, messages: list[Message] | None = None) -> None:
        self.messages: list[Message] = [dict(m) for m in messages or []]

    def delta(self, env: Any, outcome: tuple[Any, ...]) -> StepDelta:
        """The :class:`StepDelta` of a step of ``env`` (``outcome``: its checked step result), then count its
        transcript as sent."""
        observation, reward, terminated, truncated, info = outcome
        transcript = list(getattr(env, "messages", []))
        history = transcript[: len(transcript) - len(observation)]
        known = len(self.messages)
        if len(history) >= known and history[:known] == self.messages:
            delta = StepDelta(observation, reward, terminated, truncated, info, history[known:])
            self.messages += [dict(m) for m in transcript[known:]]
        else:
            delta = StepDelta(observation, reward, terminated, truncated, info, [], history)
            self.messages = [dict(m) for m in transcript]
        return delta

    def apply(self, delta: StepDelta) -> StepOutcome:
        """The full :class:`StepOutcome` of ``delta``, extending the transcript kept here."""
        if delta.replaced is not None:
            self.messages = list(delta.replaced)
        else:
            self.messages += delta.appended
        history = list(self.messages)
        self.messages += delta.observation
        return StepOutcome(delta.observation, delta.reward, delta.terminated, delta.truncated, delta.info, history)


def checked_step(env: Any, action: Message) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
    """Run ``env.step(action)``; its observation, checked reward, flags and info as plain data."""
    observation, reward, terminated, truncated, info = env.step(action)
    return list(observation), checked_reward(reward, type(env).__name__), bool(terminated), bool(truncated), dict(info)
