"""What a planted bug is: one realistic edit of a clean env of the corpus, and the check that must catch it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import envkit

BUG_CLASSES: dict[int, str] = {
    1: "the answer is visible to the agent",
    2: "the score ignores a tool-call answer",
    3: "the score accepts more than the answer",
    4: "the score or a tool crashes on what a model sends",
    5: "state leaks between episodes or instances",
    6: "limits that are not what they say",
    7: "tasks told apart by content and hidden state",
}
"""Issue 38's classes of env bugs, by number."""
SHAPES = ("text", "tool-call", "db", "multi-turn")
"""The env shapes of the corpus (the keys of :data:`validate_corpus.clean.CLEAN_ENVS`)."""


@dataclass(frozen=True)
class PlantedBug:
    """One planted bug of the corpus.

    Args:
        id: A short unique name, e.g. ``"sql-gold-compared-with-itself"``.
        bug_class: Its class, a key of :data:`BUG_CLASSES`.
        shape: The shape of its clean twin, one of :data:`SHAPES`.
        description: What the edit does, in one line.
        factory: Builds the buggy env (its class: a subclass of the clean twin overriding one thing).
        expected: The title of the check that must FAIL on it (and be the only FAIL).
    """

    id: str
    bug_class: int
    shape: str
    description: str
    factory: Callable[[], envkit.Env]
    expected: str

    def __post_init__(self) -> None:
        if self.bug_class not in BUG_CLASSES:
            raise ValueError(f"bug {self.id!r}: class {self.bug_class} is not one of {sorted(BUG_CLASSES)}")
        if self.shape not in SHAPES:
            raise ValueError(f"bug {self.id!r}: shape {self.shape!r} is not one of {', '.join(SHAPES)}")
