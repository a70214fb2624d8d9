"""envkit train --resume-from-checkpoint: a run goes on from a checkpoint exactly as if never cut, through the real
TRL GRPOTrainer; the other fields transformers leaves to scripts are honoured or refused, never ignored."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest
import torch
from helpers import quick_train_flags
from safetensors.torch import load_file

from envkit.adapters.trl.resume import SCRIPT_FIELDS
from envkit.cli.app import main

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
# One torch thread, so that nothing but the checkpoint decides the weights; each test gives its --max-steps.
RUN = ["train", "--env", "guess-number", *quick_train_flags(max_steps=None, eval_tasks=0), "--torch-threads", "1"]
RUN += ["--disable-tqdm", "true"]


def _adapter(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "adapter_model.safetensors"))


def test_every_field_transformers_leaves_to_scripts_is_honoured_or_refused():
    from trl import GRPOConfig

    left_to_scripts = {
        f.name for f in dataclasses.fields(GRPOConfig) if "Not directly used by Trainer" in f.metadata.get("help", "")
    }
    # A field added upstream would otherwise be a flag envkit train parses and ignores.
    assert left_to_scripts == set(SCRIPT_FIELDS)


def test_a_resumed_run_ends_where_the_uncut_run_ends(tiny_model_dir, tmp_path, capsys):
    model = ["--model", str(tiny_model_dir), "--max-steps", "2"]
    uncut, cut = tmp_path / "uncut", tmp_path / "cut"
    assert main([*RUN, *model, "--output-dir", str(uncut), "--save-strategy", "steps", "--save-steps", "1"]) == 0
    # A run cut after step 1 is its checkpoint-1: the same run goes on from there to step 2.
    checkpoint = uncut / "checkpoint-1"
    capsys.readouterr()
    assert main([*RUN, *model, "--output-dir", str(cut), "--resume-from-checkpoint", str(checkpoint)]) == 0
    assert f"going on from {checkpoint}" in capsys.readouterr().out
    summary = json.loads((cut / "eval_summary.json").read_text())
    assert summary["resumed_from"] == str(checkpoint) and summary["train_steps"] == 2
    # The checkpoint's optimizer, scheduler, RNG and data position came back: the weights are the uncut run's.
    resumed, reference = _adapter(cut), _adapter(uncut)
    assert resumed.keys() == reference.keys()
    assert all(torch.equal(resumed[name], reference[name]) for name in reference)
    steps = [entry["step"] for entry in json.loads((cut / "log_history.json").read_text()) if "loss" in entry]
    assert steps == [1, 2]  # step 1's record comes from the checkpoint's trainer state


def test_last_is_the_newest_checkpoint_in_the_output_dir(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    model = ["--model", str(tiny_model_dir), "--output-dir", str(out), "--save-strategy", "steps", "--save-steps", "1"]
    assert main([*RUN, *model, "--max-steps", "2"]) == 0
    capsys.readouterr()
    assert main([*RUN, *model, "--max-steps", "3", "--resume-from-checkpoint", "last"]) == 0
    assert f"going on from {out / 'checkpoint-2'}" in capsys.readouterr().out
    assert json.loads((out / "eval_summary.json").read_text())["train_steps"] == 3


def test_a_run_resumed_at_its_last_step_keeps_the_checkpoints_weights(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    model = ["--model", str(tiny_model_dir), "--output-dir", str(out), "--max-steps", "1"]
    assert main([*RUN, *model, "--save-strategy", "steps", "--save-steps", "1"]) == 0
    checkpoint = out / "checkpoint-1"
    # Another --seed draws another LoRA initialisation: only the checkpoint's adapter can make the weights equal.
    assert main([*RUN, *model, "--seed", "7", "--resume-from-checkpoint", str(checkpoint)]) == 0
    saved, kept = _adapter(checkpoint), _adapter(out)
    assert all(torch.equal(saved[name], kept[name]) for name in saved)


def _checkpoint(folder: Path, *files: str) -> Path:
    folder.mkdir(parents=True)
    for name in ("trainer_state.json", *files):
        (folder / name).write_text("{}")
    return folder


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--resume-from-checkpoint", "last"], "no checkpoint-N folder in --output-dir"),
        (["--resume-from-checkpoint", "{tmp}/nowhere"], "nowhere: is not a folder; give a checkpoint-N folder"),
        (["--resume-from-checkpoint", "{tmp}"], "has no trainer_state.json"),
        (["--resume-from-checkpoint", "{full}"], "it holds full weights, from a --no-lora run; add --no-lora"),
        (["--no-lora", "--resume-from-checkpoint", "{adapter}"], "it holds a LoRA adapter, from a LoRA run; drop"),
        (
            ["--async", "--vllm-server-url", "http://127.0.0.1:9", "--resume-from-checkpoint", "{adapter}"],
            "envkit_rollout_state.json (the place of --async's rollout), so no --async run saved it: resume it "
            "without --async",
        ),
        (["--do-eval", "true"], "--do-eval is not used by envkit train: it evaluates on --eval-tasks N"),
        (["--do-predict", "true"], "--do-predict is not used by envkit train"),
        (["--do-train", "false"], "--do-train false: envkit train always trains"),
    ],
)
def test_a_checkpoint_or_script_flag_it_cannot_honour_is_one_line_and_exit_2(
    tiny_model_dir, tmp_path, flags, message, capsys
):
    full = _checkpoint(tmp_path / "full" / "checkpoint-3", "model.safetensors")
    adapter = _checkpoint(tmp_path / "lora" / "checkpoint-3", "adapter_model.safetensors")
    flags = [flag.format(tmp=tmp_path, full=full, adapter=adapter) for flag in flags]
    out = ["--output-dir", str(tmp_path / "out")]
    assert main([*RUN, "--model", str(tiny_model_dir), *out, *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_an_async_checkpoint_saved_under_other_group_numbering_is_one_line_and_exit_2(tiny_model_dir, tmp_path, capsys):
    """An ``--async`` checkpoint's rollout place names groups of its run's task order: resuming it with another
    ``--train-tasks`` or ``--seed`` would take them for other tasks, so it is refused before anything starts."""
    checkpoint = _checkpoint(tmp_path / "run" / "checkpoint-2", "adapter_model.safetensors")
    state = {"next_group": 5, "done_after": [7], "model_version": 3, "train_tasks": 64, "seed": 0}
    (checkpoint / "envkit_rollout_state.json").write_text(json.dumps({**state, "num_generations": 4}))
    flags = ["--async", "--vllm-server-url", "http://127.0.0.1:9", "--resume-from-checkpoint", str(checkpoint)]
    flags += ["--train-tasks", "32", "--seed", "7", "--num-generations", "4", "--output-dir", str(tmp_path / "out")]
    assert main([*RUN, "--model", str(tiny_model_dir), *flags]) == 2
    err = capsys.readouterr().err
    assert "was saved by a run with --train-tasks 64 (now 32), --seed 0 (now 7): its rollout's place" in err
    assert err.count("\n") == 1


def test_script_fields_the_user_did_not_set_are_not_refused(tmp_path):
    from envkit.adapters.trl.resume import check_script_fields
    from envkit.adapters.trl.train import parse

    # An eval strategy makes transformers set do_eval itself: that is not the user asking for --do-eval.
    _, config = parse(["--env", "guess-number", "--model", "m", "--eval-strategy", "steps", "--eval-steps", "5"])
    assert config.do_eval is True
    check_script_fields(config, frozenset({"eval_strategy", "eval_steps"}))
