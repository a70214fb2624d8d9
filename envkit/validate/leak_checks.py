"""The state-leak check: one seed played twice, with writing episodes in between, must play out the same — and when it
does not, the state that leaked is named: a class attribute, a module global, or an object two instances share.

What leaks is found two ways. :func:`shared_state` fingerprints the state every instance can reach without being
given it (the env class's attributes and its modules' globals, walked into containers and objects; a SQLite
connection by its count of changed rows), so a write into it shows as a changed fingerprint. :func:`shared_objects`
finds the mutable objects two instances hold the very same of (a connection, a cached dict handed out by a
function's cache), which no fingerprint of the class or module reaches."""

from __future__ import annotations

import contextlib
import copy
import sqlite3
import sys
import types
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from envkit.core.env import Env
from envkit.validate.context import EnvContext
from envkit.validate.driver import Driver, Policy, Run, turn_limit
from envkit.validate.policies import oracle_policy, random_policy
from envkit.validate.report import FAIL, PASS, SKIP, Outcome, around, dump, first_difference

STATE_LEAK = "state-leak"
"""The root cause the leak check reports: episodes change state that later episodes or other instances read."""
MAX_ITEMS = 2000
"""At most this many items of one container are fingerprinted."""
MAX_DEPTH = 6
"""How deep containers and objects are walked."""
_FRAMEWORK = ("builtins", "abc", "typing", "gymnasium", "envkit.core", "pydantic")
"""Modules whose classes and globals are not the env author's state."""
_IMMUTABLE = (str, bytes, int, float, complex, bool, type(None), range, frozenset)


def _framework(module: str) -> bool:
    return any(module == m or module.startswith(f"{m}.") for m in _FRAMEWORK)


def _plain(value: Any, depth: int = 0, seen: set[int] | None = None) -> Any:
    """A JSON-able fingerprint of ``value``'s contents (objects by their attributes, a SQLite connection by
    ``total_changes``), cut at :data:`MAX_DEPTH` and :data:`MAX_ITEMS`."""
    seen = set() if seen is None else seen
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    if isinstance(value, sqlite3.Connection):
        try:
            return f"<sqlite3.Connection total_changes={value.total_changes}>"
        except sqlite3.ProgrammingError:
            return "<sqlite3.Connection closed>"
    if depth > MAX_DEPTH or id(value) in seen or _opaque(value):
        return f"<{type(value).__name__}>"
    seen.add(id(value))
    try:
        if isinstance(value, dict):
            return {str(k): _plain(v, depth + 1, seen) for k, v in list(value.items())[:MAX_ITEMS]}
        if isinstance(value, (list, tuple, deque)):
            return [_plain(v, depth + 1, seen) for v in list(value)[:MAX_ITEMS]]
        if isinstance(value, (set, frozenset)):
            return sorted(dump(_plain(v, depth + 1, seen)) for v in list(value)[:MAX_ITEMS])
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            return {"__type__": type(value).__name__, **_plain(attributes, depth + 1, seen)}
        return f"<{type(value).__name__}>"
    finally:
        seen.discard(id(value))


def _opaque(value: Any) -> bool:
    """Values whose contents are code or machinery, not episode state."""
    return isinstance(
        value,
        (
            type,
            types.ModuleType,
            types.FunctionType,
            types.BuiltinFunctionType,
            types.MethodType,
            property,
            staticmethod,
            classmethod,
        ),
    ) or (callable(value) and not hasattr(value, "__dict__") and not isinstance(value, sqlite3.Connection))


def _state_names(env: Env) -> Iterator[tuple[str, Any]]:
    """``(name, value)`` of what every instance of ``env``'s class reaches without being given it: the attributes of
    its classes and the globals of their modules (not envkit's, Gymnasium's or Python's own)."""
    modules = []
    for klass in type(env).__mro__:
        if _framework(klass.__module__):
            continue
        if klass.__module__ not in modules:
            modules.append(klass.__module__)
        for name, value in vars(klass).items():
            if not name.startswith("__") and not _opaque(value):
                yield f"{klass.__qualname__}.{name} (on the class)", value
    for module_name in modules:
        module = sys.modules.get(module_name)
        for name, value in list(vars(module).items()) if module is not None else []:
            if not name.startswith("__") and not _opaque(value) and not isinstance(value, types.ModuleType):
                yield f"{module_name}.{name} (a module global)", value


def shared_state(env: Env) -> dict[str, str]:
    """A fingerprint of each class attribute and module global ``env``'s instances share (see :func:`_state_names`):
    compare two to see which an episode wrote into.

    Args:
        env: An instance of the env (its class and modules are read, not its own attributes).

    Returns:
        ``{name: fingerprint}``.
    """
    state = {}
    for name, value in _state_names(env):
        with contextlib.suppress(Exception):  # a value whose attributes cannot be read is not what leaks
            state[name] = dump(_plain(value))
    return state


def changed_state(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """What changed between two :func:`shared_state` fingerprints, each as ``name (… old … vs … new …)``."""
    changes = []
    for name, old in before.items():
        new = after.get(name)
        if new is not None and new != old:
            at = next((i for i, (p, q) in enumerate(zip(old, new, strict=False)) if p != q), min(len(old), len(new)))
            changes.append(f"{name} ({around(old, at, 20, 40)} vs {around(new, at, 20, 40)})")
    return changes


def _mutable(value: Any) -> bool:
    return not isinstance(value, _IMMUTABLE) and not _opaque(value)


def _reachable(env: Env) -> dict[int, tuple[str, Any]]:
    """The mutable objects ``env``'s own attributes hold, by identity: ``{id: (path, object)}`` (two levels deep)."""
    found: dict[int, tuple[str, Any]] = {}
    frontier: list[tuple[str, Any]] = [(f"self.{k}", v) for k, v in vars(env).items()]
    for _ in range(3):
        following: list[tuple[str, Any]] = []
        for path, value in frontier:
            if not _mutable(value) or id(value) in found:
                continue
            found[id(value)] = (path, value)
            if isinstance(value, dict):
                following += [(f"{path}[{k!r}]", v) for k, v in list(value.items())[:50]]
            elif hasattr(value, "__dict__") and not isinstance(value, Env):
                following += [(f"{path}.{k}", v) for k, v in list(vars(value).items())[:50]]
        frontier = following
    return found


def held_state(env: Env) -> dict[int, str]:
    """A fingerprint of each mutable object ``env``'s attributes hold, by identity: taken before episodes, it tells
    :func:`shared_objects` which shared objects they wrote into."""
    state = {}
    for key, (_, value) in _reachable(env).items():
        with contextlib.suppress(Exception):
            state[key] = dump(_plain(value))
    return state


def shared_objects(first: Env, second: Env, before: dict[int, str] | None = None) -> list[str]:
    """The mutable objects two instances hold the very same of (``self.db (a sqlite3.Connection)``): those written
    into since ``before`` (:func:`held_state` of ``first``) first, then resources before plain containers. A fresh
    instance should share nothing an episode writes into.

    Args:
        first: One instance.
        second: Another instance of the same env.
        before: :func:`held_state` of ``first`` before the episodes, or ``None``.
    """
    ours = _reachable(first)
    shared = [
        (key, path, value)
        for key, (path, value) in _reachable(second).items()
        if key in ours
        and value is not first
        and (isinstance(value, (dict, list, set, sqlite3.Connection)) or not _framework(type(value).__module__))
    ]

    def written(key: int, value: Any) -> bool:
        with contextlib.suppress(Exception):
            return before is not None and key in before and before[key] != dump(_plain(value))
        return False

    plain = (dict, list, set, tuple, deque)
    shared.sort(
        key=lambda item: (not written(item[0], item[2]), isinstance(item[2], plain), item[1].count("."), item[1])
    )
    return [
        f"{path} (a {type(value).__qualname__}{', written by the episodes' if written(key, value) else ''})"
        for key, path, value in shared
    ]


def _play(driver: Driver, env: Env, run: Run, policy: Policy | None, actions: list[Any]) -> bool:
    """Play ``run`` on ``env`` after it was reset: ``actions`` replayed, or ``policy``'s live actions up to the turn
    limit; keeps a copy of the transcript on ``run``. ``False`` when the env raised or hung."""
    for index in range(len(actions) if policy is None else turn_limit(env)):
        try:
            action = copy.deepcopy(actions[index]) if policy is None else driver.call(policy, env, run)[0]
        except Exception as error:
            run.fault = driver.fault("oracle", run.policy, run.seed, None, error)
            break
        if action is None or not driver.step(env, run, action):
            break
    run.messages = copy.deepcopy(list(getattr(env, "messages", [])))
    return run.fault is None


@dataclass
class _Trial:
    """One seed played, written to by another episode, then replayed: what :func:`check_leaks` compares."""

    first: Run
    again: Run | None = None
    changes: list[str] = field(default_factory=list)
    sharing: list[str] = field(default_factory=list)
    skipped: str = ""


def _trial(ctx: EnvContext, seed: int, *, watch: bool) -> _Trial:
    """Play ``seed`` (the oracle, else the random policy), then the random policy on it on a second instance (a
    writing episode), then the first episode's actions replayed on a third. ``watch``: fingerprint the shared state
    around the episodes and find the objects two instances share (slow on an env with large module data, so only
    done to name a leak already seen)."""
    driver = ctx.driver
    trial = _Trial(Run("leak: first episode", seed))
    probe = driver.new_env(trial.first.policy)
    if probe is None or not driver.reset(probe, trial.first):
        trial.skipped = f"seed {seed} could not be reset (see the other checks)"
        return trial
    before, held = (shared_state(probe), held_state(probe)) if watch else ({}, {})  # after reset: not an episode's
    policy = oracle_policy if ctx.has_oracle else random_policy
    if not _play(driver, probe, trial.first, policy, []) or not trial.first.actions:
        trial.skipped = f"the first episode of seed {seed} did not play (see the other checks)"
        return trial
    writer = Run("leak: writing episode", seed)
    other = driver.new_env(writer.policy, alongside=1)
    if other is not None and driver.reset(other, writer):
        _play(driver, other, writer, random_policy, [])
    if watch:
        trial.changes = changed_state(before, shared_state(probe))
        trial.sharing = shared_objects(probe, other, held) if other is not None else []
    trial.again = _replayed(driver, trial.first)
    if driver.hang is not None:
        trial.skipped = "not finished: the env hung (see check 13)"
    return trial


def _replayed(driver: Driver, run: Run) -> Run | None:
    """``run``'s actions replayed on a fresh instance (``None`` when it could not be built or reset)."""
    again = Run("leak: replayed", run.seed)
    env = driver.new_env(again.policy)
    if env is None or not driver.reset(env, again):
        return None
    _play(driver, env, again, None, run.actions)
    return again


def _same(a: Run | None, b: Run | None) -> bool:
    return a is not None and b is not None and dump(a.messages) == dump(b.messages) and a.scores == b.scores


def check_leaks(ctx: EnvContext) -> Outcome:
    """A seed no other check plays is played by the oracle (the random policy without one), then by the random
    policy on another instance (a writing episode), then the first episode's actions are replayed on a fresh
    instance: it must play out as the first. When it does not, and a second replay plays out like the first replay
    (the state settled after being written) or a class attribute, module global or object shared by instances
    changed, state leaks between episodes: the FAIL names it."""
    seed = max(ctx.seeds) + 1  # untouched by the other checks: caches keyed by seed hold nothing of it yet
    trial = _trial(ctx, seed, watch=False)
    if trial.skipped or trial.again is None:
        return Outcome(SKIP, trial.skipped or "a third instance could not be reset (see the other checks)")
    first, again = trial.first, trial.again
    if _same(first, again):
        return Outcome(
            PASS,
            f"seed {seed} replayed after two episodes of it plays out as the first time ({len(first.actions)} actions)",
        )
    settled = _same(_replayed(ctx.driver, first), again)
    where = first_difference(first.messages, again.messages)
    watched = _trial(ctx, seed + 1, watch=True)  # a fresh seed again, this time watching the shared state
    evidence = _evidence(watched.changes, watched.sharing, settled)
    if evidence is None:
        return Outcome(
            SKIP,
            f"seed {seed} replayed differs from its first episode (at {where}) and again on every replay, with no "
            "shared state changed: nondeterminism, which the replay check (5) reports",
        )
    return Outcome(
        FAIL,
        f"state leaks between episodes: seed {seed} replayed after episodes of it plays out differently (at {where}); "
        f"{evidence}",
        "build every episode's state in reset() from the seed alone: copy cached task data before an episode writes "
        "into it (copy.deepcopy), keep databases, connections and counters on self, not on the class, in module "
        "globals or in a function's cache",
        {"changed": watched.changes[:10], "shared_objects": watched.sharing[:10]},
        cause=STATE_LEAK,
    )


def _evidence(changes: list[str], sharing: list[str], settled: bool) -> str | None:
    """The leaked state, for the FAIL line; ``None`` when nothing points at a leak."""
    if changes:
        more = f" (and {len(changes) - 1} more)" if len(changes) > 1 else ""
        return f"episodes wrote into {changes[0]}{more}"
    if sharing:
        return f"two fresh instances share {sharing[0]}"
    if settled:
        return (
            "later replays agree with each other, not with the first episode: an episode wrote into state kept "
            "outside the instance (a function's cache, another module, a server)"
        )
    return None


def interleaved_cause(driver: Driver, first: Run, second: Run) -> str:
    """What two instances share, for the isolation check's FAIL once stepping them interleaved changed an episode:
    the two episodes are interleaved again on fresh instances, watching the class and module state and the objects
    both hold. ``"; both write into …"``, ``"; they share …"``, or ``""`` when nothing is found.

    Args:
        driver: The validation's driver.
        first: One recorded episode.
        second: The episode of another seed it was interleaved with.
    """
    runs = [Run("isolation: watched", first.seed), Run("isolation: watched", second.seed)]
    envs = [driver.new_env(runs[0].policy)]
    if envs[0] is None or not driver.reset(envs[0], runs[0]):
        return ""
    envs.append(driver.new_env(runs[1].policy, alongside=1))
    if envs[1] is None or not driver.reset(envs[1], runs[1]):
        return ""
    before, held = shared_state(envs[0]), held_state(envs[0])
    live = [True, True]
    for index in range(max(len(first.actions), len(second.actions))):
        for k, original in enumerate((first, second)):
            if live[k] and index < len(original.actions):
                live[k] = driver.step(envs[k], runs[k], copy.deepcopy(original.actions[index]))
    changes = changed_state(before, shared_state(envs[0]))
    if changes:
        return f"; both write into {changes[0]}"
    sharing = shared_objects(envs[0], envs[1], held)
    return f"; they share {sharing[0]}" if sharing else ""
