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


def test_turn_clock_attributes_split_batches_to_their_turn():
    """Batches that do not follow the turns (a turn's requests split over two calls) are still attributed by the
    run's request count; before, such a run reported no per-turn figure at all."""
    sys.path.insert(0, str(BENCHMARK.parent))
    from workers_scale import TurnClock

    clock = TurnClock(inner=None)
    # 2 episodes, 10 turns, turn t costing t ms per step; turn 5's two requests come in two calls of one
    cpu, calls = 0.0, []
    for turn in range(1, 11):
        for n in (1, 1) if turn == 5 else (2,):
            calls.append((cpu, n))
            cpu += turn * n / 1000
    clock.calls, clock.backend_cpu = calls, [0.0] * len(calls)
    # each mark is the median over the turns within two of it: turn 1 of turns 1-3, turn 10 of turns 8-9 (the last
    # turn's own CPU also scores and closes the envs: left out)
    assert clock.per_turn(episodes=2, turns=10, cpu_end=cpu + 1.0) == {"1": 2.0, "10": 8.5}


def test_a_one_turn_run_has_no_turn_to_report_and_says_so_by_leaving_it_out():
    sys.path.insert(0, str(BENCHMARK.parent))
    from workers_scale import TurnClock

    clock = TurnClock(inner=None)
    clock.calls, clock.backend_cpu = [(0.0, 4)], [0.0]
    assert clock.per_turn(episodes=4, turns=1, cpu_end=0.004) == {}  # its only turn also scores: no step figure
