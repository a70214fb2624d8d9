"""Smoke test of benchmarks/rollout.py: its whole pipeline at tiny sizes (random model, no SFT, one repeat)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "rollout.py"

pytest.importorskip("trl")


def load_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark_rollout", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_rollout_benchmark_pipeline(tmp_path):
    bench = load_benchmark()
    results = bench.run_benchmark(
        episodes=[4],
        repeats=1,
        workloads=list(bench.WORKLOADS),
        checkpoint=tmp_path / "model",
        sft=False,
        per_turn=4,
        log=lambda _: None,
    )
    json.dumps(results, default=float)  # what --json prints
    for key in ("ratio_vs_trl", "ratio_vs_trl_latency50ms", "ratio_vs_trl_hetero", "overhead_fraction"):
        assert isinstance(results[key], float), key
    for name in bench.WORKLOADS:
        data = results["workloads"][name]["4"]
        arms = data["arms"]
        assert set(arms) == {"trl", "envkit_trl", "envkit", "limit"}
        for arm in ("trl", "envkit_trl", "envkit"):
            assert [run["episodes"] for run in arms[arm]["runs"]] == [4], (name, arm)
            assert arms[arm]["max_turn_tokens"] <= 4, (name, arm)  # the per-turn cap holds on every arm
            assert len(arms[arm]["seconds"]["all"]) == 1  # the warm-up is not reported
        assert data["limit_tokens_identical"], name  # the limit arm regenerated exactly the recorded tokens


def test_gather_window_benchmark_runs_every_window_on_the_same_work(tmp_path):
    # benchmarks/gather.py: the bare engine with several gather windows, side by side (random model, tiny sizes).
    spec = importlib.util.spec_from_file_location("benchmark_gather", BENCHMARK.with_name("gather.py"))
    gather = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gather)
    gather.rollout.prepare_checkpoint(tmp_path / "model", sft=False, log=lambda _: None)
    results = gather.bench("hetero", 4, 1, tmp_path / "model", [0.05, 0.25])
    json.dumps(results, default=float)
    assert set(results) == {"gather 0.05 s", "gather 0.25 s"}
    first, second = (results[name]["runs"][0] for name in results)
    assert first["model_tokens"] == second["model_tokens"]  # the same seeds: the same tokens generated
    assert first["errors"] == second["errors"] == 0
