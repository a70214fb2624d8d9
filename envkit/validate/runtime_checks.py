"""The runtime checks: the contract, seeding, determinism, isolation, robustness, score range, termination, copying
and latency — what makes an env safe to roll out at all."""

from __future__ import annotations

import contextlib
import copy
import inspect
import itertools
import pickle

import numpy as np

from envkit.core.env import Env
from envkit.core.messages import message_problems
from envkit.validate.context import EnvContext
from envkit.validate.driver import BadReturn, Driver, Fault, Run, unpack_reset
from envkit.validate.fuzz import fuzz_actions
from envkit.validate.leak_checks import changed_state, interleaved_cause, shared_objects, shared_state
from envkit.validate.policies import NOOP_POLICIES
from envkit.validate.report import (
    FAIL,
    PASS,
    RESET_BROKEN,
    RESET_NONDETERMINISTIC,
    SKIP,
    STEP_NONDETERMINISTIC,
    WARN,
    Outcome,
    around,
    dump,
    first_difference,
    first_different_message,
)
from envkit.validate.task_ids import check_task_ids, task_ids

SCORE_RAISES = "score-raises"
"""The root cause the score check reports: ``score()`` raised (the checks that read scores after it SKIP)."""
SLOW_STEP_MS = 20.0
"""A step whose median takes longer than this slows rollouts (a WARN of the latency check)."""


def check_contract(ctx: EnvContext) -> Outcome:
    """The class builds and has the contract's methods with the contract's signatures, and a usable ``max_turns``."""
    env = ctx.env
    problems = []
    if not isinstance(env, Env):
        problems.append(f"{type(env).__name__} does not subclass envkit.Env")
    for method, needed in (("reset", ("seed", "options")), ("step", ()), ("score", ())):
        function = getattr(env, method, None)
        if not callable(function):
            problems.append(f"no {method}() method")
            continue
        try:
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError):
            continue
        missing = [p for p in needed if p not in parameters]
        if missing:
            problems.append(f"{method}() lacks keyword argument(s) {', '.join(missing)}")
        required = [
            p
            for p in parameters.values()
            if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if method == "step" and len(required) != 1:
            problems.append(f"step() must take exactly one action argument, takes {len(required)}")
        if method == "score" and required:
            problems.append("score() must take no arguments")
    for method in ("step", "score"):
        if isinstance(env, Env) and getattr(type(env), method, None) is getattr(Env, method):
            problems.append(f"{method}() is not implemented")
    max_turns = getattr(env, "max_turns", None)
    if not isinstance(max_turns, int) or max_turns < 1:
        problems.append(f"max_turns must be a positive int, got {max_turns!r}")
    if problems:
        return Outcome(
            FAIL,
            "; ".join(problems),
            "subclass envkit.Env (or ToolEnv) and implement reset(*, seed=None, options=None), step(action), score()",
        )
    oracle = "with an oracle()" if type(env).oracle is not Env.oracle else "without oracle()"
    return Outcome(PASS, f"{type(env).__name__} builds; reset/step/score present, {oracle}")


class _Malformed(Exception):
    """reset() returned messages that are not dicts, for a reason other than a wrong return shape."""


def check_reset(ctx: EnvContext) -> Outcome:
    """Well-formed, seeded, varied. Variety counts distinct opening messages, or — for tasks that differ only in
    hidden state (a secret number) — distinct transcripts of policies whose actions do not depend on the seed: the
    oracle's (it acts on the task), else the no-op policies' together (the random policy's own draws are seeded by
    the episode seed, so its transcripts differ on every seed whatever the env does)."""
    driver, seeds = ctx.driver, ctx.seeds
    transcripts = (
        {r.seed: dump(r.messages) for r in ctx.runs["oracle"]}
        if ctx.has_oracle
        else {
            runs[0].seed: dump([run.messages for run in runs])
            for runs in zip(*(ctx.runs[policy] for policy in NOOP_POLICIES), strict=True)
        }
    )
    openings: dict[int, str] = {}
    infos: dict[int, object] = {}
    for seed in seeds:
        results = []
        for _ in range(2):
            env = driver.new_env("reset")
            if env is None:
                return Outcome(FAIL, "the constructor raised on a second instance", "see the fault details")
            try:
                results.append(unpack_reset(env.reset(seed=seed)))
                if not all(isinstance(m, dict) for m in results[-1][0]):
                    raise driver.reset_shape(seed) or _Malformed()
            except _Malformed:
                pass  # messages that are not dicts: reported below with the other message problems
            except Exception as error:
                error = error if isinstance(error, BadReturn) else driver.reset_shape(seed) or error
                fault = driver.fault("reset", "reset", seed, None, error)
                hint = (
                    "return the opening messages and an info dict: `return messages, {}`"
                    if isinstance(error, BadReturn)
                    else "reset() must not raise for any seed"
                )
                return Outcome(FAIL, fault.line(), hint, cause=RESET_BROKEN)
        observation, info = results[0]
        problems = (
            [p for m in observation for p in message_problems(m)]
            if isinstance(observation, list)
            else [f"reset() returned a {type(observation).__name__}, not a list of messages"]
        )
        if not isinstance(info, dict):
            problems.append(f"info is a {type(info).__name__}, not a dict")
        if isinstance(observation, list) and not observation:
            problems.append("no opening messages")
        if problems:
            return Outcome(
                FAIL,
                f"seed {seed}: {problems[0]}",
                'return [{"role": "system"|"user", "content": str}, ...], {} from reset()',
                cause=RESET_BROKEN,
            )
        if dump(results[0]) != dump(results[1]):
            (first, first_info), (second, second_info) = results
            where = (
                f"different opening messages at {first_difference(first, second)}"
                if dump(first) != dump(second)
                else f"different info ({short_diff(first_info, second_info)})"
            )
            return Outcome(
                FAIL,
                f"seed {seed}: reset(seed={seed}) on two fresh instances gave {where}{_written_by_reset(driver, seed)}",
                "draw all randomness from self.np_random after super().reset(seed=seed) — not from random, "
                "numpy.random, the clock, or state kept on the class",
                cause=RESET_NONDETERMINISTIC,
            )
        openings[seed], infos[seed] = dump(observation), info
    ids, bad_id = task_ids(infos)
    if bad_id is not None:
        return bad_id
    distinct = len(set(openings.values())) / len(openings)
    hidden = len(set(transcripts.values())) / len(openings)
    details = {"distinct_fraction": distinct, "distinct_transcripts_fraction": hidden}
    named = any(task_id is not None for task_id in ids.values())
    if max(distinct, hidden) * len(openings) <= 1 and not ctx.has_oracle and not named:  # named: its ids tell
        return Outcome(
            WARN,
            f"all {len(seeds)} seeds open alike and the no-op policies' episodes play out alike: without an oracle, "
            "a task held in the env's state (a secret number) cannot be seen, nor told from one task on every seed",
            "add oracle(), or name each task in reset()'s info['task_id']; if every seed really gives one task, "
            "derive it from self.np_random",
            details,
        )
    if max(distinct, hidden) * len(openings) <= 1 and ctx.has_oracle:
        return Outcome(
            FAIL,
            f"all {len(seeds)} seeds give the same task (same opening messages and the same episode)",
            "derive the task from the seed (self.np_random)",
            details,
        )
    if named:  # the env names its tasks: count those
        return check_task_ids(ctx, ids, openings, details)
    if max(distinct, hidden) < 0.8:
        return Outcome(
            WARN,
            f"only {max(distinct, hidden):.0%} of seeds give distinct tasks",
            "check that the task space is large enough",
            details,
        )
    if distinct >= 0.8:
        return Outcome(PASS, f"well-formed and seeded; {distinct:.0%} of seeds distinct", details=details)
    return Outcome(
        PASS,
        f"well-formed and seeded; openings repeat but {hidden:.0%} of seeds play out differently (hidden task state)",
        details=details,
    )


def _written_by_reset(driver: Driver, seed: int) -> str:
    """``"; reset() writes into …"``: the class attribute or module global a reset of ``seed`` on a fresh instance
    changes (an env that keeps its history there gives each instance another task); ``""`` when none changes."""
    env = driver.new_env("reset: watched")
    if env is None:
        return ""
    before = shared_state(env)
    try:
        driver.call(env.reset, seed=seed)
    except Exception:
        return ""
    changes = changed_state(before, shared_state(env))
    return f"; reset() writes into {changes[0]}" if changes else ""


def check_replay(ctx: EnvContext) -> Outcome:
    """The recorded episodes (the oracle's, else the random policy's) replayed on fresh envs give the same transcripts
    and scores."""
    driver, source = ctx.driver, ctx.source
    replayed = 0
    for run in source:
        if run.fault or not run.actions:
            continue
        replayed += 1
        again = driver.replay(run.actions, run.seed, f"replay of {run.policy}")
        if dump(again.messages) != dump(run.messages) or again.scores != run.scores:
            where = first_difference(run.messages, again.messages)
            index = first_different_message(run.messages, again.messages)
            opening = run.observed[0] if run.observed and run.observed[0] is not None else 0
            if index is not None and index < opening:
                cause, hint = RESET_NONDETERMINISTIC, "reset(seed=...) must give the same task every time"
            else:
                cause = STEP_NONDETERMINISTIC if index is not None else ""
                hint = (
                    "step() must depend only on the seed and the actions (no clock, no global random, no state kept "
                    "on the class or in module globals)"
                )
            return Outcome(
                FAIL,
                f"seed {run.seed}: replaying the {run.policy} actions on a fresh env diverged at {where}",
                hint,
                cause=cause,
            )
    if not replayed:
        return Outcome(SKIP, f"no {source[0].policy} episode was played without an exception: nothing to replay")
    return Outcome(PASS, f"{source[0].policy} actions replay identically on all seeds")


def short_diff(a: object, b: object) -> str:
    """Two values side by side, cut around their first differing character."""
    left, right = dump(a), dump(b)
    at = next((i for i, (p, q) in enumerate(zip(left, right, strict=False)) if p != q), min(len(left), len(right)))
    return f"{around(left, at)} vs {around(right, at)}"


def check_isolation(ctx: EnvContext) -> Outcome:
    """Two instances stepped interleaved play out exactly as one after the other."""
    driver, source = ctx.driver, ctx.source
    pairs = [(a, b) for a, b in itertools.pairwise(source) if a.actions and b.actions][:3]
    if not pairs:
        return Outcome(SKIP, "no recorded episodes to interleave")
    for first, second in pairs:
        runs = [Run("interleaved", first.seed), Run("interleaved", second.seed)]
        envs = [driver.new_env("isolation")]
        if envs[0] is None or not driver.reset(envs[0], runs[0]):
            return Outcome(FAIL, "the env crashed while interleaving two instances", "see the faults")
        faults = len(driver.faults)
        envs.append(driver.new_env("isolation", alongside=1))  # the only check that holds two envs at once
        if envs[1] is None or not driver.reset(envs[1], runs[1]):
            return _second_instance_failed(driver, second.seed, driver.faults[faults:])
        live = [True, True]
        for index in range(max(len(first.actions), len(second.actions))):
            for k, original in enumerate((first, second)):
                if live[k] and index < len(original.actions):
                    live[k] = driver.step(envs[k], runs[k], copy.deepcopy(original.actions[index]))
        for env, run, original in zip(envs, runs, (first, second), strict=True):
            if (
                dump(getattr(env, "messages", None)) != dump(original.messages)
                or run.scores[-1:] != original.scores[-1:]
            ):
                return Outcome(
                    FAIL,
                    f"seeds {first.seed} and {second.seed} stepped interleaved differ from one after the other "
                    f"(seed {original.seed}, at {first_difference(original.messages, env.messages)})"
                    f"{interleaved_cause(driver, first, second)}",
                    "keep episode state on self, not on the class or in module globals, and give every instance its "
                    "own database, connection and caches",
                )
    return Outcome(PASS, f"{len(pairs)} pairs of instances stepped interleaved match sequential runs")


def _second_instance_failed(driver: Driver, seed: int, faults: list[Fault]) -> Outcome:
    """The outcome when a second instance failed to start while a first one was open: a WARN when one alone starts
    (the env, or its server, holds one instance at a time: an OpenEnv server with ``max_concurrent_envs=1``),
    else the crash's FAIL."""
    alone = Run("isolation: one instance", seed)
    env = driver.new_env(alone.policy)  # the other instances are closed first
    if not faults or env is None or not driver.reset(env, alone):
        return Outcome(FAIL, "the env crashed while interleaving two instances", "see the faults")
    return Outcome(
        WARN,
        f"a second instance cannot start while another is open ({faults[0].line()}), one alone starts: the env (or "
        "its server) holds one instance at a time, so isolation between instances was not checked",
        "roll it out one episode at a time (--concurrency 1), or let its server hold more sessions (OpenEnv: "
        "max_concurrent_envs)",
    )


def check_fuzz(ctx: EnvContext) -> Outcome:
    """Malformed and adversarial actions are answered with observations, never with an exception."""
    driver, seed = ctx.driver, ctx.seeds[0]
    actions = fuzz_actions(ctx.env)
    before_obs = len(driver.bad_observations)
    crashed = []
    played = 0
    for label, action in actions:
        run = Run(f"fuzz: {label}", seed)
        fresh = driver.new_env(run.policy)
        if fresh is None or not driver.reset(fresh, run):
            continue
        played += 1
        if driver.step(fresh, run, copy.deepcopy(action)):
            driver.step(fresh, run, "Thanks, please continue.")
        driver.record(run, fresh)
        if run.fault:
            crashed.append(run.fault)
    bad_obs = driver.bad_observations[before_obs:]
    if not played:
        return Outcome(SKIP, "no fuzzing episode could start: the env failed before the first action")
    if crashed:
        return Outcome(
            FAIL,
            f"{len(crashed)}/{len(actions)} malformed actions raised; first: {crashed[0].line()}",
            "turn bad input into an observation (ToolEnv returns tool errors; raise ToolError in tools)",
            {"faults": [f.line() for f in crashed]},
        )
    if bad_obs:
        return Outcome(FAIL, f"malformed observations: {bad_obs[0]}", "return lists of chat messages")
    return Outcome(PASS, f"{len(actions)} malformed actions all answered with observations")


def check_scores(ctx: EnvContext) -> Outcome:
    """Every score read so far, after every step of every episode, was a finite number in [0, 1]."""
    driver = ctx.driver
    if driver.bad_scores:
        return Outcome(
            FAIL,
            f"{len(driver.bad_scores)} bad scores; first: {driver.bad_scores[0]}",
            "clip and guard score(): it is read after every step",
            {"bad": driver.bad_scores[:20]},
        )
    if any(f.where == "score" for f in driver.faults):
        fault = next(f for f in driver.faults if f.where == "score")
        return Outcome(
            FAIL, fault.line(), "score() must work in every state, right after reset() too", cause=SCORE_RAISES
        )
    return Outcome(PASS, "every score read after every step of every policy was finite and in [0, 1]")


def check_copy(ctx: EnvContext) -> Outcome:
    """A fresh env deep-copies and pickles (process pools ship envs that way), and a deep copy of a reset env shares
    nothing an episode writes into with the original (demonstrations play the oracle on copies)."""
    ctx.driver.close_all()  # a copy of a server env holds a session of its own: at most two envs at once here
    made: list[Env] = []
    problem = None
    try:
        made.append(ctx.factory())
        for clone in (copy.deepcopy, lambda env: pickle.loads(pickle.dumps(env))):
            made.append(clone(made[0]))
            _close_quietly(made.pop())
    except Exception as error:
        problem = f"a fresh env cannot be copied: {type(error).__name__}: {error}"
    finally:
        for env in made:
            _close_quietly(env)
    shared = _copy_shares_state(ctx)
    if shared:
        return Outcome(
            FAIL,
            shared,
            "a deep copy must own everything an episode writes: give __deepcopy__ (or __getstate__) a new database "
            "or connection for the copy instead of the original's",
        )
    if problem:
        return Outcome(WARN, problem, "keep locks, open files and lambdas out of __init__ (process pools pickle envs)")
    return Outcome(PASS, "a fresh env deep-copies and pickles; a deep copy of a reset env plays apart from it")


def _copy_shares_state(ctx: EnvContext) -> str:
    """The FAIL line when a deep copy of a reset env shares an object with the original and an episode played on the
    copy changes the original's episode (demonstrations play the oracle on copies); ``""`` otherwise."""
    run = next((r for r in ctx.source if r.fault is None and r.actions), None)
    if run is None:
        return ""
    driver = ctx.driver
    original = driver.new_env("copy: original")
    if original is None:
        return ""
    try:
        driver.call(original.reset, seed=run.seed)
        twin = driver.call(copy.deepcopy, original)[0]
    except Exception:  # not copyable once reset: a WARN-level finding the fresh copy above already covers
        return ""
    driver.adopt(twin)
    shared = shared_objects(original, twin)
    if not shared:
        return ""
    episodes = [Run("copy: the copy", run.seed), Run("copy: the original", run.seed)]
    for env, episode in zip((twin, original), episodes, strict=True):
        for action in run.actions:
            if not driver.step(env, episode, copy.deepcopy(action)):
                break
    replayed = episodes[1]
    if dump(original.messages) == dump(run.messages) and replayed.scores[-1:] == run.scores[-1:]:
        return ""
    where = (
        f"at {first_difference(run.messages, original.messages)}"
        if dump(original.messages) != dump(run.messages)
        else f"its score {replayed.scores[-1] if replayed.scores else None} instead of {run.score}"
    )
    return (
        f"a deep copy of a reset env shares {shared[0]} with the original: after an episode on the copy, the "
        f"original's seed {run.seed} plays out differently ({where})"
    )


def _close_quietly(env: Env) -> None:
    with contextlib.suppress(Exception):  # a failing close() is not what the copy check judges
        env.close()


def check_latency(ctx: EnvContext) -> Outcome:
    """Reset and step percentiles; a FAIL naming the call when an env call hung."""
    driver = ctx.driver
    if driver.hang is not None:
        return hang_outcome(driver.hang, driver.call_timeout_s)
    if not driver.step_times:
        return Outcome(SKIP, "no steps were timed")
    reset50, reset99 = (float(np.percentile(driver.reset_times, q) * 1000) for q in (50, 99))
    step50, step99 = (float(np.percentile(driver.step_times, q) * 1000) for q in (50, 99))
    details = {"reset_p50_ms": reset50, "reset_p99_ms": reset99, "step_p50_ms": step50, "step_p99_ms": step99}
    line = f"reset p50 {reset50:.2f} ms / p99 {reset99:.2f} ms; step p50 {step50:.3f} ms / p99 {step99:.3f} ms"
    if step50 > SLOW_STEP_MS:
        return Outcome(WARN, line, f"steps over {SLOW_STEP_MS:.0f} ms slow rollouts: cache or batch I/O", details)
    return Outcome(PASS, line, details=details)


def hang_outcome(hang: Fault, timeout_s: float) -> Outcome:
    """The FAIL of an env that hung: the call, policy and seed, and why the later checks were not run."""
    return Outcome(
        FAIL,
        f"{hang.line()} — the env hung; later checks were not run",
        "find the wait that never ends (a lock, a blocking read, a loop without exit); "
        f"a call has {timeout_s:g} s (--call-timeout)",
        {"trace": hang.trace},
    )
