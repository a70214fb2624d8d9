"""Smoke test of benchmarks/workers_scale.py at tiny sizes, on both kinds of env workers: the command the benchmarks'
README gives runs, loses nothing and reports what it says it does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "workers_scale.py"


@pytest.mark.parametrize("kind", ["processes", "threads"])
def test_workers_scale_runs_every_step_of_every_episode(kind):
    command = [sys.executable, str(BENCHMARK), "--episodes", "6", "--turns", "3", "--env-workers", kind, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["env_workers"], result["episodes"], result["errors"], result["steps"]) == (kind, 6, 0, 18)
    assert result["driver_cpu_ms_per_step"] > 0 and result["step_work_cpu_ms_per_step"] > 0
    if kind == "processes":
        assert 1 <= result["worker_processes"] < 6  # multiplexed: fewer processes than episodes
        assert result["step_reply_bytes_last_turn"] < 2 * result["step_reply_bytes_first_turn"]  # new messages only
    else:
        assert "worker_processes" not in result
        by_turn = result["driver_cpu_ms_per_step_at_turn"]  # one batch per turn: the turn's steps are timed apart
        assert set(by_turn) == {"1", "3"} and all(value > 0 for value in by_turn.values())
