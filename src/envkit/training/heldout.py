"""Held-out evaluation tasks of ``envkit train`` (the synchronous and the ``--async`` path): their seeds, and whether
any of them opens like a training task (then the eval is not called held-out)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

EVAL_SEED_OFFSET = 1_000_000
"""Held-out evaluation tasks use seeds from here on, far from the training seeds ``0 … train_tasks-1``."""


def eval_seeds(args: Any) -> list[int]:
    """The eval task seeds: ``--eval-tasks`` of them from :data:`EVAL_SEED_OFFSET` on."""
    return list(range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + args.eval_tasks))


def opening_key(messages: list[dict[str, Any]]) -> str:
    """A digest of a task's opening messages (roles and contents): two tasks with one key look the same to the model."""
    opening = [[m.get("role"), m.get("content")] for m in messages]
    return hashlib.sha256(json.dumps(opening, sort_keys=True, default=str).encode()).hexdigest()


def eval_tasks_seen_in_training(training_prompts: Any, factory: Any, seeds: list[int]) -> int:
    """How many of the eval tasks ``seeds`` open with the same messages as a training task (``training_prompts``: the
    training dataset's opening conversations, hashed once). Distinct seeds do not make distinct tasks: an env with 5
    questions gives every eval seed a training twin, and its "held-out" score would measure memorisation."""
    training = {opening_key(prompt) for prompt in training_prompts}
    env = factory()
    try:
        return sum(opening_key(env.reset(seed=seed)[0]) in training for seed in seeds)
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


def eval_label(seen: int, total: int) -> str:
    """What to call the eval: "held-out" only when none of its ``total`` tasks was seen in training."""
    return "held-out" if seen == 0 else f"eval ({seen} of {total} tasks seen in training)"
