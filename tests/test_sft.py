"""envkit sft: supervised warm start on oracle demonstrations through TRL's SFTTrainer, and saving it safely."""

from __future__ import annotations

import os

import pytest
from helpers import CounterEnv
from tokenizers import normalizers
from transformers import AutoModelForCausalLM, AutoTokenizer

import envkit
from envkit.adapters.trl.sft import demonstrations_dataset, sft_on_oracle
from envkit.cli.app import main
from envkit.demos import oracle_episodes
from envkit.models.loading import ModelLoadError, check_saved_tokenizer
from envkit.rollout import teacher_forced_logprobs
from envkit.testing import build_tiny_model, build_tokenizer

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
CONFIG = {"low": 1, "high": 32}


def guess_number() -> envkit.Env:
    return envkit.make("guess-number", **CONFIG)


def model_token_nll(model, episodes) -> float:
    """Mean negative log-likelihood of the model tokens (env tokens excluded), teacher-forced."""
    picked = [
        logprob
        for episode in episodes
        for logprob, mask in zip(teacher_forced_logprobs(model, episode), episode.env_mask, strict=True)
        if mask
    ]
    return -sum(picked) / len(picked)


def test_demonstrations_mask_exactly_the_model_tokens(local_tokenizer):
    episodes = oracle_episodes(guess_number, local_tokenizer, [0, 1])
    rows = demonstrations_dataset(episodes)
    for row, episode in zip(rows, episodes, strict=True):
        assert row["input_ids"] == episode.prompt_ids + episode.completion_ids
        assert row["assistant_masks"] == [0] * len(episode.prompt_ids) + episode.env_mask
        model_text = local_tokenizer.decode(
            [t for t, m in zip(row["input_ids"], row["assistant_masks"], strict=True) if m]
        )
        guesses = [m["content"] for m in episode.messages if m["role"] == "assistant"]
        assert model_text == "".join(f"{guess}<|im_end|>" for guess in guesses)


def test_sft_on_oracle_learns_the_demonstrations_and_saves_a_reloadable_model(local_tokenizer, tmp_path):
    model = build_tiny_model(local_tokenizer, seed=1)
    held_out = oracle_episodes(guess_number, local_tokenizer, list(range(500, 516)))
    before = model_token_nll(model, held_out)
    metrics = sft_on_oracle(
        model,
        local_tokenizer,
        guess_number,
        seeds=list(range(64)),
        output_dir=str(tmp_path / "sft"),
        max_steps=60,
        log=lambda _: None,
        disable_tqdm=True,
    )
    after = model_token_nll(model, held_out)
    assert metrics["train_loss"] > 0 and after < before / 3, (before, after)
    reloaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "sft")).eval()
    assert model_token_nll(reloaded, held_out) == pytest.approx(after, rel=1e-5)


def test_local_tokenizer_keeps_its_ids_when_saved_beside_a_qwen2_model(tmp_path):
    tokenizer = build_tokenizer()
    build_tiny_model(tokenizer, tmp_path)
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(reloaded).__name__ == "Qwen2Tokenizer"  # what AutoTokenizer picks next to a Qwen2 config
    text = "I am thinking of a whole number between 1 and 32. Guess it!<|im_end|> 16 Higher. naïve"
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    check_saved_tokenizer(tokenizer, str(tmp_path), text)


def test_a_tokenizer_that_would_change_its_ids_on_reload_is_refused(local_tokenizer, tmp_path):
    tokenizer = build_tokenizer()
    tokenizer.backend_tokenizer.normalizer = normalizers.Lowercase()  # a Qwen2Tokenizer rebuilds its own (NFC)
    model = build_tiny_model(tokenizer)
    with pytest.raises(ModelLoadError, match="reloads as Qwen2Tokenizer and encodes text differently"):
        sft_on_oracle(
            model,
            tokenizer,
            guess_number,
            seeds=[0, 1],
            output_dir=str(tmp_path / "sft"),
            max_steps=1,
            log=lambda _: None,
            disable_tqdm=True,
        )


def test_sft_command(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "warm"
    argv = ["sft", "guess-number", "--env-config", '{"low": 1, "high": 32}', "--model", str(tiny_model_dir)]
    assert main([*argv, "--output-dir", str(out), "--episodes", "8", "--steps", "4"]) == 0
    printed = capsys.readouterr().out
    assert "8 oracle episodes" in printed and f"saved to {out}" in printed
    assert (out / "model.safetensors").is_file() and (out / "tokenizer_config.json").is_file()


def test_sft_command_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["sft", "guess-number", "--model", str(tmp_path / "missing"), "--output-dir", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error:") and "missing" in error and "Traceback" not in error and "\n" not in error


class OracleStepRaises(CounterEnv):
    """An env whose step fails on the oracle's first action: sft must say so in one line, not a traceback."""

    def step(self, action):
        raise ValueError("inventory table missing")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--episodes", "0"], "--episodes must be at least 1, got 0"),
        (["--steps", "-3"], "--steps must be at least 1, got -3"),
        (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["--learning-rate", "-1"], "--learning-rate must be a finite number above 0, got -1"),
        (["--learning-rate", "inf"], "--learning-rate must be a finite number above 0, got inf"),  # saved NaN weights
    ],
)
def test_sft_flags_out_of_range_are_one_line_before_anything_loads(tmp_path, flags, message, capsys):
    missing = str(tmp_path / "no-model")  # never read: the flags are checked first
    assert main(["sft", "guess-number", "--model", missing, "--output-dir", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_sft_on_an_env_whose_step_raises_is_one_line_and_exit_2(tiny_model_dir, tmp_path, capsys):
    argv = ["sft", "test_sft:OracleStepRaises", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path)]
    assert main([*argv, "--episodes", "2", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    error = err.strip().splitlines()[-1]  # above it: the model-loading progress bar
    assert error.startswith("error: the oracle episode of OracleStepRaises on seed 0 failed: ValueError: inventory")
    assert "Traceback" not in err


@pytest.mark.parametrize("cuda", [True, False])
def test_sft_and_rft_train_on_the_gpu_when_cuda_is_available(monkeypatch, local_tokenizer, tmp_path, cuda):
    """Without a ``use_cpu`` of the caller's, SFT (``envkit sft``, and each ``envkit rft`` round) goes where ``envkit
    train`` goes: the GPU when CUDA is available. It used to stay on the CPU even then."""
    import torch
    import trl

    from envkit.adapters.trl import rft

    chosen = []

    def config(**kwargs):
        chosen.append(kwargs["use_cpu"])
        raise InterruptedError  # the device is all this test needs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(trl, "SFTConfig", config)
    model = build_tiny_model(local_tokenizer, seed=1)
    with pytest.raises(InterruptedError):
        sft_on_oracle(model, local_tokenizer, guess_number, seeds=[0], output_dir=str(tmp_path), log=lambda _: None)
    episodes = oracle_episodes(guess_number, local_tokenizer, [0])
    with pytest.raises(InterruptedError):
        rft._fine_tune(
            model, local_tokenizer, episodes, str(tmp_path), steps=1, learning_rate=1e-4, batch_size=1, seed=0
        )
    assert chosen == [not cuda, not cuda]
