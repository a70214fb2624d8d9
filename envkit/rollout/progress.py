"""A run's progress bar: episodes done, the turns played so far (long episodes move it before any ends), and the
generation under way: which turn, its tokens so far and tokens/s (a long first turn on a slow CPU does not look like
a hang), for backends that can say (:class:`~envkit.backends.base.ReportsTokens`)."""

from __future__ import annotations

import asyncio
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


def progress_text(turns: int, turn: int, max_turns: int | None, tokens: int | None, seconds: float) -> str:
    """The bar's postfix: ``3 turns · turn 2 of 10: 57 tokens, 9.3 tok/s``.

    Args:
        turns: Turns finished in the run so far (all its episodes).
        turn: The turn being generated (the furthest episode's; 0: none yet).
        max_turns: Turns an episode may take (None: the env decides, and ``of n`` is left out).
        tokens: Tokens of the generation call under way (None: the backend does not say).
        seconds: Seconds that call has run.

    Returns:
        The text.
    """
    text = f"{turns} turns"
    if turn:
        text += f" · turn {turn}" + (f" of {max_turns}" if max_turns else "")
        if tokens is not None:
            rate = f"{tokens / seconds:.1f}" if seconds > 0 else "?"
            text += f": {tokens} tokens, {rate} tok/s"
    return text


class RunProgress:
    """The bar's postfix for one run (:func:`progress_text`): fed on the event loop by the engine (a turn begins, a
    turn ends) and from the generating thread by the backend (:meth:`tokens`, handed over to the loop).

    Args:
        bar: The run's enabled tqdm bar.
        max_turns: The engine's turn cap (None: the env's own, not known here).
        on_turn: The caller's per-turn callback, called after the bar counts the turn.
    """

    def __init__(self, bar: Any, max_turns: int | None, on_turn: Callable[[Episode], None] | None = None) -> None:
        self.bar, self.max_turns, self.on_turn = bar, max_turns, on_turn
        self.loop = asyncio.get_running_loop()
        self.turns = self.turn = 0
        self.generated: int | None = None
        self.seconds = 0.0
        self.redrawn = -math.inf

    def generating(self, turn: int) -> None:
        """An episode asks for its ``turn``-th turn (1-based)."""
        if turn > self.turn:
            self.turn, self.generated = turn, None
            self._show(force=True)

    def tokens(self, count: int, seconds: float) -> None:
        """A :data:`~envkit.backends.base.TokenHook`: the call under way has generated ``count`` tokens in ``seconds``
        (any thread; shown from the loop)."""
        self.loop.call_soon_threadsafe(self._tokens, count, seconds)

    def _tokens(self, count: int, seconds: float) -> None:
        self.generated, self.seconds = count, seconds
        self._show(force=True)  # the backend reports a few times a second at most

    def turn_done(self, episode: Episode) -> None:
        """The engine's per-turn hook: counts the turn, then calls ``on_turn``."""
        self.turns += 1
        self._show()
        if self.on_turn is not None:
            self.on_turn(episode)

    def _show(self, force: bool = False) -> None:
        now = time.monotonic()
        refresh = force or now - self.redrawn >= PROGRESS_REFRESH_S
        if refresh:
            self.redrawn = now
        text = progress_text(self.turns, self.turn, self.max_turns, self.generated, self.seconds)
        self.bar.set_postfix_str(text, refresh=refresh)  # else shown at the next redraw
