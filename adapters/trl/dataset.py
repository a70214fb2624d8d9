"""The GRPO dataset of task seeds: one row per seed, the seed carried on the prompt for the ``rollout_func``."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from envkit.core.env import Env, task_identity

SEED_KEY = "envkit_task_seed"
"""Key carried by the first prompt message of :func:`build_dataset` rows: the task seed of the row."""
TASK_KEY = "envkit_task"
"""Key carried by the first prompt message of :func:`build_dataset` rows: the row's task
(:func:`envkit.core.env.task_identity`), so ``envkit train``'s held-out check need not reset the training tasks again;
``None`` when the reset's ``info["task_id"]`` is not a task id."""


def build_dataset(env_factory: Callable[[], Env], seeds: Iterable[int]) -> Any:
    """A GRPO dataset: one row per task seed with a conversational ``prompt`` (the env's opening messages) and
    ``task_seed``. GRPOTrainer repeats each row ``num_generations`` times, so every group is one task.

    The seed also rides on the first prompt message (``envkit_task_seed``, ignored by chat templates), because a
    ``rollout_func`` receives only the prompts. So does the task it is (``envkit_task``), for the held-out check.
    """
    from datasets import Dataset

    env = env_factory()
    prompts, task_seeds = [], []
    for seed in seeds:
        opening, info = env.reset(seed=int(seed))
        messages = [{"role": m["role"], "content": m["content"], SEED_KEY: None, TASK_KEY: None} for m in opening]
        messages[0][SEED_KEY] = int(seed)
        with contextlib.suppress(ValueError):  # a bad task id: the held-out check resets the seed and says so
            messages[0][TASK_KEY] = task_identity(opening, info)
        prompts.append(messages)
        task_seeds.append(int(seed))
    return Dataset.from_dict({"prompt": prompts, "task_seed": task_seeds})


def task_seed_of(prompt: Any) -> int:
    """The task seed a :func:`build_dataset` prompt carries."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) and prompt[0].get(SEED_KEY) is not None:
        return int(prompt[0][SEED_KEY])
    raise ValueError(
        "this prompt carries no task seed: build the training dataset with envkit.adapters.trl.build_dataset"
    )
