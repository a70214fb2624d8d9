"""envkit train --eval-strategy: TRL's own evaluation during training, on the held-out tasks of --eval-tasks, through
the same rollout as training; the best model by it; one-line refusals where there is nothing to evaluate."""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers import quick_train_flags
from safetensors.torch import load_file

from envkit.cli.app import main

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
RUN = ["train", "guess-number", *quick_train_flags(max_steps=3, eval_tasks=2), "--torch-threads", "1"]
RUN += ["--disable-tqdm", "true"]
EVERY_STEP = ["--eval-strategy", "steps", "--eval-steps", "1"]


def _training_scores(folder) -> list[float]:
    log = json.loads((folder / "log_history.json").read_text())
    return [entry["envkit/mean_score"] for entry in log if "envkit/mean_score" in entry]


def test_every_eval_steps_the_held_out_tasks_are_played_and_logged(tiny_model_dir, tmp_path, capsys):
    evaluated, plain = tmp_path / "evaluated", tmp_path / "plain"
    model = ["--model", str(tiny_model_dir)]
    assert main([*RUN, *model, "--output-dir", str(evaluated), *EVERY_STEP]) == 0
    out = capsys.readouterr().out
    assert "eval at step 1: score " in out and "eval at step 3: score " in out
    log = json.loads((evaluated / "log_history.json").read_text())
    evals = [entry for entry in log if "eval_envkit/mean_score" in entry]
    assert [entry["step"] for entry in evals] == [1, 2, 3]
    assert all({"eval_reward", "eval_envkit/mean_turns", "eval_envkit/error_rate"} <= set(entry) for entry in evals)
    assert (evaluated / "reward_curve.png").is_file()
    # The evaluations sample from a stream of their own: the training episodes are those of a run without them.
    assert main([*RUN, *model, "--output-dir", str(plain)]) == 0
    assert _training_scores(evaluated) == _training_scores(plain)


def test_load_best_model_at_end_keeps_the_checkpoint_of_the_best_evaluated_mean_score(tiny_model_dir, tmp_path):
    out = tmp_path / "best"
    best = ["--load-best-model-at-end", "true"]  # by the evaluations' mean score, not transformers' default, the loss
    saving = ["--save-strategy", "steps", "--save-steps", "1", "--learning-rate", "1e-2"]
    assert main([*RUN, "--model", str(tiny_model_dir), "--output-dir", str(out), *EVERY_STEP, *saving, *best]) == 0
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    scores = {e["step"]: e["eval_envkit/mean_score"] for e in state["log_history"] if "eval_envkit/mean_score" in e}
    chosen = max(scores, key=lambda step: (scores[step], -step))  # the first of equals, as Trainer keeps it
    assert state["best_model_checkpoint"].endswith(f"checkpoint-{chosen}") and state["best_metric"] == scores[chosen]
    kept, saved = (
        load_file(str(out / "adapter_model.safetensors")),
        load_file(str(out / f"checkpoint-{chosen}" / "adapter_model.safetensors")),
    )
    assert all(torch.equal(kept[name], saved[name]) for name in saved)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ([*EVERY_STEP, "--eval-tasks", "0"], "--eval-strategy steps evaluates on the held-out tasks of --eval-tasks N"),
        ([*EVERY_STEP, "--async"], "--eval-strategy steps is not supported with --async"),
        (
            ["--save-strategy", "best", "--metric-for-best-model", "reward"],
            "--save-strategy best needs --eval-strategy",
        ),
    ],
)
def test_periodic_eval_or_a_best_model_without_what_it_needs_is_one_line_and_exit_2(
    tiny_model_dir, tmp_path, flags, message, capsys
):
    assert main([*RUN, "--model", str(tiny_model_dir), "--output-dir", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_seed_style_class_has_no_held_out_tasks_to_evaluate_during_training(tiny_model_dir, tmp_path, capsys):
    seed_style = ["--rl-env-module", "seed_style_arithmetic", "--rl-env-class", "SeedArithmetic"]
    argv = ["train", *seed_style, "--model", str(tiny_model_dir), "--output-dir", str(tmp_path), *EVERY_STEP]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "needs held-out tasks, and a seed-style class has none" in err and err.count("\n") == 1


def test_the_seed_stream_and_the_metrics_agree_on_whether_the_trainer_is_training():
    """One answer (in_training) for the metrics' bucket, the call counter and the seed stream: step_seed used to take a
    trainer without a model as training and the rest as evaluating."""
    from types import SimpleNamespace

    from envkit.adapters.trl.metrics import in_training
    from envkit.adapters.trl.sampling import step_seed
    from envkit.backends import request_seed

    state = SimpleNamespace(global_step=3)
    for trainer, training in (
        (SimpleNamespace(state=state), True),  # a stand-in: TRL calls rollout_func while training
        (SimpleNamespace(state=state, model=SimpleNamespace(training=True)), True),
        (SimpleNamespace(state=state, model=SimpleNamespace(training=False)), False),  # inside TRL's evaluate
    ):
        assert in_training(trainer) is training
        assert step_seed(7, trainer, 2) == request_seed(7, 3, 0, 2, *(() if training else (1,)))
