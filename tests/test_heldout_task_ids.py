"""Held-out by content and by hidden state (issue 39 item 4, issue 38 class 7): an env whose question texts repeat
across seeds but whose data differs per seed (each seed its own database) names its tasks in ``info["task_id"]``,
and ``envkit train``'s held-out check compares those ids; without them it compares opening messages, as before."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sql_env import OrdersSqlEnv, UnnamedOrdersSqlEnv

from envkit.adapters.trl import build_dataset
from envkit.adapters.trl.heldout import EVAL_SEED_OFFSET, eval_overlap
from envkit.cli.app import main
from envkit.core import task_identity

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
SQL_ENV = str(Path(__file__).resolve().parent / "sql_env.py")
EVAL_SEEDS = list(range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + 5))
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
    str(len(EVAL_SEEDS)),
]


def test_every_eval_question_is_a_training_question():
    """The premise: by opening messages alone, every eval task of the SQL env is a training task."""
    env = UnnamedOrdersSqlEnv()
    trained = {env.reset(seed=seed)[0][1]["content"] for seed in range(8)}
    assert all(env.reset(seed=seed)[0][1]["content"] in trained for seed in EVAL_SEEDS)


def test_a_new_database_under_a_repeated_question_is_held_out(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "named"
    argv = ["train", "--env", f"{SQL_ENV}:OrdersSqlEnv", "--model", str(tiny_model_dir), "--output-dir", str(out)]
    assert main([*argv, *FAST]) == 0
    printed = capsys.readouterr().out
    assert "held-out before training: mean score" in printed and "held-out after training" in printed
    assert "seen in training" not in printed and "warning" not in printed
    assert json.loads((out / "eval_summary.json").read_text())["eval_tasks_seen_in_training"] == 0


def test_without_task_ids_repeated_questions_are_flagged_as_before(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "unnamed"
    env = f"{SQL_ENV}:UnnamedOrdersSqlEnv"
    assert main(["train", "--env", env, "--model", str(tiny_model_dir), "--output-dir", str(out), *FAST]) == 0
    printed = capsys.readouterr().out
    label = f"eval ({len(EVAL_SEEDS)} of {len(EVAL_SEEDS)} tasks seen in training)"
    assert f"{label} before training: mean score" in printed
    assert "held-out" not in printed
    warning = next(line for line in printed.splitlines() if line.startswith("warning:"))
    assert "open with the same messages as one of the training tasks: the eval is not held out" in warning
    assert "name each task in reset()'s info['task_id']" in warning  # the way out, named where the problem shows


def test_repeated_task_ids_are_flagged_and_the_warning_says_so():
    """Ids that repeat are training tasks whatever the openings: the SQL env over one fixed database per question."""

    class OneDatabase(OrdersSqlEnv):
        def reset(self, *, seed=None, options=None):
            opening, info = super().reset(seed=seed, options=options)
            info["task_id"] = self.question
            return opening, info

    dataset = build_dataset(OneDatabase, range(8))
    overlap = eval_overlap(dataset["prompt"], OneDatabase, EVAL_SEEDS)
    assert (overlap.seen, overlap.total, overlap.by_task_id) == (5, 5, True)
    assert overlap.label == "eval (5 of 5 tasks seen in training)"
    assert "have the task id (info['task_id']) of one of the training tasks" in overlap.warning(8)
    assert eval_overlap(dataset["prompt"], OrdersSqlEnv, EVAL_SEEDS).seen == 0


def test_task_identity_is_the_id_when_named_else_the_opening():
    opening = [{"role": "user", "content": "How many orders are there?"}]
    assert task_identity(opening, {"task_id": "a1"}) == "task_id:a1"
    assert task_identity(opening, {"task_id": 7}) == "task_id:7"
    assert task_identity(opening, {}) == task_identity(list(opening), {"other": 1})
    assert task_identity(opening, {}).startswith("opening:")
    assert task_identity(opening, {}) != task_identity([{"role": "user", "content": "Another?"}], {})
    with pytest.raises(ValueError, match=r"info\['task_id'\]=\['a'\]: a task id is a non-empty str"):
        task_identity(opening, {"task_id": ["a"]})


def test_a_bad_task_id_stops_train_with_one_line(tiny_model_dir, tmp_path, capsys):
    bad = tmp_path / "bad_env.py"
    bad.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(Path(SQL_ENV).parent)!r})\n"
        "from sql_env import OrdersSqlEnv\n\n\n"
        "class ListId(OrdersSqlEnv):\n"
        "    def reset(self, *, seed=None, options=None):\n"
        "        opening, info = super().reset(seed=seed, options=options)\n"
        "        return opening, {'task_id': [seed]}\n"
    )
    argv = ["train", "--env", f"{bad}:ListId", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path / "o")]
    assert main([*argv, *FAST]) == 2
    err = capsys.readouterr().err
    assert "info['task_id']=[1000000]: a task id is a non-empty str" in err and "Traceback" not in err


def test_training_tasks_are_not_reset_again():
    """build_dataset reads each training task's id when it resets the seed: the held-out check resets only the eval
    tasks (a τ² env with an LLM customer calls its model in every reset)."""

    class Counted(OrdersSqlEnv):
        resets = 0

        def reset(self, *, seed=None, options=None):
            type(self).resets += 1
            return super().reset(seed=seed, options=options)

    dataset = build_dataset(Counted, range(8))
    Counted.resets = 0
    assert eval_overlap(dataset["prompt"], Counted, EVAL_SEEDS).seen == 0
    assert Counted.resets == len(EVAL_SEEDS)
    stripped = [[{k: v for k, v in m.items() if k != "envkit_task"} for m in prompt] for prompt in dataset["prompt"]]
    assert eval_overlap(stripped, Counted, list(range(3))).seen == 3  # without it, the seed each prompt carries
