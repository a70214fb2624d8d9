"""What a rollout step reports and checks over every process's episodes: ``envkit/*`` metrics in TRL's logs, the
zero-variance warning, and the error-rate stop."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, TypeVar

from envkit.rollout import Episode, summarize
from envkit.util.text import one_line

T = TypeVar("T")

ZERO_VARIANCE_STEPS = 3
"""Training rollouts in a row in which every group's episodes scored the same before the rollout says, in one line,
that training cannot learn."""


class ErrorRateExceeded(RuntimeError):
    """More of one step's episodes failed (env raised, timed out, or could not be rendered or generated) than
    ``max_error_rate`` allows: the env or the generation server is broken, and training on would only learn from
    what is left. The message (one line) gives the rate, the step and the first error."""


def in_training(trainer: Any) -> bool:
    """Whether ``trainer`` is training (its model in train mode) rather than evaluating (TRL's ``evaluate`` puts the
    model in eval mode): the one answer for the metrics' bucket, the rollout's call counter and its seed stream. A
    trainer without a model (a stand-in) counts as training, the mode TRL calls ``rollout_func`` in."""
    model = getattr(trainer, "model", None)
    return bool(getattr(model, "training", True))


def is_main_process(trainer: Any) -> bool:
    return bool(getattr(getattr(trainer, "accelerator", None), "is_main_process", True))


def gather_episodes(trainer: Any, episodes: list[Episode]) -> list[Episode]:
    """Every training process's ``episodes``, in process order (TRL's order of the gathered batch), without their
    token lists, transcripts, info and timings: what metrics need. With one process, ``episodes`` itself.

    A collective call: with several processes each must call it, once per rollout.
    """
    return gather_rollout(trainer, episodes, 0)[0]


def gather_rollout(trainer: Any, episodes: list[Episode], leaked: int) -> tuple[list[Episode], int]:
    """:func:`gather_episodes`, and the sum of every process's ``leaked`` (threads), in one collective call."""
    if processes(trainer) <= 1:
        return list(episodes), int(leaked)
    light = [
        dataclasses.replace(
            e, messages=[], prompt_ids=[], completion_ids=[], env_mask=[], logprobs=[], info={}, timings={}
        )
        for e in episodes
    ]
    return gather_pairs(trainer, light, leaked)


def gather_pairs(trainer: Any, items: list[T], count: int) -> tuple[list[T], int]:
    """Every training process's ``items`` (in process order) and the sum of their ``count``, in one collective call:
    what each process holds of a step that every process must judge alike (to stop together, or none). With one
    process, ``items`` and ``count`` themselves.

    A collective call: with several processes each must call it, as often as the others."""
    if processes(trainer) <= 1:
        return list(items), int(count)
    from accelerate.utils import gather_object

    parts = gather_object([(items, int(count))])
    return [item for part, _ in parts for item in part], sum(n for _, n in parts)


def processes(trainer: Any) -> int:
    """How many processes train with ``trainer`` (its accelerator's; 1 for a trainer without one)."""
    accelerator = getattr(trainer, "accelerator", None)
    return int(getattr(accelerator, "num_processes", 1) or 1) if accelerator is not None else 1


def check_error_rate(episodes: list[Episode], max_error_rate: float | None, *, step: int | None = None) -> None:
    """Raise :class:`ErrorRateExceeded` when more than ``max_error_rate`` of ``episodes`` failed (``step``: the
    training step, named in the message; ``None`` outside training, e.g. ``envkit eval``)."""
    check_failures([str(e.error) for e in episodes if e.error is not None], len(episodes), max_error_rate, step=step)


def check_failures(
    errors: list[str],
    total: int,
    max_error_rate: float | None,
    *,
    step: int | None = None,
    fix: str = "the env or the generation server (envkit validate / envkit eval show the failures)",
) -> None:
    """Raise :class:`ErrorRateExceeded` when ``errors`` (one per failed episode) are more than ``max_error_rate`` of
    ``total`` episodes: :func:`check_error_rate`'s rule and message for failures counted without an
    :class:`~envkit.rollout.Episode` (``fix``: what the message tells the user to fix)."""
    if max_error_rate is None or not total:
        return
    rate = len(errors) / total
    if rate > max_error_rate:
        raise ErrorRateExceeded(
            f"{len(errors)} of {total} episodes failed{'' if step is None else f' at step {step}'} (error rate "
            f"{rate:.2f} > --max-error-rate {max_error_rate:g}); first: {one_line(errors[0], 300)} — fix "
            f"{fix}, or raise --max-error-rate"
        )


def log_metrics(trainer: Any, episodes: list[Episode]) -> float | None:
    """Add envkit's episode metrics to TRL's logs (``envkit/mean_score``, ``envkit/mean_turns``, …,
    ``envkit/zero_variance_groups``, and ``envkit/score/NAME``: the mean of each of the env's score components,
    :meth:`envkit.Env.score_components`); return the fraction of zero-variance groups (:func:`zero_variance_groups`).

    ``episodes`` are the step's episodes of every process (:func:`gather_episodes`): TRL logs the main process's
    ``_metrics`` only.
    """
    if not episodes:
        return None
    mode = "train" if in_training(trainer) else "eval"
    group_size = getattr(trainer, "num_generations" if mode == "train" else "num_generations_eval", None)
    zero_variance = zero_variance_groups(episodes, group_size if isinstance(group_size, int) else None)
    metrics = getattr(trainer, "_metrics", None)
    if metrics is None:
        return zero_variance
    summary = summarize(episodes)
    summary["zero_variance_groups"] = zero_variance
    for key in (
        "mean_score",
        "mean_turns",
        "tool_calls_per_turn",
        "tool_error_rate",
        "truncation_rate",
        "cut_turn_rate",
        "error_rate",
        "zero_variance_groups",
        *(key for key in summary if key.startswith("score/")),
    ):
        value = summary.get(key)
        if value is not None and math.isfinite(value):
            metrics[mode][f"envkit/{key}"].append(value)
    return zero_variance


def group_metrics(episodes: list[Episode]) -> dict[str, float]:
    """``envkit/mean_score``, ``envkit/mean_turns`` and ``envkit/zero_variance_groups`` of one group of episodes, by
    the definitions :func:`log_metrics` logs (a failed episode counts 0 in the mean, as
    :func:`~envkit.rollout.summarize` counts it; a group with fewer than two scored episodes counts as flat): what
    ``--async`` logs per group, so that its curves read as the synchronous run's."""
    summary = summarize(episodes)
    return {
        "envkit/mean_score": summary["mean_score"],
        "envkit/mean_turns": summary["mean_turns"],
        "envkit/zero_variance_groups": zero_variance_groups(episodes, len(episodes)),
    }


def zero_variance_groups(episodes: list[Episode], group_size: int | None = None) -> float:
    """The fraction of groups whose episodes all got the same score (within TRL's ``isclose`` of a zero standard
    deviation), failed episodes left out as GRPOTrainer leaves them out; a group with fewer than two scored episodes
    counts too. Such a group's advantages are all 0: the score gives it no gradient.

    Groups are consecutive blocks of ``group_size`` episodes, as GRPOTrainer groups its gathered batch; without a
    ``group_size`` that divides the batch, runs of consecutive episodes of one task seed.
    """
    if not episodes:
        return 0.0
    groups: list[list[Episode]] = []
    if group_size and len(episodes) % group_size == 0:
        groups = [episodes[i : i + group_size] for i in range(0, len(episodes), group_size)]
    else:
        for episode in episodes:
            if groups and groups[-1][-1].task_seed == episode.task_seed:
                groups[-1].append(episode)
            else:
                groups.append([episode])
    flat = 0
    for group in groups:
        scores = [float(e.score) for e in group if e.error is None]
        flat += len(scores) < 2 or max(scores) - min(scores) <= 1e-8
    return flat / len(groups)


def cannot_learn_message(episodes: list[Episode], step: int) -> str:
    """The one line said when every group scored equally for :data:`ZERO_VARIANCE_STEPS` training rollouts in a row."""
    scores = sorted({round(float(e.score), 6) for e in episodes if e.error is None})
    seen = ", ".join(f"{s:g}" for s in scores[:4]) + (", ..." if len(scores) > 4 else "")
    return (
        f"training cannot learn: at each of the last {ZERO_VARIANCE_STEPS} rollouts (up to step {step}) every group's "
        f"episodes got equal scores (this one: {seen or 'none scored'}), so every advantage is 0 and the env score "
        "gives no gradient (envkit/zero_variance_groups = 1). Fix: tasks the model solves sometimes (an easier tier, "
        "or a warm start with envkit sft), more varied episodes (a higher --rl-num-generations or temperature), or a "
        "graded score or shaped reward (make_reward_funcs)"
    )
