"""Where an ``envkit train --async`` checkpoint keeps the rollout's place, so a resumed run goes on from it: written
by :class:`~.trl_async.EnvkitAsyncGRPOTrainer` with each checkpoint, read back by it (and checked at start-up by
``envkit train``) when a run resumes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROLLOUT_STATE_FILE = "envkit_rollout_state.json"
"""Where an ``--async`` checkpoint keeps the rollout's place: ``{"next_group": …, "done_after": […],
"model_version": …}`` and the settings of :data:`ORDER_FLAGS` (the worker's
:meth:`~.worker.EnvkitRolloutWorker.resume_state` and the trainer's policy version when it was saved)."""


def read_rollout_state(checkpoint: str | Path) -> dict[str, Any] | None:
    """The rollout's place saved in ``checkpoint`` (:data:`ROLLOUT_STATE_FILE`); ``None`` when the checkpoint has
    none (no ``--async`` run saved it)."""
    path = Path(checkpoint) / ROLLOUT_STATE_FILE
    if not path.is_file():
        return None
    state = json.loads(path.read_text())
    return {
        "next_group": int(state["next_group"]),
        "done_after": [int(g) for g in state["done_after"]],
        "model_version": int(state["model_version"]),
        **{key: int(state[key]) for key in ORDER_FLAGS},
    }


ORDER_FLAGS = {"train_tasks": "--train-tasks", "seed": "--seed", "num_generations": "--num-generations"}
"""The settings that number the groups (the task order and each group's sampling seed), saved with the rollout's
place, and their flags: a run resumed under other values would take the saved groups for other tasks."""
