"""Two training processes (DDP over gloo on CPU, through ``accelerate launch --multi_gpu`` and ``use_cpu``; with
``--cpu`` instead, accelerate starts a single process): envkit's metrics are over both processes' episodes, and the
held-out eval is sharded across them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import accelerate_launch

HERE = Path(__file__).resolve().parent


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_envkit_metrics_are_over_every_process_and_the_held_out_eval_is_sharded(tiny_model_dir, tmp_path):
    out = tmp_path / "ddp"
    out.mkdir()
    command = accelerate_launch(str(HERE / "ddp_rollout_script.py"), str(tiny_model_dir), str(out))
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=str(HERE))
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]

    # Training: each logged envkit/mean_score is the mean over both processes' episodes of that step.
    logged = {e["step"]: e for e in ranks[0]["log_history"] if "envkit/mean_score" in e}
    assert sorted(logged) == [1, 2]
    rank0_only_differs = False
    for step, entry in logged.items():
        mine, theirs = ([p for p in r["played"] if p["step"] == step - 1] for r in ranks)
        assert len(mine) == len(theirs) == 1
        both = mine[0]["scores"] + theirs[0]["scores"]
        assert len(both) == 8 and set(mine[0]["seeds"]).isdisjoint(theirs[0]["seeds"])
        assert entry["envkit/mean_score"] == pytest.approx(_mean(both))
        assert entry["envkit/mean_score"] == pytest.approx(entry["reward"])  # TRL's own mean reward, over both
        assert entry["envkit/leaked_threads"] == 0  # summed over both processes in the same gather
        rank0_only_differs |= abs(_mean(mine[0]["scores"]) - _mean(both)) > 1e-6
    assert rank0_only_differs  # a rank-local mean would have been logged otherwise: the check can fail

    # Held-out eval: each process played a distinct share of the tasks; both got the summary over all of them.
    seen = [r["eval_seen"] for r in ranks]
    assert seen[0] and seen[1] and set(seen[0]).isdisjoint(seen[1])
    tasks = sorted(set(seen[0]) | set(seen[1]))
    assert len(tasks) == 6 and sorted(seen[0] + seen[1]) == sorted(tasks * 2)  # 2 samples per task, on one process
    for r in ranks:
        summary = r["eval_summary"]
        assert summary["episodes"] == 12 and summary["tasks"] == 6
        assert summary["mean_score"] == pytest.approx(_mean([(t % 10) / 10 for t in tasks]))
