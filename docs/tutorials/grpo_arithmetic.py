"""Tutorial 2: GRPO on the built-in ``arithmetic`` env with a tiny model, through the ``envkit`` command.

Run it: ``python docs/tutorials/grpo_arithmetic.py [WORKDIR]`` (a few minutes on CPU). It does what a user types:

    envkit model tiny WORKDIR/tiny --env arithmetic
    envkit validate arithmetic --episodes 4
    envkit train arithmetic --model WORKDIR/tiny --output-dir WORKDIR/run --max-steps 2 ...

A random tiny model never calls the calculator, so two steps teach it nothing: the run shows the pipeline and what a
run writes (the LoRA adapter, ``log_history.json``, ``eval_summary.json``, ``reward_curve.png``). For a run that
learns, see ``bash scripts/demo.sh`` (an SFT warm start first, then 100 GRPO steps: the Results page has its figures).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from envkit.cli import main as envkit


def run(workdir: Path) -> dict:
    """Build the model, validate the env, train two GRPO steps; return the run's ``eval_summary.json``."""
    model, out = workdir / "tiny", workdir / "run"
    assert envkit(["model", "tiny", str(model), "--env", "arithmetic"]) == 0
    assert envkit(["validate", "arithmetic", "--episodes", "4"]) == 0
    train = ["train", "arithmetic", "--model", str(model), "--output-dir", str(out)]
    budget = ["--max-steps", "2", "--per-device-train-batch-size", "4", "--num-generations", "4"]
    short = ["--rl-max-new-tokens", "8", "--max-turns", "2", "--eval-tasks", "4", "--disable-tqdm", "true"]
    assert envkit([*train, *budget, *short]) == 0
    history = json.loads((out / "log_history.json").read_text())
    print(f"logged steps: {[row['step'] for row in history if 'envkit/mean_score' in row]}")
    print(f"files written: {sorted(p.name for p in out.iterdir())}")
    return json.loads((out / "eval_summary.json").read_text())


if __name__ == "__main__":
    if len(sys.argv) > 1:
        summary = run(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as folder:
            summary = run(Path(folder))
    print(f"held-out mean score before / after: {summary['before']['mean_score']} / {summary['after']['mean_score']}")
