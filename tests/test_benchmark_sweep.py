"""benchmarks/sweep.py's per-step timer: one sample per env step on thread workers, however the engine's per-step
functions call each other (``step_in_process`` calls ``parse_turn`` and ``render_step``: a nested call must not count
again); and its ``--out`` file, written after every point."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from envkit.backends import SamplingParams, ScriptedBackend
from envkit.rollout import RolloutEngine
from envkit.testing import build_tokenizer

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "sweep.py"


def load_sweep():
    spec = importlib.util.spec_from_file_location("benchmark_sweep_timer", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_step_timer_takes_one_sample_per_step_on_thread_workers():
    sweep = load_sweep()
    tokenizer = build_tokenizer()
    engine = RolloutEngine(
        lambda: sweep.SweepEnv("instant", 3), ScriptedBackend("Noted.<|im_end|>", tokenizer=tokenizer), tokenizer
    )
    samples, undo = sweep.step_timer()
    try:
        episodes = engine.run(list(range(4)), 1, SamplingParams(max_new_tokens=8))
    finally:
        undo()
        engine.close()
    steps = sum(len(e.rewards) for e in episodes)
    assert steps == 12 and all(e.error is None for e in episodes)
    assert len(samples) == steps  # each whole step once: parse and render inside it are not samples of their own
    assert all(value >= 0 for value in samples)
    from envkit.rollout import steps

    assert steps.step_in_process.__name__ == "step_in_process"  # undone: the engine's own functions are back


def test_a_sweep_cut_short_keeps_the_points_it_measured(tmp_path, monkeypatch):
    """A full sweep runs for tens of minutes: a point that fails (or a run that is killed) must not lose the points
    already measured. Only the point runner is replaced here: the loop and the file are the sweep's own."""
    sweep = load_sweep()
    measured = []

    def run_point(concurrency, turns, latency, *rest):
        if measured:
            raise RuntimeError("the second point fails")
        measured.append(concurrency)
        printed = "episodes_per_s driver_cpu_ms_per_step step_cpu_ms_p50 step_cpu_ms_p99 loop_lag_ms_p50 "
        figures = dict.fromkeys((printed + "loop_lag_ms_p99 generate_share efficiency").split(), 1.0)
        return figures | {"episodes": concurrency, "worker_processes": 0, "backend_calls": 5, "errors": 0}

    monkeypatch.setattr(sweep, "run_point", run_point)
    out = tmp_path / "sweep.json"
    with pytest.raises(RuntimeError, match="the second point fails"):
        sweep.main(["--concurrency", "32,128", "--turns", "5", "--latency", "instant", "--out", str(out)])
    assert measured == [32]
    assert [point["episodes"] for point in json.loads(out.read_text())["points"]] == [32]
