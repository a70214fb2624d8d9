"""The learning-rate search that gives every arm the same budget: on one seed (``--search-seed``) each arm runs at every
rate of one grid (``--learning-rates``) and keeps the rate whose run scores best on the validation split; the choice is
recorded in ``OUT/EXP/search.json``, and every other seed runs each arm at its chosen rate."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .files import write_whole

SEARCH_FILE = "search.json"
RULE = (
    "the run that scores best on the validation split of the training condition (--validation-tasks × --eval-samples "
    "episodes at temperature 1) is kept; a tie goes to the smaller rate"
)
"""How the search chooses, as its record and the report state it."""


def run_name(arm: str, learning_rate: float) -> str:
    """The name of ``arm``'s run at ``learning_rate`` (``grpo-lr0.0001``): its folder and its phases' files."""
    return f"{arm}-lr{learning_rate:g}"


def best_rate(scores: dict[float, float]) -> float:
    """The rate with the highest validation score; of equal scores the smaller rate (the smaller step away from the
    warm start: two collapsed runs tie at 0)."""
    return min(scores, key=lambda rate: (-scores[rate], rate))


class Search:
    """An experiment's learning-rate search: its record ``FOLDER/search.json``, written by the search seed as it
    chooses each arm's rate and read by the other seeds."""

    def __init__(self, folder: Path, args: argparse.Namespace) -> None:
        self.path = folder / SEARCH_FILE
        self.args = args

    def _read(self) -> dict[str, Any]:
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def _same_seed(self, record: dict[str, Any], seed: int) -> None:
        """Stop with one line if ``record`` is the search of another seed than ``seed`` (``--search-seed``)."""
        if record["seed"] != seed:
            raise SystemExit(
                f"error: {self.path} holds the search of seed {record['seed']}, not of --search-seed {seed}: "
                f"run with --search-seed {record['seed']}"
            )

    def choose(self, arm: str, seed: int, scores: dict[float, float]) -> float:
        """The rate kept for ``arm`` by its runs' validation ``scores`` on search seed ``seed``, recorded."""
        record = self._read() or {
            "seed": seed,
            "learning_rates": self.args.learning_rates,
            "rule": RULE,
            "validation": {},
            "chosen": {},
        }
        self._same_seed(record, seed)
        rate = best_rate(scores)
        record["validation"][arm] = {f"{r:g}": score for r, score in scores.items()}
        record["chosen"][arm] = rate
        write_whole(self.path, json.dumps(record, indent=1))
        return rate

    def require(self, arms: list[str], seed: int) -> None:
        """Stop with one line unless the search has chosen the rate of every arm in ``arms`` (seed ``seed`` is not the
        search seed, so it runs each arm at the chosen rate)."""
        record, searched = self._read(), self.args.search_seed
        if record:
            self._same_seed(record, searched)
        missing = [arm for arm in arms if arm not in record.get("chosen", {})]
        if missing:
            raise SystemExit(
                f"error: seed {seed} runs each arm at the learning rate the search on seed {searched} chooses, and it "
                f"has not chosen for {', '.join(missing)}: run seed {searched} first (--seed-offset {searched} "
                "--seeds 1)"
            )

    def rate(self, arm: str) -> float:
        """The rate the search chose for ``arm``."""
        return float(self._read()["chosen"][arm])
