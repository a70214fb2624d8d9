"""``envkit eval``'s summary beyond the metrics: how the episodes ended, which tasks ran, components that did not
apply, and what the env itself says the eval measured (:class:`DescribesEval`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from envkit.core.env import task_id_of
from envkit.rollout import Episode

MAX_TASK_IDS = 20
"""Task ids listed in the table; past this many, the count of the rest."""


@runtime_checkable
class DescribesEval(Protocol):
    """An env that says what an eval of it measured (optional): ``envkit eval`` prints its lines under the metrics.

    τ²-bench's envs (:class:`envkit.envs.tau2.Tau2Env`) name the split, the customer and what differs from the
    setup of published τ²-bench results; an env whose numbers need no such context leaves it out.
    """

    def eval_notes(self, episodes: Sequence[Mapping[str, Any]]) -> list[str]:
        """Lines for the summary, called once after the run, possibly on a closed env (read its configuration only).

        Args:
            episodes: Each episode's ``task_seed``, ``info`` (reset's), ``messages``, ``finish_reason``,
                ``score_components`` and ``error``, as :class:`envkit.rollout.Episode` holds them.

        Returns:
            One line per note, without a trailing newline.
        """
        ...


def task_ids(episodes: Sequence[Episode]) -> list[str]:
    """The distinct task ids the episodes' reset infos name (``info["task_id"]``), in task-seed order; ``[]`` when
    the env names none. A malformed id is left out (the engine's task checks report it)."""
    ids: dict[str, None] = {}
    for episode in sorted(episodes, key=lambda e: e.task_seed):
        try:
            task_id = task_id_of(episode.info)
        except ValueError:
            continue
        if task_id is not None:
            ids[task_id] = None
    return list(ids)


def summary_rows(metrics: Mapping[str, float], episodes: Sequence[Episode]) -> list[tuple[str, str]]:
    """The table's rows: every metric of :func:`envkit.rollout.summarize` but the counts ``ending/*`` and
    ``scored/*``, which are folded in: one ``endings`` row (``done 2 · max_turns 1``) after ``error_rate``, and a
    component that some episodes did not have reads ``0.5 (n/a on 1 of 3)`` (episodes that ran without error but
    whose task had nothing to check for it). A ``task ids`` row follows when the env names its tasks.

    Args:
        metrics: What :func:`~envkit.rollout.summarize` returned for ``episodes``.
        episodes: The episodes of the run.

    Returns:
        ``(metric, value)`` pairs, values formatted for reading.
    """
    endings = " · ".join(
        f"{key.removeprefix('ending/')} {value:g}" for key, value in metrics.items() if key.startswith("ending/")
    )
    ran = sum(e.error is None for e in episodes)
    rows: list[tuple[str, str]] = []
    for key, value in metrics.items():
        if key.startswith(("ending/", "scored/")):
            continue
        text = f"{value:.4g}"
        if key.startswith("score/"):
            missing = ran - int(metrics.get(f"scored/{key.removeprefix('score/')}", ran))
            if missing > 0:
                text += f" (n/a on {missing} of {len(episodes)})"
        rows.append((key, text))
        if key == "error_rate" and endings:
            rows.append(("endings", endings))
    ids = task_ids(episodes)
    if ids:
        shown = ", ".join(_short(i) for i in ids[:MAX_TASK_IDS])
        rows.append(("task ids", shown + (f", … ({len(ids)} in all)" if len(ids) > MAX_TASK_IDS else "")))
    return rows


def env_notes(env: Any, episodes: Sequence[Episode]) -> list[str]:
    """``env``'s :meth:`DescribesEval.eval_notes` for the run, ``[]`` for an env without them."""
    if not isinstance(env, DescribesEval):
        return []
    fields = ("task_seed", "info", "messages", "finish_reason", "score_components", "error")
    return env.eval_notes([{name: getattr(e, name) for name in fields} for e in episodes])


def _short(task_id: str) -> str:
    """A long id (a digest) cut to its first 12 characters."""
    return task_id if len(task_id) <= 16 else task_id[:12] + "…"


def training_mismatches(
    model: str,
    target: str,
    seeds: Sequence[int],
    *,
    env_config: dict[str, Any] | None = None,
    max_new_tokens: int,
    max_completion_tokens: int | None,
) -> list[str]:
    """Warnings for an eval of a model ``envkit train`` saved (its folder's ``eval_summary.json`` has a ``training``
    entry) on the env it trained on: task seeds it trained on (a held-out score they are not; every seed, for a
    seed-style class with the constructor config ``env_config`` it trained with: another config may build other rows),
    and budgets other than those it trained with. Nothing for another env or a folder without that entry."""
    import json
    from pathlib import Path

    from envkit.adapters.trl.heldout import EVAL_SEED_OFFSET

    try:
        summary = json.loads((Path(model) / "eval_summary.json").read_text(encoding="utf-8"))
        training, env = summary["training"], summary["env"]
        every_seed = training["train_tasks"] is None  # a seed-style class: seed s plays build_dataset's row s % rows
        train_tasks = 0 if every_seed else int(training["train_tasks"])
        trained_tokens = int(training["max_new_tokens"])
        trained_budget = training.get("max_completion_tokens")
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if env != target:
        return []
    warnings = []
    seen = sum(1 for seed in seeds if 0 <= seed < train_tasks)
    if every_seed and seeds and summary.get("env_config") == env_config:
        warnings.append(
            f"the {len(seeds)} task seeds are build_dataset rows {model} trained on (a seed-style class trains on all "
            "of its rows; task seed s plays row s % rows): not a held-out score; evaluate it on rows it did not train "
            "on (another split, by the class's constructor config)"
        )
    elif seen:
        warnings.append(
            f"{seen} of the {len(seeds)} task seeds are tasks {model} trained on (seeds 0-{train_tasks - 1}, its "
            f"eval_summary.json): not a held-out score; --seed {EVAL_SEED_OFFSET} evaluates the held-out tasks "
            "envkit train scored"
        )
    if max_new_tokens != trained_tokens or (trained_budget is not None and max_completion_tokens != trained_budget):
        warnings.append(
            f"{model} trained with {trained_tokens} tokens per turn and an episode budget of "
            f"{trained_budget if trained_budget is not None else 'none'}; this eval gives {max_new_tokens} and "
            f"{max_completion_tokens if max_completion_tokens is not None else 'none'} (--max-new-tokens, "
            "--max-completion-tokens)"
        )
    return warnings
