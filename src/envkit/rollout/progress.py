"""A run's progress bar: episodes done, and the turns played so far (long episodes move it before any ends)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from envkit.rollout.episode import Episode

PROGRESS_REFRESH_S = 0.1
"""At most this often the bar is redrawn for a turn (a fast backend finishes thousands of turns a second)."""


def progress_bar(total: int, enabled: bool) -> Any:
    """A tqdm bar over ``total`` episodes (disabled, drawing nothing, unless ``enabled``)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="episodes", unit="ep", disable=not enabled, leave=False)


def turn_counter(bar: Any, on_turn: Callable[[Episode], None] | None) -> Callable[[Episode], None] | None:
    """The per-turn hook of one run: counts turns on the bar (``N turns``, redrawn at most every
    :data:`PROGRESS_REFRESH_S`), then calls ``on_turn``. None when there is nothing to do (no bar, no callback)."""
    if bar.disable:
        return on_turn
    turns, redrawn = 0, -math.inf

    def turn_done(episode: Episode) -> None:
        nonlocal turns, redrawn
        turns += 1
        now = time.monotonic()
        refresh = now - redrawn >= PROGRESS_REFRESH_S
        if refresh:
            redrawn = now
        bar.set_postfix_str(f"{turns} turns", refresh=refresh)  # else shown at the next redraw
        if on_turn is not None:
            on_turn(episode)

    return turn_done
