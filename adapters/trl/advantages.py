"""The advantage of each episode in its GRPO group: the one definition both training paths use.

The synchronous path hands TRL's ``GRPOTrainer`` one reward per episode (:func:`envkit.adapters.trl.env_score_reward`;
``None`` for a failed episode) and the trainer normalises them in their group; the ``--async`` path builds
``RolloutSample`` objects itself (:mod:`envkit.adapters.trl.async_grpo.worker`) and calls :func:`group_advantages`.
``tests/test_trl_failures.py`` runs a real ``GRPOTrainer`` and checks that its advantages are this function's, so a
TRL release that changes its normalisation fails CI instead of making the two paths train on different signals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

EPSILON = 1e-4
"""Added to the group's standard deviation (``GRPOTrainer``'s constant)."""


def group_advantages(scores: Sequence[float | None]) -> list[float]:
    """``GRPOTrainer``'s default advantages (``scale_rewards="group"``) for one group's scores.

    ``(score − mean) / (std + 1e-4)`` with the sample standard deviation, both over the episodes that ran; a failed
    episode (``None``) gets 0 and no say in its group's baseline, and so does everyone in a group where fewer than
    two episodes ran (their deviation is 0, as in the trainer).

    Example:
        >>> [round(a, 3) for a in group_advantages([0.0, 1.0, None])]
        [-0.707, 0.707, 0.0]
    """
    ran = [s for s in scores if s is not None]
    if not ran:
        return [0.0] * len(scores)
    mean = sum(ran) / len(ran)
    std = math.sqrt(sum((s - mean) ** 2 for s in ran) / (len(ran) - 1)) if len(ran) > 1 else 0.0
    return [0.0 if s is None else (s - mean) / (std + EPSILON) for s in scores]
