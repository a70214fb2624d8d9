"""Plays scripted episodes on fresh envs: every env call under a timeout, every exception and bad score recorded."""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from envkit.core.env import Env
from envkit.core.messages import Message, message_problems
from envkit.validate.report import short

MAX_TERMINATION_STEPS = 200
"""The most steps an episode is played for when the env's ``max_turns`` is not a usable bound."""
CALL_TIMEOUT_S = 30.0
"""How long one constructor / reset / step / score / oracle call may take before the env counts as hung."""

Policy = Callable[[Env, "Run"], Any]
"""A scripted policy: the next action for ``env`` in ``run``, or ``None`` to stop."""


@dataclass
class Fault:
    """An exception raised by the env."""

    where: str
    policy: str
    seed: int | None
    action: str
    error: str
    trace: str
    returned: bool = False
    """The call did not raise but returned a value of the wrong shape (``error`` says what it returned)."""

    def line(self) -> str:
        """A one-line description."""
        action = f" on action {self.action}" if self.action else ""
        what = self.error if self.returned else f"raised {self.error}"
        return f"{self.where}(){action} [{self.policy}, seed {self.seed}] {what}"


@dataclass
class Run:
    """One episode played by a scripted policy."""

    policy: str
    seed: int
    messages: list[Message] = field(default_factory=list)
    actions: list[Any] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    steps: int = 0
    ended: bool = False
    truncated: bool = False
    fault: Fault | None = None
    no_oracle: bool = False
    observed: list[int | None] = field(default_factory=list)
    """How many messages reset() and then each step() returned (``None``: not a list), in order."""
    silent_turns: list[int] = field(default_factory=list)
    """Turns whose step() returned no message while the episode went on."""

    @property
    def score(self) -> float | None:
        """The final score, or ``None`` when the episode crashed before one could be read."""
        return self.scores[-1] if self.scores else None


class Hung(Exception):
    """An env call did not return within the timeout (the call is abandoned on its daemon thread)."""


class BadReturn(Exception):
    """An env call returned a value of the wrong shape; the message says what it returned and what was expected."""


def unpack_reset(result: Any) -> tuple[Any, Any]:
    """``reset()``'s ``(observation, info)``; :class:`BadReturn` when it returned anything but a pair whose first
    item is a list (a bare list of messages included: two messages would otherwise unpack as a pair)."""
    if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], list):
        return result[0], result[1]
    raise BadReturn(f"returned {shape(result)}, expected (messages, info)")


def unpack_step(result: Any) -> tuple[Any, Any, Any, Any, Any]:
    """``step()``'s ``(observation, reward, terminated, truncated, info)``; :class:`BadReturn` for anything else."""
    if isinstance(result, (tuple, list)) and len(result) == 5:
        return result[0], result[1], result[2], result[3], result[4]
    raise BadReturn(f"returned {shape(result)}, expected (observation, reward, terminated, truncated, info)")


def shape(value: Any) -> str:
    """What a value is, for a report line: ``a list of 2 messages``, ``a tuple of 4 items``, ``a dict``."""
    name = type(value).__name__
    if isinstance(value, (list, tuple)):
        dicts = value and all(isinstance(v, dict) and "role" in v for v in value)
        items = "message" if dicts else "item"
        return f"a {name} of {len(value)} {items}{'' if len(value) == 1 else 's'}"
    return "None" if value is None else f"a {name}"


def timed_call(function: Callable[..., Any], timeout_s: float, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``function(*args, **kwargs)`` on a daemon thread: its result and its duration in seconds.

    Exceptions are re-raised here; :class:`Hung` when it has not returned after ``timeout_s`` (a daemon thread, so a
    call that never returns cannot keep the process alive).
    """
    outcome: dict[str, Any] = {}

    def target() -> None:
        start = time.perf_counter()
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as error:
            outcome["error"] = error
        outcome["seconds"] = time.perf_counter() - start

    thread = threading.Thread(target=target, name="envkit-validate-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise Hung(f"did not return within {timeout_s:g} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"], outcome["seconds"]


class Driver:
    """Plays scripted episodes, catching every exception from the env and checking every score.

    Every env call runs with a timeout (``call_timeout_s``); after the first call that hangs, :attr:`hang` holds it
    and the driver touches no env again (each further episode ends at once).
    """

    def __init__(self, factory: Callable[[], Env], call_timeout_s: float = CALL_TIMEOUT_S) -> None:
        self.factory = factory
        self.call_timeout_s = call_timeout_s
        self.faults: list[Fault] = []
        self.bad_scores: list[str] = []
        self.bad_observations: list[str] = []
        self.reset_times: list[float] = []
        self.step_times: list[float] = []
        self.hang: Fault | None = None
        self.played: list[Run] = []
        """Every episode played by a scripted policy or the fuzzer, with its transcript (the chat-template check)."""
        self._open: list[Env] = []  # envs not closed yet, oldest first

    def call(self, function: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
        """One env call with the timeout; raises :class:`Hung` at once when an earlier call hung."""
        if self.hang is not None:
            raise Hung("not called: an earlier env call hung")
        return timed_call(function, self.call_timeout_s, *args, **kwargs)

    def new_env(self, policy: str, *, alongside: int = 0) -> Env | None:
        """A fresh env, or ``None`` (recorded as a fault) when the constructor raises or hangs.

        Every env the driver holds is closed first except the ``alongside`` newest (a check that steps two instances
        together asks for one alongside its second): validate holds no more envs at once than the check needs, so
        an env that is a server session (OpenEnv, MCP) fits a server with a single session slot, and never runs one
        out of slots as waiting for the garbage collector's finalizers would."""
        self._close_all_but(alongside)
        try:
            env = self.call(self.factory)[0]
        except Exception as error:
            self.fault("__init__", policy, None, None, error)
            return None
        self._open.append(env)
        return env

    def adopt(self, env: Env) -> None:
        """Hold ``env`` (made elsewhere, e.g. the run's first instance) as one of the driver's envs: it is closed
        when a check needs a new env, or by :meth:`close_all`."""
        self._open.append(env)

    def close_all(self) -> None:
        """Close every env the driver holds that is still open."""
        self._close_all_but(0)

    def _close_all_but(self, newest: int) -> None:
        while len(self._open) > newest:
            self._close(self._open.pop(0))

    def _close(self, env: Env) -> None:
        close = getattr(env, "close", None)
        if close is None or self.hang is not None:  # after a hang the driver touches no env again
            return
        with contextlib.suppress(Exception):  # a failing close() is not what validate judges
            self.call(close)

    def reset(self, env: Env, run: Run) -> bool:
        """Reset ``env`` for ``run``; ``False`` when it raised or hung."""
        try:
            result, seconds = self.call(env.reset, seed=run.seed)
            observation, _ = unpack_reset(result)
        except Exception as error:
            explained = None if isinstance(error, Hung) else self.reset_shape(run.seed)
            run.fault = self.fault("reset", run.policy, run.seed, None, explained or error)
            return False
        if not all(isinstance(m, dict) for m in observation):
            explained = self.reset_shape(run.seed)
            if explained is not None:
                run.fault = self.fault("reset", run.policy, run.seed, None, explained)
                return False
        self.reset_times.append(seconds)
        run.observed = [len(observation) if isinstance(observation, list) else None]
        self._check_observation(observation, run, "reset")
        return self._score(env, run)

    def reset_shape(self, seed: int) -> BadReturn | None:
        """Why ``reset(seed)`` failed, when the env's own ``reset`` returns the wrong shape: :class:`envkit.Env`
        wraps a subclass's ``reset`` and unpacks ``(messages, info)`` itself, so a bare list of messages raises there
        (one or three messages) or comes out mangled (two: the first as the messages, the second as the info). The
        unwrapped ``reset`` is called on a fresh env to see what it returns; ``None`` when that shows nothing wrong."""
        self._close_all_but(0)  # the env whose reset failed is done with
        try:
            env = self.call(self.factory)[0]
            self._open.append(env)
            own = inspect.unwrap(type(env).reset)
            if own is type(env).reset:
                return None
            unpack_reset(self.call(own, env, seed=seed)[0])
        except BadReturn as error:
            return error
        except Exception:
            return None
        return None

    def step(self, env: Env, run: Run, action: Any) -> bool:
        """One step; ``False`` when the episode is over or the env raised or hung."""
        run.actions.append(action)
        try:
            result, seconds = self.call(env.step, action)
            observation, _, terminated, truncated, _ = unpack_step(result)
        except Exception as error:
            run.fault = self.fault("step", run.policy, run.seed, action, error)
            return False
        self.step_times.append(seconds)
        run.steps += 1
        run.observed.append(len(observation) if isinstance(observation, list) else None)
        if isinstance(observation, list) and not observation and not (terminated or truncated):
            run.silent_turns.append(run.steps)
        self._check_observation(observation, run, "step")
        if not self._score(env, run):
            return False
        if terminated or truncated:
            run.ended, run.truncated = True, bool(truncated)
            return False
        return True

    def play(self, policy_name: str, policy: Policy, seed: int, max_steps: int | None = None) -> Run:
        """A whole episode with ``policy`` on a fresh env."""
        run = Run(policy_name, seed)
        env = self.new_env(policy_name)
        if env is None or not self.reset(env, run):
            return run
        limit = max_steps if max_steps is not None else turn_limit(env)
        for _ in range(limit):
            try:
                action = self.call(policy, env, run)[0]
            except Exception as error:
                run.fault = self.fault("oracle", policy_name, seed, None, error)
                break
            if action is None:
                run.no_oracle = run.steps == 0
                break
            if not self.step(env, run, action):
                break
        self.record(run, env)
        return run

    def record(self, run: Run, env: Env) -> None:
        """Keep a copy of ``env``'s transcript on ``run`` and ``run`` in :attr:`played`."""
        run.messages = copy.deepcopy(getattr(env, "messages", []))
        self.played.append(run)

    def replay(self, actions: list[Any], seed: int, label: str) -> Run:
        """Replay recorded actions on a fresh env."""
        return self.replay_env(actions, seed, label)[0]

    def replay_env(self, actions: list[Any], seed: int, label: str) -> tuple[Run, Env | None]:
        """Replay recorded actions on a fresh env: the run, and the env in its final state (``None`` when the
        constructor failed)."""
        run = Run(label, seed)
        env = self.new_env(label)
        if env is not None and self.reset(env, run):
            for action in actions:
                if not self.step(env, run, copy.deepcopy(action)):
                    break
            run.messages = copy.deepcopy(getattr(env, "messages", []))
        return run, env

    def fault(self, where: str, policy: str, seed: int | None, action: Any, error: Exception) -> Fault:
        """Record an exception the env raised (its traceback is the one being handled) and return it."""
        returned = isinstance(error, BadReturn)
        text = str(error) if returned else f"{type(error).__name__}: {error}"
        fault = Fault(where, policy, seed, short(action), text, traceback.format_exc(), returned)
        if isinstance(error, Hung):
            if self.hang is not None:  # not a new finding: the env was abandoned after its first hang
                return self.hang
            self.hang = fault
        self.faults.append(fault)
        return fault

    def _score(self, env: Env, run: Run) -> bool:
        try:
            value = self.call(env.score)[0]
        except Exception as error:
            run.fault = self.fault("score", run.policy, run.seed, run.actions[-1] if run.actions else None, error)
            return False
        if not is_valid_score(value):
            self.bad_scores.append(f"score() = {value!r} after {run.steps} steps [{run.policy}, seed {run.seed}]")
            run.scores.append(float("nan"))
            return True
        run.scores.append(float(value))
        return True

    def _check_observation(self, observation: Any, run: Run, where: str) -> None:
        problems = (
            [f"observation is a {type(observation).__name__}, not a list of messages"]
            if not isinstance(observation, list)
            else [p for m in observation for p in message_problems(m)]
        )
        if problems:
            self.bad_observations.append(f"{where} [{run.policy}, seed {run.seed}]: {problems[0]}")


def is_valid_score(value: Any) -> bool:
    """Whether ``value`` is a finite number (not a bool) in [0, 1]."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return ok and 0.0 <= float(value) <= 1.0


def turn_limit(env: Env) -> int:
    """How many steps an episode of ``env`` is played for at most: a little past its ``max_turns``."""
    max_turns = getattr(env, "max_turns", 10)
    return min(int(max_turns), MAX_TERMINATION_STEPS) + 2 if isinstance(max_turns, int) else MAX_TERMINATION_STEPS
