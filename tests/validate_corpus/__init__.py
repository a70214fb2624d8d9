"""The corpus of issue 38: clean envs of four shapes and planted bugs, each one realistic edit of a clean twin.

``envkit validate`` must pass every clean env with no FAIL and fail every planted bug with exactly the check the bug
names. ``tests/test_validate_corpus.py`` holds both; ``benchmarks/validate_recall.py`` writes the recall table.

Modules: :mod:`~validate_corpus.clean` (the clean envs), :mod:`~validate_corpus.planted` (what a planted bug is),
:mod:`~validate_corpus.bugs_answer` (classes 1, 2, 3 and 7) and :mod:`~validate_corpus.bugs_runtime` (4, 5 and 6).
"""

from __future__ import annotations

import importlib

from validate_corpus.bugs_answer import BUGS as ANSWER_BUGS
from validate_corpus.clean import CLEAN_ENVS
from validate_corpus.planted import BUG_CLASSES, SHAPES, PlantedBug


def _runtime_bugs() -> list[PlantedBug]:
    try:
        module = importlib.import_module("validate_corpus.bugs_runtime")
    except ModuleNotFoundError as error:
        if error.name != "validate_corpus.bugs_runtime":
            raise
        return []
    return list(module.BUGS)


BUGS: list[PlantedBug] = [*ANSWER_BUGS, *_runtime_bugs()]
"""Every planted bug of the corpus."""

__all__ = ["BUGS", "BUG_CLASSES", "CLEAN_ENVS", "SHAPES", "PlantedBug"]
