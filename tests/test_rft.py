"""``envkit rft``: rejection-sampling fine-tuning, through the API and the command line, with a real tiny model."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import envkit
from envkit.adapters.trl.rft import (
    CHECKPOINT_FOLDER,
    ROUNDS_FILE,
    RFTConfigError,
    check_settings,
    keep,
    rejection_sampling_fine_tune,
    round_tasks,
)
from envkit.backends.oracle import OracleBackend
from envkit.cli import main
from envkit.rollout import Episode, teacher_forced_logprobs

pytest.importorskip("trl")


def arithmetic() -> envkit.Env:
    return envkit.make("arithmetic", kinds=["containers"])


def test_keep_takes_episodes_at_the_threshold_without_errors():
    """Kept: score at or above the threshold, no error, and some model tokens to learn."""
    good = Episode(task_seed=0, group_index=0, completion_ids=[1, 2], env_mask=[1, 0], score=1.0)
    low = Episode(task_seed=0, group_index=1, completion_ids=[1], env_mask=[1], score=0.4)
    failed = Episode(task_seed=1, group_index=0, completion_ids=[1], env_mask=[1], score=1.0, error="timeout")
    silent = Episode(task_seed=1, group_index=1, completion_ids=[3], env_mask=[0], score=1.0)
    assert keep([good, low, failed, silent], threshold=0.5) == [good]
    assert keep([good, low], threshold=0.4) == [good, low]


def test_rounds_take_new_task_seeds_until_the_list_runs_out():
    seeds = [10, 11, 12, 13, 14]
    assert round_tasks(seeds, 0, 2) == [10, 11]
    assert round_tasks(seeds, 1, 2) == [12, 13]
    assert round_tasks(seeds, 2, 2) == [14, 10]  # cycles


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"rounds": 0}, "rounds must be at least 1"),
        ({"episodes_per_round": 6, "samples_per_task": 4}, "must be a positive multiple of the samples per task"),
        ({"samples_per_task": 0}, "samples per task must be at least 1"),
        ({"steps_per_round": 0}, "steps per round must be at least 1"),
        ({"seeds": []}, "no task seeds"),
        ({"threshold": 1.5}, "threshold 1.5 keeps nothing: scores are in"),
        ({"threshold": float("nan")}, "threshold is NaN"),
        ({"learning_rate": -1.0}, "learning rate must be a finite number above 0"),
        ({"learning_rate": float("inf")}, "learning rate must be a finite number above 0, got inf"),  # NaN weights
        ({"seed": 2**32 - 1, "rounds": 2}, r"seed must be 0 to 4294967294 \(2 rounds train with seed \+ round\)"),
        ({"seed": -1}, "seed must be 0 to"),
        ({"batch_size": 0}, "batch size must be at least 1"),
    ],
)
def test_settings_that_cannot_run_are_refused_with_the_fix(settings, message):
    given = {"seeds": [0], "rounds": 1, "episodes_per_round": 4, "samples_per_task": 2, "steps_per_round": 1}
    with pytest.raises(RFTConfigError, match=message):
        check_settings(**{**given, **settings})


def test_rft_on_a_served_policy_learns_the_kept_episodes_token_exactly(tiny_model_dir, tmp_path):
    """Any backend samples: here the env's oracle (a scripted policy) plays every episode, all of them score 1 and
    are kept, and two rounds of the masked SFT raise the tiny model's likelihood of exactly those model tokens."""
    from envkit.models.loading import load_model, load_tokenizer

    tokenizer, model = load_tokenizer(str(tiny_model_dir)), load_model(str(tiny_model_dir))
    seeds = list(range(8))
    # The episodes the oracle plays on seeds 0-3 (round 1) are what round 1 learns; measure their likelihood first.
    from envkit.demos import oracle_episodes

    sampled = oracle_episodes(arithmetic, tokenizer, seeds[:4])

    def model_token_logprob(episodes):
        total = [lp for e in episodes for lp, m in zip(teacher_forced_logprobs(model, e), e.env_mask, strict=True) if m]
        return sum(total) / len(total)

    before = model_token_logprob(sampled)
    records = rejection_sampling_fine_tune(
        model,
        tokenizer,
        arithmetic,
        seeds=seeds,
        output_dir=str(tmp_path / "out"),
        rounds=2,
        episodes_per_round=8,
        samples_per_task=2,
        threshold=1.0,
        steps_per_round=15,
        learning_rate=3e-3,
        backend_factory=lambda _model: OracleBackend(arithmetic, tokenizer, seeds),
        log=lambda _: None,
        disable_tqdm=True,
    )
    assert [(r.round, r.episodes, r.env_episodes, r.kept, r.trained_on) for r in records] == [
        (1, 8, 8, 8, 8),
        (2, 8, 16, 8, 8),
    ]
    assert all(r.mean_score == 1.0 and r.steps == 15 and r.loss is not None for r in records)
    assert model_token_logprob(sampled) > before + 0.5  # learned: nats per model token
    saved = tmp_path / "out"
    assert (saved / "config.json").exists() and (saved / "tokenizer_config.json").exists()
    assert [r["kept"] for r in json.loads((saved / ROUNDS_FILE).read_text())] == [8, 8]


class Cut(Exception):
    """The session ending mid-run."""


def oracle_rft(model_dir, out, **given):
    """Three rounds of RFT on the oracle's episodes (every one kept, accumulated), from the model in ``model_dir``;
    the rounds' records and the model."""
    from envkit.models.loading import load_model, load_tokenizer

    tokenizer, model = load_tokenizer(str(model_dir)), load_model(str(model_dir))
    seeds = list(range(12))
    settings = {
        "seeds": seeds,
        "output_dir": str(out),
        "rounds": 3,
        "episodes_per_round": 4,
        "samples_per_task": 2,
        "steps_per_round": 3,
        "learning_rate": 3e-3,
        "accumulate": True,
        "backend_factory": lambda _model: OracleBackend(arithmetic, tokenizer, seeds),
        "log": lambda _: None,
        "disable_tqdm": True,
    }
    return rejection_sampling_fine_tune(model, tokenizer, arithmetic, **{**settings, **given}), model


def test_a_run_cut_after_a_round_goes_on_from_it_to_the_uncut_runs_weights(tiny_model_dir, tmp_path):
    import torch

    uncut, uncut_model = oracle_rft(tiny_model_dir, tmp_path / "uncut")

    def cut_after_round_2(record, _model):
        if record.round == 2:
            raise Cut

    with pytest.raises(Cut):
        oracle_rft(tiny_model_dir, tmp_path / "cut", on_round=cut_after_round_2)
    checkpoint = tmp_path / "cut" / CHECKPOINT_FOLDER
    saved = sorted(path.name for path in checkpoint.iterdir())
    assert saved == ["episodes-round-2.jsonl", "state.json", "weights-round-2.pt"]
    resumed, resumed_model = oracle_rft(tiny_model_dir, tmp_path / "cut", resume=True)

    assert resumed == uncut and [r.trained_on for r in resumed] == [4, 8, 12]  # the accumulated episodes came back
    weights = resumed_model.state_dict()
    assert all(torch.equal(tensor, weights[name]) for name, tensor in uncut_model.state_dict().items())
    assert not checkpoint.exists() and (tmp_path / "cut" / ROUNDS_FILE).exists()
    with pytest.raises(RFTConfigError, match="holds a finished run: nothing to resume"):
        oracle_rft(tiny_model_dir, tmp_path / "cut", resume=True)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="names a descriptor's file through Linux's /proc")
def test_a_checkpoints_files_reach_the_disk_before_state_json_names_them(tiny_model_dir, tmp_path, monkeypatch):
    """A machine stopped outright keeps only what was flushed: the round's weights, its episodes and the new state are
    fsynced before the state replaces the old one, and the folder (the rename) after."""
    checkpoint = tmp_path / CHECKPOINT_FOLDER
    events: list[tuple[str, str]] = []
    fsync, replace = os.fsync, os.replace

    def recorded_fsync(descriptor: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{descriptor}"))
        if checkpoint in (path, path.parent):
            events.append(("fsync", path.name))
        fsync(descriptor)

    def recorded_replace(source: str | os.PathLike, target: str | os.PathLike) -> None:
        if Path(target).parent == checkpoint:
            events.append(("replace", Path(target).name))
        replace(source, target)

    def cut(_record, _model):
        raise Cut

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "replace", recorded_replace)
    with pytest.raises(Cut):
        oracle_rft(tiny_model_dir, tmp_path, on_round=cut)
    assert events == [
        ("fsync", "weights-round-1.pt"),
        ("fsync", "episodes-round-1.jsonl"),
        ("fsync", "state.json.tmp"),
        ("replace", "state.json"),
        ("fsync", CHECKPOINT_FOLDER),
    ]


def test_a_checkpoint_saved_with_other_settings_is_refused_naming_them(tiny_model_dir, tmp_path):
    def cut(_record, _model):
        raise Cut

    with pytest.raises(Cut):
        oracle_rft(tiny_model_dir, tmp_path, on_round=cut)
    # What is compared is every argument but those that do not change what the rounds do: a parameter added to the
    # function without joining the comparison (or this list) fails here.
    import inspect

    not_compared = {"model", "env_factory", "output_dir", "backend_factory", "save", "progress", "log", "on_round"}
    not_compared.add("max_error_rate")  # it stops a run; it changes nothing a finished round did
    parameters = set(inspect.signature(rejection_sampling_fine_tune).parameters) - not_compared - {"resume"}
    saved = json.loads((tmp_path / CHECKPOINT_FOLDER / "state.json").read_text())["settings"]
    assert set(saved) == parameters
    with pytest.raises(RFTConfigError, match=r"saved with other settings \(learning_rate, threshold\)"):
        oracle_rft(tiny_model_dir, tmp_path, resume=True, learning_rate=1e-3, threshold=0.5)
    with pytest.raises(RFTConfigError, match="resume goes on from the checkpoints that save writes"):
        oracle_rft(tiny_model_dir, tmp_path, resume=True, save=False)
    with pytest.raises(RFTConfigError, match=r"max_error_rate must be between 0 and 1 \(or None: never stop\), got -1"):
        oracle_rft(tiny_model_dir, tmp_path, max_error_rate=-1)


def test_envkit_rft_end_to_end_on_policy(tiny_model_dir, tmp_path, capsys):
    """The command line: the tiny model samples its own episodes (threshold 0 keeps every finished one), fine-tunes
    on them, and saves what ``envkit sft`` saves; one line per round, then the summary."""
    out = tmp_path / "rft"
    code = main(
        [
            "rft", "guess-number", "--model", str(tiny_model_dir), "--output-dir", str(out), "--rounds", "2",
            "--episodes-per-round", "4", "--samples-per-task", "2", "--threshold", "0", "--steps-per-round", "2",
            "--max-new-tokens", "8", "--max-turns", "2",
        ]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "rft round 1/2: 4 episodes" in printed and "rft round 2/2: 4 episodes" in printed
    assert "rft on guess-number: 2 rounds, kept" in printed and str(out) in printed
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    rounds = json.loads((out / ROUNDS_FILE).read_text())
    assert [r["env_episodes"] for r in rounds] == [4, 8]


def test_envkit_rft_resume_starts_at_round_1_without_a_checkpoint_and_refuses_a_finished_run(
    tiny_model_dir, tmp_path, capsys
):
    out = tmp_path / "rft"
    argv = [
        "rft", "guess-number", "--model", str(tiny_model_dir), "--output-dir", str(out), "--rounds", "1",
        "--episodes-per-round", "2", "--samples-per-task", "2", "--threshold", "0", "--steps-per-round", "1",
        "--max-new-tokens", "4", "--max-turns", "1", "--resume",
    ]  # fmt: skip
    assert main(argv) == 0
    assert f"no checkpoint in {out / CHECKPOINT_FOLDER}: starting at round 1" in capsys.readouterr().out
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "holds a finished run: nothing to resume" in err and err.count("\n") == 1, err


def test_envkit_rft_says_so_when_nothing_reached_the_threshold(tiny_model_dir, tmp_path, capsys):
    """A random model never solves arithmetic: exit 1 and one warning line naming the fix."""
    code = main(
        [
            "rft", "arithmetic", "--env-config", '{"kinds": ["containers"]}', "--model", str(tiny_model_dir),
            "--output-dir", str(tmp_path / "rft"), "--rounds", "1", "--episodes-per-round", "2",
            "--samples-per-task", "2", "--steps-per-round", "1", "--max-new-tokens", "4", "--max-turns", "1",
        ]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 1
    assert "warning: no episode scored 1 or more" in printed and "envkit sft" in printed


def test_envkit_rft_counts_failed_episodes_and_stops_past_max_error_rate(tiny_model_dir, tmp_path, capsys):
    """A failed episode is never kept and counts 0 in the round's mean score: the round says how many failed, and
    past --max-error-rate the run stops naming the round and the first error (it used to go on silently, then advise
    a warm start)."""
    spec = "helpers:FailsOnSomeSeeds"
    argv = [
        "rft", spec, "--model", str(tiny_model_dir), "--rounds", "1", "--episodes-per-round", "4",
        "--samples-per-task", "1", "--threshold", "0", "--steps-per-round", "1", "--max-new-tokens", "4",
    ]  # fmt: skip
    assert main([*argv, "--output-dir", str(tmp_path / "all")]) == 1
    err = capsys.readouterr().err
    assert "\nerror: rft round 1: 4 of 4 episodes failed (error rate 1.00 > --max-error-rate 0.5)" in err, err
    assert "RuntimeError: tool server unreachable" in err

    half = ["--env-config", '{"every": 2}', "--output-dir", str(tmp_path / "half")]
    assert main([*argv, *half]) == 0  # seeds 0 and 2 fail: half, not more
    printed = capsys.readouterr().out
    assert "rft round 1/1: 4 episodes (2 failed, counted 0), mean score 0.500, kept 2" in printed
    assert "kept 2 of 4 episodes (score >= 0, 2 failed)" in printed
    assert json.loads((tmp_path / "half" / ROUNDS_FILE).read_text())[0]["failed"] == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-error-rate", "2"], "--max-error-rate must be between 0 and 1, got 2"),
        (["--rounds", "0"], "rounds must be at least 1"),
        (["--episodes-per-round", "5", "--samples-per-task", "2"], "positive multiple of the samples per task"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
        (["--max-turns", "0"], "--max-turns must be at least 1, got 0"),
        (["--threshold", "2"], "threshold 2 keeps nothing"),
        (["--temperature", "-1"], "--temperature must be 0 (greedy) or more, got -1"),
        (["--backend", "openai"], "--backend openai needs --base-url"),
        (["--base-url", "http://127.0.0.1:9"], "--base-url is for --backend openai"),
        (["--served-model-name", "m"], "--served-model-name is for --backend openai (the default backend samples"),
    ],
)
def test_envkit_rft_bad_input_is_one_line(tiny_model_dir, tmp_path, capsys, flags, message):
    code = main(["rft", "guess-number", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path), *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


def test_envkit_rft_missing_model_is_one_line(tmp_path, capsys):
    code = main(["rft", "guess-number", "--model", str(tmp_path / "nope"), "--output-dir", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1, err
