"""The GRPO dataset of task seeds: one row per seed, the seed carried on the prompt for the ``rollout_func``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from envkit.core.env import Env

SEED_KEY = "envkit_task_seed"
"""Key carried by the first prompt message of :func:`build_dataset` rows: the task seed of the row."""


def build_dataset(env_factory: Callable[[], Env], seeds: Iterable[int]) -> Any:
    """A GRPO dataset: one row per task seed with a conversational ``prompt`` (the env's opening messages) and
    ``task_seed``. GRPOTrainer repeats each row ``num_generations`` times, so every group is one task.

    The seed also rides on the first prompt message (``envkit_task_seed``, ignored by chat templates), because a
    ``rollout_func`` receives only the prompts.
    """
    from datasets import Dataset

    env = env_factory()
    prompts, task_seeds = [], []
    for seed in seeds:
        opening, _ = env.reset(seed=int(seed))
        messages = [{"role": m["role"], "content": m["content"], SEED_KEY: None} for m in opening]
        messages[0][SEED_KEY] = int(seed)
        prompts.append(messages)
        task_seeds.append(int(seed))
    return Dataset.from_dict({"prompt": prompts, "task_seed": task_seeds})


def task_seed_of(prompt: Any) -> int:
    """The task seed a :func:`build_dataset` prompt carries."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) and prompt[0].get(SEED_KEY) is not None:
        return int(prompt[0][SEED_KEY])
    raise ValueError(
        "this prompt carries no task seed: build the training dataset with envkit.training.trl.build_dataset"
    )
