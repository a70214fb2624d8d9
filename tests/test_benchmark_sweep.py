"""benchmarks/sweep.py's per-step timer: one sample per env step on thread workers, however the engine's per-step
functions call each other (``step_in_process`` calls ``parse_turn`` and ``render_step``: a nested call must not count
again)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

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
