"""benchmarks/learning_rl's held-out evaluation survives a cut: each condition's result is kept as it finishes, and the
next run measures only the conditions the cut lost, to the result a run never cut returns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.learning_rl import cli, evaluation, experiments
from benchmarks.learning_rl import seed as seed_module
from benchmarks.learning_rl.training import save

pytest.importorskip("trl")


MEASURE = evaluation.evaluate
"""One condition's measurement, as the module has it (before any test replaces it)."""


class Cut(Exception):
    """A session ending mid-run."""


def _seed_with_a_model(tmp_path: Path) -> seed_module.Seed:
    """Experiment B's seed 0 with ``--quick``'s sizes, its held-out tasks, and a tiny untrained model saved as its warm
    start (an evaluation needs nothing more)."""
    from envkit.testing import build_tiny_model, build_tokenizer

    args = cli.parser().parse_args(["--quick"])
    for key, value in cli.QUICK.items():
        setattr(args, key, value)
    args.eval_concurrency = 1  # one episode at a time: batches that vary with timing would vary the samples
    seed = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path)
    seed.phase("tasks", seed.tasks)
    tokenizer = build_tokenizer()
    save(build_tiny_model(tokenizer, seed=0), tokenizer, seed.dir / "warm")
    return seed


def _counting(monkeypatch: pytest.MonkeyPatch, cut_after: int | None = None) -> list[int]:
    """Count the conditions measured (calls of :func:`evaluation.evaluate`); with ``cut_after``, the session ends
    when that many have finished."""
    calls: list[int] = []

    def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        if len(calls) == cut_after:
            raise Cut
        result = MEASURE(*args, **kwargs)
        calls.append(1)
        return result

    monkeypatch.setattr(evaluation, "evaluate", counted)
    return calls


def _without_timing(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k not in ("seconds", "cpu_seconds")}


def test_a_held_out_eval_cut_midway_goes_on_with_the_conditions_it_had_not_finished(tmp_path, monkeypatch):
    seed = _seed_with_a_model(tmp_path)
    held_out = json.loads((seed.dir / "tasks.json").read_text())["held_out"]
    model, tokenizer = seed_module.load(seed.dir / "warm")
    never_cut = evaluation.evaluate_model(model, tokenizer, seed.exp, held_out, seed.args, seed.seed)
    conditions = len(held_out)  # the conditions and pass@k's

    _counting(monkeypatch, cut_after=2)
    with pytest.raises(Cut):
        seed.phase("eval-warm_start", lambda: seed._evaluate("warm"))
    assert len(list(seed.parts("eval-warm_start").glob("*.json"))) == 2

    measured = _counting(monkeypatch)
    resumed = seed.phase("eval-warm_start", lambda: seed._evaluate("warm"))
    assert len(measured) == conditions - 2
    assert _without_timing(resumed) == never_cut
    assert f"eval warm: going on after 2 of {conditions} held-out conditions" in (seed.dir / "log.txt").read_text()
    assert not seed.parts("eval-warm_start").exists()  # removed once the phase's result is saved


def test_conditions_saved_for_other_weights_are_measured_again(tmp_path, monkeypatch):
    """A run trained again since the cut (a fresh clone has the records, not an arm's weights) is a new model: what
    the cut run measured of the old one is not reused."""
    from envkit.testing import build_tiny_model

    seed = _seed_with_a_model(tmp_path)
    _counting(monkeypatch, cut_after=2)
    with pytest.raises(Cut):
        seed.phase("eval-warm_start", lambda: seed._evaluate("warm"))
    _, tokenizer = seed_module.load(seed.dir / "warm")
    save(build_tiny_model(tokenizer, seed=1), tokenizer, seed.dir / "warm")

    measured = _counting(monkeypatch)
    seed.phase("eval-warm_start", lambda: seed._evaluate("warm"))
    held_out = json.loads((seed.dir / "tasks.json").read_text())["held_out"]
    assert len(measured) == len(held_out)
    assert "going on after" not in (seed.dir / "log.txt").read_text()
