"""Smoke test of benchmarks/learning.py: the whole pipeline for a few steps, and its held-out overlap check."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import envkit
from envkit.chat.render import ChatRenderer
from envkit.testing import build_tokenizer

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "learning.py"
DEMO = BENCHMARK.parents[1] / "scripts" / "demo.sh"

pytest.importorskip("trl")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("benchmark_learning", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def renderer_for(env):
    return ChatRenderer(build_tokenizer(), getattr(env, "tools", None) or None)


PHASES = (
    "oracle demonstrations",
    "SFT warm start",
    "eval warm start (held-out)",
    "train ",  # envkit train's live bar: GRPO
    "eval after GRPO (held-out)",
    "SFT continuation (GRPO's CPU time)",
    "eval after SFT continuation (held-out)",
)


def test_learning_benchmark_pipeline_end_to_end(bench, tmp_path, capsys):
    """With --progress (the demo's) every phase shows a bar with an ETA on stderr; the last lines are the figures."""
    result = bench.main(["--quick", "--progress", "--out", str(tmp_path)])
    (run,) = result["runs"]
    assert run["overlap"] == 0 and run["held_out_tasks"] == 4 and run["sft_demos"] == 16
    for arm in ("before", "grpo", "sft_baseline"):
        assert len(run[arm]["evals"]) == 2 and 0.0 <= run[arm]["mean_score"] <= 1.0
        assert run[arm]["noise"] >= 0.0
    assert run["grpo_seconds"] > 0 and run["sft_continuation_steps"] >= 1 and run["curve"]
    saved = json.loads((tmp_path / "learning.json").read_text())
    assert saved["runs"][0]["seed"] == 0 and (tmp_path / "learning_curve.png").stat().st_size > 0
    captured = capsys.readouterr()
    out = captured.out
    assert "overlap: 0 prompts, 0 seeds" in out and "| run | warm start" in out and "after SFT, same time" in out
    assert "train_runtime" not in out and not [line for line in out.splitlines() if line.startswith("{")]  # no TRL dict
    bars = captured.err.replace("\r", "\n").splitlines()
    for phase in PHASES:
        assert any(line.startswith(phase) and "| ETA " in line for line in bars), (phase, captured.err[-2000:])
    *_, figures, _, files = out.strip().splitlines()
    b, g, s = run["before"]["mean_score"], run["grpo"]["mean_score"], run["sft_baseline"]["mean_score"]
    assert figures.startswith("run 0: held-out score on 4 tasks (mean of 2 evals): ")
    assert f"warm start {b:.3f} → after GRPO {g:.3f}" in figures and f"same CPU time {s:.3f}" in figures
    assert files == f"figures: {tmp_path / 'learning.json'} · reward curve: {tmp_path / 'learning_curve.png'}"


def test_runs_can_share_one_warm_start(bench, tmp_path, capsys):
    """``--shared-warm-start``: one SFT warm start (and its evaluation) for every run; GRPO and the baseline differ.
    Without --progress and with stderr not a terminal (a CI log), no bars."""
    result = bench.main(["--quick", "--runs", "2", "--shared-warm-start", "--out", str(tmp_path)])
    assert "ETA" not in capsys.readouterr().err
    first, second = result["runs"]
    assert [first["seed"], second["seed"]] == [0, 1] and first["warm_start_seed"] == second["warm_start_seed"] == 0
    assert first["before"] == second["before"] and first["sft_seconds"] == second["sft_seconds"]


def test_overlapping_seed_ranges_fire_the_held_out_assertion(bench):
    renderer = renderer_for(bench.factory())
    with pytest.raises(bench.HeldOutOverlap, match="8 of 8 held-out opening prompts are training prompts and 8 seeds"):
        bench.check_held_out(renderer, range(0, 64), range(32, 40), log=lambda _: None)
    assert bench.check_held_out(renderer, range(0, 64), range(1_000_000, 1_000_008), log=lambda _: None) == 0


def test_a_narrow_task_space_fires_it_even_on_disjoint_seed_ranges(bench, monkeypatch):
    """guess-number with the old benchmark's fixed range 1–32 has one opening prompt: nothing is held out."""
    monkeypatch.setattr(bench, "factory", lambda: envkit.make("guess-number", low=1, high=32))
    renderer = renderer_for(bench.factory())
    lines = []
    with pytest.raises(
        bench.HeldOutOverlap, match="16 of 16 held-out opening prompts are training prompts and 0 seeds"
    ):
        bench.check_held_out(renderer, range(0, 100), range(1_000_000, 1_000_016), log=lines.append)
    assert "overlap: 16 prompts, 0 seeds" in lines[0]


@pytest.mark.parametrize("config", [{}, {"kinds": ["containers"]}])
def test_arithmetic_task_space_is_wide_enough_to_hold_tasks_out(config):
    env = envkit.make("arithmetic", **config)
    prompts = {env.reset(seed=seed)[0][-1]["content"] for seed in range(5000)}
    assert len(prompts) == 5000


@pytest.mark.slow
def test_demo_script_shows_bars_and_ends_with_the_figures_and_the_png_path(tmp_path):
    """scripts/demo.sh, shrunk by extra flags (they go to learning.py): bars with ETAs on stderr even off a terminal
    (the demo passes --progress), and its last lines are the held-out figures and the files."""
    venv = Path(sys.prefix)
    if not (venv / "bin" / "envkit").is_file():
        pytest.skip("the demo runs $ENVKIT_VENV/bin/envkit; this interpreter's prefix has none")
    env = {**os.environ, "ENVKIT_VENV": str(venv), "ENVKIT_DEMO_DIR": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(DEMO), "--quick", "--grpo-steps", "2", "--eval-tasks", "4"],
        env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    *_, figures, _, files = done.stdout.strip().splitlines()
    assert figures.startswith("run 0: held-out score on 4 tasks (mean of 2 evals): warm start ")
    assert files == f"figures: {tmp_path / 'learning.json'} · reward curve: {tmp_path / 'learning_curve.png'}"
    assert (tmp_path / "learning_curve.png").stat().st_size > 0
    bars = done.stderr.replace("\r", "\n").splitlines()
    for phase in PHASES:
        assert any(line.startswith(phase) and "| ETA " in line for line in bars), phase
