"""Smoke test of benchmarks/length_groups.py at a tiny size: every tolerance plays the same work and is timed."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "length_groups.py"

pytest.importorskip("trl")  # benchmarks/rollout, which it builds on, imports TRL's trainer


def test_length_groups_benchmark_times_every_tolerance_on_identical_work(tmp_path):
    spec = importlib.util.spec_from_file_location("benchmark_length_groups", BENCHMARK)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    result = bench.measure(8, 2, [0.1, math.inf], tmp_path / "model", sft=False)  # raises if the tokens differ
    assert set(result) == {"0.1", "inf"}
    for timing in result.values():
        assert len(timing["all"]) == 2 and 0 < timing["min"] <= timing["median"] <= timing["max"]
