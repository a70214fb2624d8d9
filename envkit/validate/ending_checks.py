"""The ending check: the score an env gives an episode the rollout engine cut (its turn cap, a token budget), told
through :meth:`envkit.Env.end` as the engine tells it — so a reward that needs a finished episode is seen to need it."""

from __future__ import annotations

from envkit.core.env import Ending
from envkit.validate.context import EnvContext
from envkit.validate.driver import is_valid_score
from envkit.validate.report import FAIL, PASS, SKIP, Outcome, fmt_score

CUTS = (Ending.MAX_TURNS, Ending.MAX_EPISODE_TOKENS)
"""How the engine cuts an episode, each tried once per seed: what :meth:`envkit.Env.end` is told."""
PROPER_ENDING_HINT = (
    "the env declares requires_proper_ending, so score() must give an episode the engine cut less than full credit: "
    "read self.ending there (anything but Ending.DONE is a cut; the engine calls end() before score()), or drop "
    "the declaration if the reward judges the final state however the episode ended"
)
"""The hint of a declared env whose cut episodes still score 1.0."""


def check_cut_ending(ctx: EnvContext) -> Outcome:
    """The oracle's episodes that reached 1.0, replayed on fresh envs up to (not including) their last action, then
    ended as the engine ends a cut episode (:data:`CUTS`) and scored. An env that declares
    :attr:`~envkit.Env.requires_proper_ending` fails when such a cut episode still scores 1.0; for other envs the
    score under a cut is reported (a reward may judge the final state, however the episode ended)."""
    if not ctx.has_oracle and ctx.withheld:
        return ctx.not_run("no finished episode to cut")
    if not ctx.has_oracle:
        return Outcome(SKIP, "the env has no oracle(): no finished episode to cut")
    driver = ctx.driver
    runs = [r for r in ctx.runs["oracle"] if r.fault is None and r.actions and r.score == 1.0]
    if not runs:
        return Outcome(SKIP, "no oracle episode reached 1.0: nothing to cut")
    declared = bool(getattr(ctx.env, "requires_proper_ending", False))
    scores: list[float] = []
    full: list[str] = []
    for run in runs:
        for ending in CUTS:
            cut, env = driver.replay_env(run.actions[:-1], run.seed, f"oracle cut by {ending.value}")
            if driver.hang is not None:
                return Outcome(SKIP, "not finished: the env hung")
            if env is None or cut.fault is not None or cut.ended:
                continue  # a crash, or an episode that no longer needs its last action: other checks' findings
            where = f"seed {run.seed}, cut by {ending.value} after {cut.steps} of {run.steps} turns"
            try:
                driver.call(env.end, ending)
                value = driver.call(env.score)[0]
            except Exception as error:
                fault = driver.fault("end", f"oracle cut by {ending.value}", run.seed, None, error)
                return Outcome(FAIL, fault.line(), "end(ending) and then score() must work on any episode")
            if not is_valid_score(value):
                return Outcome(FAIL, f"{where}: score() = {value!r}", "score() must be a finite number in [0, 1]")
            scores.append(float(value))
            if value == 1.0:
                full.append(where)
    if not scores:
        return Outcome(SKIP, "no cut oracle episode could be replayed (see the replay and fuzzing checks)")
    mean = sum(scores) / len(scores)
    details = {"requires_proper_ending": declared, "cut_episodes": len(scores), "mean": mean, "full": full}
    if declared and full:
        return Outcome(
            FAIL,
            f"{len(full)}/{len(scores)} episodes the engine cut still score 1.0: {'; '.join(full[:3])}",
            PROPER_ENDING_HINT,
            details,
        )
    how = "requires a proper ending" if declared else "does not declare requires_proper_ending"
    line = f"cut before its last turn, the oracle scores {fmt_score(mean)} on average ({len(scores)} episodes; {how})"
    if full:
        line += f"; 1.0 on {len(full)}: the reward credits unfinished episodes"
    return Outcome(PASS, line, details=details)
