"""envkit train's eval is called held-out only when its tasks are held out by content, not just by seed (issue 23
item 3): examples/capitals.py has 5 questions, so every eval seed asks one a training seed asked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from envkit.cli.app import main

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[1]
CAPITALS = str(ROOT / "examples" / "capitals.py") + ":CapitalsEnv"
FAST = [
    "--max-steps",
    "1",
    "--rl-max-new-tokens",
    "4",
    "--max-turns",
    "1",
    "--per-device-train-batch-size",
    "4",
    "--rl-num-generations",
    "2",
    "--train-tasks",
    "8",
    "--eval-tasks",
    "5",
]


def _legend_labels(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Record the legend texts of every reward curve the run draws."""
    import envkit.adapters.trl.progress as progress

    drawn: list[list[str]] = []
    real = progress.reward_curve_figure

    def figure(*args, **kwargs):
        result = real(*args, **kwargs)
        drawn.append([text.get_text() for text in result.axes[0].get_legend().get_texts()])
        return result

    monkeypatch.setattr(progress, "reward_curve_figure", figure)
    return drawn


def test_capitals_eval_tasks_seen_in_training_are_not_called_held_out(tiny_model_dir, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[dev]')")
    from capitals import CapitalsEnv

    from envkit.adapters.trl.train import EVAL_SEED_OFFSET

    env = CapitalsEnv()
    trained = {env.reset(seed=seed)[0][0]["content"] for seed in range(8)}
    seen = sum(env.reset(seed=EVAL_SEED_OFFSET + i)[0][0]["content"] in trained for i in range(5))
    assert seen > 0  # 5 countries: the eval's questions are training questions
    legends = _legend_labels(monkeypatch)
    out = tmp_path / "capitals"
    argv = ["train", "--env", CAPITALS, "--model", str(tiny_model_dir), "--output-dir", str(out), *FAST]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    label = f"eval ({seen} of 5 tasks seen in training)"
    assert f"{label} before training: mean score" in printed
    assert f"{label} after training: mean score" in printed
    assert "held-out" not in printed
    assert f"warning: {seen} of 5 eval tasks" in printed and "not held out" in printed
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["eval_tasks_seen_in_training"] == seen
    assert legends and all(text.startswith(label) for text in legends[-1][1:]), legends
    assert not any("held-out" in text for text in legends[-1])


def test_arithmetic_eval_is_held_out(tiny_model_dir, tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[dev]')")
    legends = _legend_labels(monkeypatch)
    out = tmp_path / "arithmetic"
    argv = ["train", "--env", "arithmetic", "--model", str(tiny_model_dir), "--output-dir", str(out), *FAST]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "held-out before training: mean score" in printed and "held-out after training" in printed
    assert "seen in training" not in printed and "warning" not in printed
    assert json.loads((out / "eval_summary.json").read_text())["eval_tasks_seen_in_training"] == 0
    assert [text.split(":")[0] for text in legends[-1][1:]] == ["held-out before", "held-out after"]


def test_overlap_is_counted_by_opening_content_not_by_seed():
    """The function train uses, on the training dataset it builds: CapitalsEnv's 5 questions over 32 eval seeds."""
    from capitals import CapitalsEnv

    from envkit.adapters.trl import build_dataset
    from envkit.adapters.trl.train import EVAL_SEED_OFFSET, eval_label, eval_tasks_seen_in_training

    dataset = build_dataset(CapitalsEnv, range(200))
    eval_seeds = list(range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + 32))
    assert eval_tasks_seen_in_training(dataset["prompt"], CapitalsEnv, eval_seeds) == 32
    assert eval_tasks_seen_in_training(build_dataset(CapitalsEnv, [])["prompt"], CapitalsEnv, eval_seeds) == 0
    assert eval_label(0, 32) == "held-out"
    assert eval_label(6, 32) == "eval (6 of 32 tasks seen in training)"


def test_both_training_paths_share_one_held_out_check_and_its_warning():
    """``check_heldout`` is what the sync recipe and ``--async`` both call: the count goes into the summary, the
    warning to the main process's log (and nowhere on the others), and the eval's name says it is not held out."""
    from types import SimpleNamespace

    from capitals import CapitalsEnv

    from envkit.adapters.trl import build_dataset
    from envkit.adapters.trl.heldout import check_heldout

    args = SimpleNamespace(eval_tasks=8, train_tasks=50)
    prompts = build_dataset(CapitalsEnv, range(50))["prompt"]
    summary: dict = {}
    lines: list[str] = []
    name = check_heldout(prompts, CapitalsEnv, args, summary, seed_style=False, log=lines.append)
    assert summary == {"eval_tasks_seen_in_training": 8} and name == "eval (8 of 8 tasks seen in training)"
    assert (
        len(lines) == 1 and lines[0].startswith("warning: 8 of 8 eval tasks") and "--train-tasks (now 50)" in lines[0]
    )
    assert check_heldout(prompts, CapitalsEnv, args, {}, seed_style=False, log=None) == name  # other processes
    async_run = (ROOT / "adapters" / "trl" / "async_grpo" / "run.py").read_text()
    assert "check_heldout(" in async_run and "check_heldout(" in (ROOT / "adapters" / "trl" / "train.py").read_text()
