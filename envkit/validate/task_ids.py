"""What identifies a task, for the reset check (check 2) of an env whose ``reset`` names its tasks in
``info["task_id"]`` (:data:`envkit.core.env.TASK_ID_KEY`): one seed gives one id on every instance, however it was
used before; the seeds give enough distinct tasks; and distinct ids mark tasks that differ, not just seeds."""

from __future__ import annotations

from typing import Any

from envkit.core.env import TASK_ID_KEY, task_id_of
from envkit.validate.context import EnvContext
from envkit.validate.driver import unpack_reset
from envkit.validate.report import FAIL, PASS, WARN, Outcome, dump

KEY = f"info[{TASK_ID_KEY!r}]"
FEW_TASKS = 0.8
"""Below this fraction of distinct tasks per seed the seeds give too few tasks (the reset check's WARN)."""


def task_ids(infos: dict[int, Any]) -> tuple[dict[int, str | None], Outcome | None]:
    """Each seed's task id read from its reset ``info`` (``None``: it names none), or the FAIL of a seed whose id is
    not a task id (a list, an empty ``str``).

    Args:
        infos: The info dict ``reset(seed=...)`` returned, by seed.

    Returns:
        ``(ids, failure)``: ``failure`` is ``None`` when every id could be read.
    """
    ids: dict[int, str | None] = {}
    for seed, info in infos.items():
        try:
            ids[seed] = task_id_of(info)
        except ValueError as error:
            return ids, Outcome(
                FAIL,
                f"seed {seed}: {error}",
                f"return {KEY} as a str naming the task, or leave the key out",
            )
    return ids, None


def check_task_ids(
    ctx: EnvContext, ids: dict[int, str | None], openings: dict[int, str], details: dict[str, Any]
) -> Outcome:
    """The reset check's verdict on variety for an env that names its tasks (some id in ``ids`` is not ``None``).

    FAIL when ``reset(seed=s)`` on an instance that reset the other seeds first gives another id than on a fresh one
    (``envkit train`` resets one instance for many seeds to compare tasks); WARN when only some seeds name a task,
    when the seeds give few distinct tasks, or when two seeds with different ids open alike and the oracle plays
    them alike (an id that names the seed, not the task); else PASS, with the number of distinct tasks.

    Args:
        ctx: The validation's context (its driver builds the instance that is reused).
        ids: Each seed's task id from a fresh instance (:func:`task_ids`).
        openings: Each seed's opening messages, dumped.
        details: The reset check's details so far; the task counts are added.

    Returns:
        The check's outcome.
    """
    seeds = list(ids)
    reused = ctx.driver.new_env("reset")
    if reused is None:
        return Outcome(FAIL, "the constructor raised on another instance", "see the fault details")
    for seed in reversed(seeds):  # every seed after the others: an id drawn from what earlier resets left shows
        try:
            again = task_id_of(unpack_reset(ctx.driver.call(reused.reset, seed=seed)[0])[1])
        except Exception as error:
            fault = ctx.driver.fault("reset", "reset", seed, None, error)
            return Outcome(
                FAIL,
                f"on an instance that had reset other seeds: {fault.line()}",
                "reset(seed=...) must work on a used instance too (envkit reuses envs across episodes)",
            )
        if again != ids[seed]:
            return Outcome(
                FAIL,
                f"seed {seed}: reset(seed={seed}) gave {KEY}={ids[seed]!r} on a fresh instance and {again!r} on one "
                "that had reset other seeds",
                f"derive {KEY} from the seed's task alone (its question and data), not from state an earlier "
                "reset or episode left on the instance",
            )
    named = {seed: task_id for seed, task_id in ids.items() if task_id is not None}
    distinct = len(set(named.values()))
    details.update(distinct_tasks=distinct, named_seeds=len(named))
    if len(named) < len(seeds):
        unnamed = [seed for seed in seeds if ids[seed] is None]
        return Outcome(
            WARN,
            f"{KEY} is given for {len(named)} of {len(seeds)} seeds (not for seed {unnamed[0]})",
            f"name the task of every reset in {KEY}, or of none: tasks without one are compared by opening messages",
            details,
        )
    if distinct < FEW_TASKS * len(seeds):
        return Outcome(
            WARN,
            f"the {len(seeds)} seeds give only {distinct} distinct task{'' if distinct == 1 else 's'} by {KEY}",
            "eval seeds would repeat training tasks (envkit train calls such an eval not held out): give the env "
            "more tasks",
            details,
        )
    twins = _same_task_under_two_ids(ctx, ids, openings)
    if twins is not None:
        a, b = twins
        return Outcome(
            WARN,
            f"seeds {a} and {b} have different {KEY} ({ids[a]!r}, {ids[b]!r}) but the same opening messages and "
            "the same oracle episode",
            f"{KEY} must name the task (e.g. a digest of its question and data), not the seed: envkit train calls "
            "an eval held out when no eval task's id is a training task's",
            details,
        )
    hidden = " (openings repeat: hidden task state)" if len(set(openings.values())) < len(openings) else ""
    return Outcome(
        PASS,
        f"well-formed and seeded; {KEY} names {distinct} distinct tasks over {len(seeds)} seeds{hidden}",
        details=details,
    )


def _same_task_under_two_ids(
    ctx: EnvContext, ids: dict[int, str | None], openings: dict[int, str]
) -> tuple[int, int] | None:
    """Two seeds with different ids whose openings and oracle episodes are the same, or ``None``. Only the oracle's
    episodes count: a random policy plays different tasks alike as soon as its calls fail."""
    if not ctx.has_oracle:
        return None
    first: dict[str, int] = {}
    for run in ctx.runs["oracle"]:
        if run.fault or run.no_oracle or run.seed not in openings:
            continue
        seen = first.setdefault(dump(run.messages), run.seed)  # the transcript opens with the opening messages
        if ids[seen] != ids[run.seed]:
            return seen, run.seed
    return None
