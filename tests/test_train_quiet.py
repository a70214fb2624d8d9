"""``envkit train`` prints no FutureWarnings of TRL's calls into transformers (issue 23 item 7), checked in a real
process: pytest's own warning capture would hide them from any in-process test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ENVKIT = str(Path(sys.executable).with_name("envkit"))


def test_a_training_run_prints_no_transformers_future_warnings(tiny_model_dir, tmp_path):
    argv = ["train", "--env", "guess-number", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path)]
    argv += ["--max-steps", "1", "--rl-max-new-tokens", "8", "--max-turns", "1", "--per-device-train-batch-size", "2"]
    argv += ["--rl-num-generations", "2", "--train-tasks", "2", "--eval-tasks", "0", "--disable-tqdm", "true"]
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONWARNINGS": ""}
    result = subprocess.run([ENVKIT, *argv], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    warned = [line for line in (result.stdout + result.stderr).splitlines() if "FutureWarning" in line]
    assert warned == []
    assert (tmp_path / "log_history.json").is_file()
