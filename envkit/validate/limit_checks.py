"""The limit checks: the turn cap is reached by a policy that never ends and cuts where it says (check 9), and an
episode the engine cuts at any turn — its token budget ran out in the middle of a call — is scored without a crash
(check 23)."""

from __future__ import annotations

from typing import Any

import numpy as np

from envkit.core.env import Ending, Env
from envkit.validate.context import EnvContext
from envkit.validate.crash_checks import crash_site, raised_in, reported_sites
from envkit.validate.driver import MAX_TERMINATION_STEPS, Driver, Policy, Run, is_valid_score
from envkit.validate.policies import CHATTER, call_message, random_value, tool_schemas
from envkit.validate.report import FAIL, PASS, SKIP, Outcome

TEXT = "a text reply"
"""What the never-stopping policy's plain text turns are called in reports."""
CUT_SEEDS = 2
"""The episodes (one per seed) cut by the cut check."""
CUT_ENDINGS = (Ending.MAX_EPISODE_TOKENS, Ending.MAX_TURNS)
"""How the engine cuts an episode in the middle: a token budget ran out during the model's reply, or its turn cap."""


def endless_policy(env: Env, avoid: list[str]) -> Policy | None:
    """A policy that never stops and never takes an action in ``avoid`` (tool names, or :data:`TEXT`): it calls the
    other tools in turn with random arguments, or keeps talking when none is left; ``None`` when nothing is left.

    Args:
        env: The env (its tools).
        avoid: The kinds of action that ended an episode by themselves (a ``submit_answer`` tool).
    """
    if TEXT in avoid and all(t["function"].get("name") in avoid for t in tool_schemas(env)):
        return None

    def policy(env: Env, run: Run) -> Any:
        tools = [t for t in tool_schemas(env) if t["function"].get("name") not in avoid]
        if tools:
            function = tools[run.steps % len(tools)]["function"]
            rng = np.random.default_rng([run.seed, run.steps])
            return call_message(function.get("name", "?"), random_value(function.get("parameters", {}), rng))
        return CHATTER

    return policy


def action_kind(action: Any) -> str | None:
    """The kind of ``action`` :func:`endless_policy` avoids: its (first) tool's name, or :data:`TEXT`."""
    if isinstance(action, str):
        return TEXT
    calls = action.get("tool_calls") if isinstance(action, dict) else None
    if not calls:
        return TEXT
    function = calls[0].get("function") if isinstance(calls[0], dict) else None
    return function.get("name") if isinstance(function, dict) else None


def _play(driver: Driver, policy: Policy, seed: int, label: str) -> tuple[Run, Env | None]:
    """One never-stopping episode on a fresh env: the run and the env (its :attr:`~envkit.Env.ending` says how the
    episode ended)."""
    run = Run(label, seed)
    env = driver.new_env(label)
    if env is None or not driver.reset(env, run):
        return run, env
    for _ in range(MAX_TERMINATION_STEPS + 1):
        try:
            action = driver.call(policy, env, run)[0]
        except Exception as error:
            run.fault = driver.fault("oracle", label, seed, None, error)
            break
        if action is None or not driver.step(env, run, action):
            break
    driver.record(run, env)
    return run, env


def check_termination(ctx: EnvContext) -> Outcome:
    """A policy that never stops is cut off by ``max_turns``, at ``max_turns``. When an action of the policy ends the
    episode by itself (a ``submit_answer`` tool, a text reply of a single-answer env), the policy is played again
    without it, until the cap is reached or every kind of action it has ends the episode."""
    driver, seed = ctx.driver, ctx.seeds[0]
    max_turns = getattr(ctx.env, "max_turns", None)
    avoid: list[str] = []
    ended_by: list[str] = []
    while (policy := endless_policy(ctx.env, avoid)) is not None:
        without = (
            f" (without {', '.join(avoid)}, which end{'s' if len(avoid) == 1 else ''} the episode)" if avoid else ""
        )
        run, env = _play(driver, policy, seed, f"never stops{without}")
        if run.fault:
            return Outcome(FAIL, run.fault.line(), "the env must survive a policy that never stops")
        if driver.hang is not None:
            return Outcome(SKIP, "not finished: the env hung (see check 13)")
        if not run.ended:
            return Outcome(
                FAIL,
                f"a policy that never stops{without} was still going after {run.steps} turns (max_turns={max_turns})",
                "the base class truncates at max_turns: do not reset self.turns in step(), do not count the cap "
                "yourself, and set max_turns to a realistic bound",
            )
        if isinstance(max_turns, int) and run.steps > max_turns:
            return Outcome(
                FAIL,
                f"the episode ran {run.steps} turns, past max_turns={max_turns}",
                "do not bypass the base class's step bookkeeping (self.turns)",
            )
        ending = getattr(env, "ending", None)
        if run.truncated:
            how = ending.value if isinstance(ending, Ending) else "truncated"
            if ending is Ending.MAX_TURNS and isinstance(max_turns, int) and run.steps < max_turns:
                return Outcome(
                    FAIL,
                    f"a never-stopping policy{without} was cut after {run.steps} turns as by max_turns, but "
                    f"max_turns={max_turns}: the env counts its cap in something other than the agent's turns",
                    "let the base class cut at max_turns (it counts assistant turns), or name your own limit in "
                    "info['ending'] (e.g. 'max_steps')",
                )
            return Outcome(
                PASS,
                f"a never-stopping policy{without} was truncated ({how}) after {run.steps} turns "
                f"(max_turns={max_turns})",
            )
        kind = action_kind(run.actions[-1]) if run.actions else None
        if kind is None or kind in avoid:
            break
        avoid.append(kind)
        ended_by.append(f"{kind} after {run.steps} turn{'' if run.steps == 1 else 's'}")
    return Outcome(
        PASS,
        f"every kind of action tried ends the episode by itself ({'; '.join(ended_by)}): no policy runs into "
        f"max_turns={max_turns}",
    )


def _cut_points(actions: int) -> list[int]:
    """How many actions are replayed before each cut: none (the first reply ran out of tokens), one, half, all but
    the last."""
    return sorted({k for k in (0, 1, actions // 2, actions - 1) if 0 <= k < actions})


def check_cuts(ctx: EnvContext) -> Outcome:
    """Episodes (the oracle's, else the random policy's) replayed up to each of :func:`_cut_points`, then ended as the
    engine ends an episode whose token budget or turn cap ran out in the middle of the model's reply (the env never
    sees that reply: ``end(Ending.MAX_EPISODE_TOKENS)`` or ``end(Ending.MAX_TURNS)``, then ``score()``): neither may
    raise, and the score must be a finite number in [0, 1]. A crash an earlier check reported (the same exception
    at the same line) is not reported again."""
    driver = ctx.driver
    earlier = reported_sites(driver)
    runs = [r for r in ctx.source if r.fault is None and r.actions][:CUT_SEEDS]
    if not runs:
        return Outcome(SKIP, "no episode played without an exception: nothing to cut")
    cuts = 0
    for run in runs:
        for kept in _cut_points(len(run.actions)):
            for ending in CUT_ENDINGS:
                label = f"cut by {ending.value} after {kept} of {len(run.actions)} turns"
                cut, env = driver.replay_env(run.actions[:kept], run.seed, f"{run.policy} {label}")
                if driver.hang is not None:
                    return Outcome(SKIP, "not finished: the env hung (see check 13)")
                if env is None or cut.fault is not None or cut.ended:
                    continue  # a crash or an episode already over: other checks' findings
                where = f"[{run.policy}, seed {run.seed}, {label}]"
                for name, call in (("end", lambda e=env, n=ending: e.end(n)), ("score", env.score)):
                    try:
                        value = driver.call(call)[0]
                    except Exception as error:
                        text = f"{type(error).__name__}: {error}"
                        trace = driver.fault(name, run.policy, run.seed, None, error).trace
                        site, text = crash_site(trace, text), text + raised_in(trace)
                        if driver.hang is not None:
                            return Outcome(SKIP, "not finished: the env hung (see check 13)")
                        if site in earlier:
                            return Outcome(SKIP, f"{name}() raised {text} {where}, as an earlier check reported")
                        return Outcome(
                            FAIL,
                            f"{name}() raised {text} {where}",
                            "end(ending) and score() must work after any turn: an episode is cut wherever its token "
                            "budget or turn cap runs out (right after reset too)",
                            {"site": site},
                        )
                if not is_valid_score(value):
                    return Outcome(FAIL, f"score() = {value!r} {where}", "score() must be a finite number in [0, 1]")
                cuts += 1
    if not cuts:
        return Outcome(SKIP, "no episode could be replayed to a cut (see the replay and fuzzing checks)")
    return Outcome(PASS, f"{cuts} episodes cut at every stage (after 0 … n-1 turns, {len(runs)} seeds) scored cleanly")
