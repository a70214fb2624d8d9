"""The verifier checks: ``score()`` is a function of the episode alone, and the env's own canaries — known reward
hacks, :meth:`envkit.Env.canaries` — earn no more than doing nothing."""

from __future__ import annotations

import copy
from typing import Any

from envkit.core.env import Env
from envkit.validate.context import EnvContext
from envkit.validate.driver import Driver, Policy, Run, is_valid_score
from envkit.validate.report import FAIL, PASS, SKIP, Outcome, dump, fmt_score, short

MAX_CANARIES = 20
"""At most this many canaries of one seed are played."""
FLOOR_TOLERANCE = 1e-9
"""How far above the no-op floor a canary may score (float noise, not a reward)."""
VERIFIER_HINT = (
    "score() must depend only on the episode (the seed and the actions): no random draws (not even from "
    "self.np_random), no clock, no per-instance judge seed, no state that reading the score changes"
)
"""The hint of a score that changes when read again or replayed."""
CANARY_HINT = (
    "a canary is a reward hack the env itself names: the score must give it no more than doing nothing — make the "
    "score require the real work the canary skips (exactly one answer, the tool protocol, the actual state change)"
)
"""The hint of a canary that scores above the no-op floor."""
CANARY_DEFINE_HINT = (
    "where a reward hack of the env is known (a list of candidate answers, a claim of success without the work), "
    "return it from canaries() so that every validation replays it (see envkit.Env.canaries)"
)
"""The hint of an env without canaries."""
CANARY_SHAPE_HINT = (
    'canaries() returns {"name": [action, ...]}: each value the actions of one episode, as step() accepts them '
    '(str or {"role": "assistant", ...}); see envkit.Env.canaries'
)
"""The hint of a canaries() that returns something else than named action lists."""


def check_verifier_determinism(ctx: EnvContext) -> Outcome:
    """``score()`` read twice on the same state gives the same value, and every scripted episode replayed on a fresh
    env (reset with the same seed, the same actions) gets the same score after every step.

    Episodes whose replay does not reproduce the transcript are left out: the env, not its verifier, is
    nondeterministic there (the replay check reports it).
    """
    driver = ctx.driver
    episodes = [r for runs in ctx.runs.values() for r in runs if r.fault is None and r.actions and r.scores]
    problems: list[str] = []
    checked, diverged = 0, 0
    for run in episodes:
        again, env = driver.replay_env(run.actions, run.seed, f"verifier replay of {run.policy}")
        if driver.hang is not None:
            return Outcome(SKIP, "not finished: the env hung")
        if env is None or again.fault is not None:
            continue  # a crash: the fuzzing and score checks report those
        if dump(again.messages) != dump(run.messages):
            diverged += 1
            continue
        checked += 1
        if dump(again.scores) != dump(run.scores):
            pairs = zip(run.scores, again.scores, strict=False)
            last = min(len(run.scores), len(again.scores)) - 1
            step = next((i for i, (a, b) in enumerate(pairs) if dump(a) != dump(b)), last)
            when = "after reset" if step == 0 else f"after step {step}"
            problems.append(
                f"seed {run.seed} [{run.policy}]: the same actions replayed on a fresh env give the same transcript "
                f"but score() = {_fmt(again.scores[step])} {when}, {_fmt(run.scores[step])} the first time"
            )
            continue
        reads = [again.scores[-1], *_reread(driver, env, again, reads=2)]
        if driver.hang is not None:
            return Outcome(SKIP, "not finished: the env hung")
        if len({dump(r) for r in reads}) > 1:
            problems.append(
                f"seed {run.seed} [{run.policy}]: score() read {len(reads)} times on the same final state gave "
                f"{', '.join(_fmt(r) for r in reads)}"
            )
    details: dict[str, Any] = {"episodes_checked": checked, "episodes_not_reproduced": diverged}
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        return Outcome(FAIL, problems[0] + more, VERIFIER_HINT, {**details, "problems": problems[:20]})
    if not checked:
        why = (
            "no episode replays to the same transcript (see replay determinism)"
            if diverged
            else "no episode was played without an exception"
        )
        return Outcome(SKIP, f"{why}: the verifier cannot be checked on its own", details=details)
    policies = ", ".join(dict.fromkeys(r.policy for r in episodes))
    return Outcome(
        PASS,
        f"{checked} episodes ({policies}) replayed on fresh envs score the same after every step; score() read again "
        "gives the same value",
        details=details,
    )


def check_canaries(ctx: EnvContext) -> Outcome:
    """Every canary of :meth:`envkit.Env.canaries`, played from ``reset(seed)``, scores at most the seed's measured
    no-op floor (the best score of the empty answer and the refusal there)."""
    driver = ctx.driver
    defined = getattr(ctx.env, "canaries", None)
    if not callable(defined) or getattr(type(ctx.env), "canaries", None) is Env.canaries:
        if ctx.withheld:
            return ctx.not_run("its canaries are not forwarded")
        return Outcome(SKIP, "the env defines no canaries(): no known reward hacks to replay", CANARY_DEFINE_HINT)
    names: list[str] = []
    hacked: list[str] = []
    broken: list[str] = []
    best: float | None = None
    compared = 0
    for seed in ctx.seeds:
        canaries, problem = _canaries_of(ctx, seed)
        if driver.hang is not None:
            return Outcome(SKIP, "not finished: the env hung")
        if problem:
            return Outcome(FAIL, problem, CANARY_SHAPE_HINT)
        floor = ctx.floor(seed)
        for name, actions in list(canaries.items())[:MAX_CANARIES]:
            names.append(name)
            invalid = len(driver.bad_scores)
            run = driver.play(f"canary: {name}", _scripted(actions), seed)
            if driver.hang is not None:
                return Outcome(SKIP, "not finished: the env hung")
            if run.fault is not None:
                broken.append(f"canary {name!r} on seed {seed}: {run.fault.line()}")
            elif len(driver.bad_scores) > invalid:
                broken.append(f"canary {name!r}: {driver.bad_scores[invalid]}")
            elif floor is not None and run.score is not None:
                compared += 1
                best = run.score if best is None else max(best, run.score)
                if run.score > floor + FLOOR_TOLERANCE:
                    hacked.append(
                        f"canary {name!r} scores {run.score:.3f} on seed {seed}, above the no-op floor {floor:.3f}"
                    )
    unique = list(dict.fromkeys(names))
    details: dict[str, Any] = {"canaries": unique, "played": len(names)}
    if hacked:
        more = f" (and {len(hacked) - 1} more)" if len(hacked) > 1 else ""
        return Outcome(FAIL, hacked[0] + more, CANARY_HINT, {**details, "hacked": hacked[:20]})
    if broken:
        hint = "a canary is an episode like any other: the env must not raise, and score() must be in [0, 1]"
        return Outcome(FAIL, broken[0], hint, {**details, "problems": broken[:20]})
    if not names:
        return Outcome(
            SKIP, "canaries() names no canary on any seed: no known reward hacks to replay", CANARY_DEFINE_HINT
        )
    if not compared:
        return Outcome(SKIP, "no seed has a valid no-op floor to compare the canaries with", details=details)
    return Outcome(
        PASS,
        f"{len(unique)} {'canary' if len(unique) == 1 else 'canaries'} ({', '.join(short(n, 40) for n in unique[:4])}"
        f"{', …' if len(unique) > 4 else ''}) score at most the no-op floor on every seed (best {fmt_score(best)})",
        details=details,
    )


def _canaries_of(ctx: EnvContext, seed: int) -> tuple[dict[str, list[Any]], str]:
    """The canaries of ``seed`` (read after a reset, as they may depend on the task) and a problem with them."""
    driver = ctx.driver
    run = Run("canaries", seed)
    env = driver.new_env(run.policy)
    if env is None or not driver.reset(env, run):
        return {}, ""  # the env cannot start this seed: the reset and fuzzing checks report it
    try:
        canaries = driver.call(env.canaries)[0]
    except Exception as error:
        return {}, driver.fault("canaries", run.policy, seed, None, error).line()
    if not isinstance(canaries, dict):
        return {}, f"seed {seed}: canaries() returned a {type(canaries).__name__}, not a dict of named action lists"
    for name, actions in canaries.items():
        if not isinstance(name, str) or not name:
            return {}, f"seed {seed}: canary name {name!r} is not a non-empty str"
        if not isinstance(actions, (list, tuple)) or not actions:
            return {}, f"seed {seed}: canary {name!r} is not a non-empty list of actions"
        bad = next((a for a in actions if not isinstance(a, (str, dict))), None)
        if bad is not None:
            return {}, f"seed {seed}: canary {name!r} holds a {type(bad).__name__} action, not a str or message dict"
    return canaries, ""


def _scripted(actions: list[Any]) -> Policy:
    """A policy that plays ``actions`` in order, then stops."""

    def policy(env: Env, run: Run) -> Any:
        return copy.deepcopy(actions[run.steps]) if run.steps < len(actions) else None

    return policy


def _reread(driver: Driver, env: Env, run: Run, reads: int) -> list[Any]:
    """``score()`` read again ``reads`` times: valid scores as floats, invalid ones as NaN (as the driver records
    them), an exception as ``"raised NAME"``."""
    values: list[Any] = []
    for _ in range(reads):
        try:
            value = driver.call(env.score)[0]
        except Exception as error:
            driver.fault("score", run.policy, run.seed, None, error)
            values.append(f"raised {type(error).__name__}")
            continue
        values.append(float(value) if is_valid_score(value) else float("nan"))
    return values


def _fmt(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else repr(value)
