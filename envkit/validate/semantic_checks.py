"""The semantic checks: the oracle reaches the maximum, doing nothing stays below it, a padded answer does not win,
and the scores separate policies (GRPO's group signal)."""

from __future__ import annotations

from typing import Any

import numpy as np

from envkit.validate.context import EnvContext
from envkit.validate.distractors import DistractorPolicy
from envkit.validate.policies import NOOP_POLICIES
from envkit.validate.report import FAIL, PASS, SKIP, VACUOUS_SCORE, WARN, Outcome, fmt_score, short


def check_oracle(ctx: EnvContext) -> Outcome:
    """The oracle's episodes score 1.0 on every seed."""
    runs = ctx.runs["oracle"]
    if not ctx.has_oracle and ctx.withheld:
        return ctx.not_run("gold solutions cannot be checked")
    if not ctx.has_oracle:
        return Outcome(
            WARN,
            "the env has no oracle(): gold solutions cannot be checked",
            "implement oracle() returning the next action of a perfect agent",
        )
    bad = [f"seed {r.seed}: {fmt_score(r.score)}" + (" (crashed)" if r.fault else "") for r in runs if r.score != 1.0]
    if bad:
        return Outcome(
            FAIL,
            f"{len(bad)}/{len(runs)} seeds below 1.0: {', '.join(bad[:5])}",
            "the oracle or the scoring is wrong: replay the seed with `envkit play ENV --seed S`",
        )
    turns = sum(r.steps for r in runs) / len(runs)
    return Outcome(PASS, f"1.0 on all {len(runs)} seeds (mean {turns:.1f} turns)")


VACUOUS_HINT = (
    "score() passes without the work being done: a check over an empty collection is vacuous (all([]) is True), so "
    "require the expected change itself (e.g. `self.refunds and all(...)`, or compare the final state with the goal)"
)
"""The hint of a score that is 1.0 before any action."""


def check_noop(ctx: EnvContext) -> Outcome:
    """Empty answers and refusals never score 1.0. Where the score is 1.0 already right after ``reset()``, before
    any action, the score is blamed: it passes without the work (a vacuous ``all([])``)."""
    runs = [r for name in NOOP_POLICIES for r in ctx.runs[name]]
    bad = [f"{r.policy} on seed {r.seed}" for r in runs if r.score == 1.0]
    scores = [r.score for r in runs if r.score is not None]
    mean = sum(scores) / len(scores) if scores else float("nan")
    before = sorted({r.seed for r in runs if r.score == 1.0 and r.scores[:1] == [1.0]})
    if before:
        every = len(before) == len(ctx.seeds)
        on = f"all {len(before)} seeds" if every else f"{len(before)}/{len(ctx.seeds)} seeds ({short(before, 40)})"
        return Outcome(
            FAIL,
            f"score() is already 1.0 right after reset(), before any action, on {on}: doing nothing scores 1.0",
            VACUOUS_HINT + ("" if every else "; or those tasks start solved: never generate one"),
            {"mean": mean, "seeds_at_1_before_any_action": before},
            cause=VACUOUS_SCORE,
        )
    if not scores:
        return Outcome(SKIP, "no empty or refusing episode got a score (see the faults of the other checks)")
    if bad:
        return Outcome(
            FAIL,
            f"doing nothing scores 1.0: {', '.join(bad[:4])}",
            "score() rewards an empty answer or a refusal: make it require the task's result",
            {"mean": mean},
        )
    return Outcome(PASS, f"empty answers and refusals score {mean:.3f} on average", details={"mean": mean})


DISTRACTOR_HINT = (
    "the score accepts an answer that lists candidates (the right one among others): require exactly one answer — "
    "parse one value, or reject a text that names several (e.g. several prices, references or names); GRPO finds "
    "this hack"
)
"""The hint of an answer that still wins padded with distractors."""
CALL_DISTRACTOR_HINT = (
    "the score accepts the right call among wrong ones, or a wrong value in one of its arguments: score the final "
    "state exactly (the right change made once, with the right values, and no other change) — a model that sprays "
    "calls with guessed arguments must not win; GRPO finds this hack"
)
"""The hint of a tool-call answer that still wins among calls with distractor arguments."""


def check_distractors(ctx: EnvContext) -> Outcome:
    """The oracle's answers padded with every candidate in sight must not score 1.0.

    A seed counts only when its final answer matters: the counterfactual (the final answer replaced by distractors
    alone) scores below 1.0. There the padded run must score below 1.0 too.
    """
    driver, oracle_runs = ctx.driver, ctx.runs["oracle"]
    if not ctx.has_oracle and ctx.withheld:
        return ctx.not_run("there are no answers to pad")
    if not ctx.has_oracle:
        return Outcome(SKIP, "the env has no oracle(): there are no answers to pad")
    replace = DistractorPolicy(oracle_runs, mode="replace")
    pad = DistractorPolicy(oracle_runs, mode="pad")
    bearing, hacked, scores = [], [], []
    for seed in ctx.seeds:
        counterfactual = driver.play("distractors: answer replaced", replace, seed)
        padded = driver.play("distractors", pad, seed)
        if counterfactual.score is None or padded.score is None:
            continue
        answered = counterfactual.steps and (counterfactual.steps - 1) in replace.padded.get(seed, set())
        if not answered or counterfactual.score >= 1.0:
            continue  # the final answer does not decide the score on this seed
        if not padded.steps or (padded.steps - 1) not in pad.padded.get(seed, set()):
            continue
        bearing.append(seed)
        scores.append(padded.score)
        if padded.score == 1.0:
            hacked.append(padded)
    details: dict[str, Any] = {"seeds_checked": bearing, "scores": scores}
    if hacked:
        first = hacked[0]
        answer, distractors = pad.examples.get(first.seed, ("", []))
        details = {**details, "hacked_seeds": [r.seed for r in hacked]}
        if first.seed in pad.call_answers:
            return Outcome(
                FAIL,
                f"{len(hacked)}/{len(bearing)} seeds score 1.0 when the oracle's final tool call is sent among calls "
                f"with distractor arguments; seed {first.seed}: {answer} sent as {len(distractors)} calls "
                f"({'; '.join(distractors)}) scores 1.0",
                CALL_DISTRACTOR_HINT,
                {**details, "calls_sent": distractors},
            )
        shown = sorted(distractors, key=lambda c: not any(ch.isdigit() for ch in c))[:6]
        return Outcome(
            FAIL,
            f"{len(hacked)}/{len(bearing)} seeds score 1.0 when the oracle's final answer is padded with every "
            f"candidate it can see; seed {first.seed}: {short(answer, 80)} between {len(distractors)} distractors "
            f"({', '.join(shown)}, …) scores 1.0",
            DISTRACTOR_HINT,
            details,
        )
    if not bearing:
        return Outcome(
            SKIP,
            "the final answer does not decide the score on any seed (replaced by distractors, it still scores 1.0, "
            "or it cannot be padded): nothing to check",
            details=details,
        )
    return Outcome(
        PASS,
        f"answers padded with distractors score {float(np.mean(scores)):.3f} on average over {len(bearing)} seeds, "
        "never 1.0",
        details=details,
    )


def check_group_signal(ctx: EnvContext) -> Outcome:
    """The scripted policies' scores differ on a seed (a GRPO group with one score has no advantage). Without an
    oracle, policies that all fail score alike in a sound env too: that is a WARN (not checked), never a FAIL."""
    runs = ctx.runs
    policies = [p for p in runs if ctx.has_oracle or p != "oracle"]
    seeds = [r.seed for r in runs[policies[0]]]
    varied = 0
    for index in range(len(seeds)):
        scores = {runs[p][index].score for p in policies if runs[p][index].score is not None}
        varied += len(scores) > 1
    means = {p: float(np.mean([r.score for r in runs[p] if r.score is not None] or [np.nan])) for p in policies}
    shown = ", ".join(f"{p} {m:.2f}" for p, m in means.items())
    if varied < len(seeds) / 2 and not ctx.has_oracle:  # only an oracle would solve a task: no failure shown
        if ctx.withheld:
            return ctx.not_run(
                f"the policies without the oracle score alike on {len(seeds) - varied}/{len(seeds)} seeds"
            )
        return Outcome(
            WARN,
            f"not checked: without an oracle no policy here solves a task, and the scripted ones score alike on "
            f"{len(seeds) - varied}/{len(seeds)} seeds ({shown})",
            "add oracle() (the next right action) so that solved tasks can be checked to score above failed ones",
            {"means": means},
        )
    if varied == 0:
        return Outcome(
            FAIL,
            f"every policy gets the same score on every seed ({shown})",
            "GRPO gets zero advantage: make the score reflect task progress",
            {"means": means},
        )
    if varied < len(seeds) / 2:
        return Outcome(
            WARN,
            f"scores differ between policies on only {varied}/{len(seeds)} seeds ({shown})",
            "many groups will have zero advantage",
            {"means": means},
        )
    return Outcome(PASS, f"scores differ on {varied}/{len(seeds)} seeds; means: {shown}", details={"means": means})
