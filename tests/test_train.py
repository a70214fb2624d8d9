"""envkit train: short GRPO runs through the real TRL GRPOTrainer, the loss mask, and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import CounterEnv

from envkit.cli import main

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[1]
FAST = [
    "--max-steps",
    "2",
    "--rl-max-new-tokens",
    "8",
    "--max-turns",
    "2",
    "--per-device-train-batch-size",
    "4",
    "--rl-num-generations",
    "2",
    "--train-tasks",
    "8",
    "--eval-tasks",
    "2",
]


def test_two_steps_lora_on_a_builtin_env(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(["train", "--env", "guess-number", "--model", str(tiny_model_dir), "--output-dir", str(out), *FAST]) == 0
    )
    assert (out / "adapter_config.json").is_file() and (out / "tokenizer_config.json").is_file()
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["train_steps"] == 2 and summary["lora"] is True
    assert {"mean_score", "pass@1"} <= set(summary["before"]) and {"mean_score"} <= set(summary["after"])
    log = json.loads((out / "log_history.json").read_text())
    assert any("envkit/mean_score" in entry for entry in log) and any("loss" in entry for entry in log)
    assert "held-out after training" in capsys.readouterr().out


def test_two_steps_full_fine_tuning_changes_the_weights(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "full"
    code = main(
        [
            "train",
            "--env",
            "helpers:VerbosityEnv",
            "--model",
            str(tiny_model_dir),
            "--output-dir",
            str(out),
            "--no-lora",
            "--learning-rate",
            "1e-2",
            *FAST,
        ]
    )
    assert code == 0
    before = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).state_dict()
    after = AutoModelForCausalLM.from_pretrained(str(out)).state_dict()
    assert not (out / "adapter_config.json").exists()
    log = json.loads((out / "log_history.json").read_text())
    assert any(entry.get("reward_std", 0) > 0 for entry in log)  # varied rewards: a real gradient
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_lora_merge_saves_a_merged_model(tiny_model_dir, tmp_path):
    out = tmp_path / "merge"
    assert (
        main(
            [
                "train",
                "--env",
                "guess-number",
                "--model",
                str(tiny_model_dir),
                "--output-dir",
                str(out),
                "--merge",
                *FAST,
            ]
        )
        == 0
    )
    assert (out / "merged" / "config.json").is_file()


def test_seed_style_class_trains_unchanged(tiny_model_dir, tmp_path):
    out = tmp_path / "seed"
    code = main(
        [
            "train",
            "--rl-env-module",
            "seed_style_arithmetic",
            "--rl-env-class",
            "SeedArithmetic",
            "--rl-env-config",
            '{"cases": 8, "use_tools": false}',
            "--model",
            str(tiny_model_dir),
            "--output-dir",
            str(out),
            *FAST,
        ]
    )
    assert code == 0
    log = json.loads((out / "log_history.json").read_text())
    assert any("rewards/score_episode_reward/mean" in entry for entry in log)


def test_seed_style_class_with_tools_uses_trls_tool_loop(qwen25_tokenizer, tmp_path):
    from envkit.testing import build_tiny_model

    model_dir = tmp_path / "qwen-tiny"
    build_tiny_model(qwen25_tokenizer, model_dir, hidden_size=32)
    out = tmp_path / "seed-tools"
    code = main(
        [
            "train",
            "--rl-env-module",
            "seed_style_arithmetic",
            "--rl-env-class",
            "SeedArithmetic",
            "--rl-env-config",
            '{"cases": 4}',
            "--model",
            str(model_dir),
            "--output-dir",
            str(out),
            *FAST,
        ]
    )
    assert code == 0


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--env", "no-such-env"], "unknown env 'no-such-env'"),
        (["--rl-env-module", "no_such_module", "--rl-env-class", "X"], "cannot import module 'no_such_module'"),
        (["--rl-env-module", "seed_style_arithmetic", "--rl-env-class", "Nope"], "has no class 'Nope'"),
        (["--env", "guess-number", "--rl-env-config", "{oops"], "--rl-env-config is not valid JSON"),
        (
            ["--env", "guess-number", "--per-device-train-batch-size", "3", "--rl-num-generations", "2"],
            "batch size not compatible with the number of generations",
        ),
        (["--env", "guess-number", "--use-vllm"], "vLLM is not installed"),
        (["--env", "guess-number"], "--model PATH is required"),
        (
            ["--env", "guess-number", "--use-vllm", "--vllm-enable-sleep-mode", "true"],
            "vllm_enable_sleep_mode is not supported by envkit's rollouts",
        ),
        (
            ["--env", "guess-number", "--use-vllm", "--vllm-tensor-parallel-size", "2"],
            "vllm_tensor_parallel_size=2 is not supported by envkit's rollouts",
        ),
        (
            ["--env", "guess-number", "--generation-kwargs", '{"frequency_penalty": 0.5}'],
            "generation_kwargs key 'frequency_penalty' is not supported by envkit's rollouts",
        ),
        (["--env", "guess-number", "--max-completion-tokens", "0"], "--max-completion-tokens must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_model_dir, extra, message, capsys):
    model = [] if message.startswith("--model") else ["--model", str(tiny_model_dir)]
    if "vLLM is not installed" in message:
        pytest.importorskip  # noqa: B018 (vllm is not installed in the default suite's environment)
        try:
            import vllm  # noqa: F401

            pytest.skip("vllm is installed here")
        except ImportError:
            pass
    assert main(["train", *model, *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_top_k_is_off_and_each_episode_has_a_completion_budget_by_default():
    from envkit.train import parse

    args, config = parse(["--env", "guess-number", "--model", "m"])
    assert config.top_k == 0  # TRL's default: top-k would skew vLLM's logprobs from the trainer's (IS masking)
    assert config.max_completion_length == 128 and args.max_completion_tokens == 4 * 128
    args, config = parse(["--env", "guess-number", "--model", "m", "--rl-max-new-tokens", "32"])
    assert config.max_completion_length == 32 and args.max_completion_tokens == 128
    args, _ = parse(["--env", "guess-number", "--model", "m", "--max-completion-tokens", "300"])
    assert args.max_completion_tokens == 300


def test_missing_model_folder(tmp_path, capsys):
    assert main(["train", "--env", "guess-number", "--model", str(tmp_path / "nothing")]) == 2
    assert "model folder not found" in capsys.readouterr().err


def test_what_reaches_the_loss_mask_is_exactly_the_model_tokens(local_tokenizer, tiny_model_dir, tmp_path):
    """A multi-turn episode through GRPOTrainer: completion_mask * tool_mask == envkit's env_mask."""
    from test_rollout import ScriptedBackend
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from envkit.adapters.trl import build_dataset, env_score_reward, make_rollout_func

    seeds = [0, 1]
    backend = ScriptedBackend(CounterEnv, local_tokenizer, seeds)
    captured = []
    rollout = make_rollout_func(CounterEnv, tokenizer=local_tokenizer, backend=backend, on_episodes=captured.extend)
    config = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=1,
        bf16=False,
        use_cpu=True,
        report_to="none",
        beta=0.0,
    )
    local_tokenizer.padding_side = "left"
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
        args=config,
        reward_funcs=env_score_reward,
        train_dataset=build_dataset(CounterEnv, seeds),
        processing_class=local_tokenizer,
        rollout_func=rollout,
    )
    inputs = [trainer.train_dataset[i] for i in (0, 0, 1, 1)]
    output = trainer._generate_and_score_completions(inputs)
    loss_mask = (output["completion_mask"] * output["tool_mask"]).tolist()
    assert len(captured) == 4 and all(e.turns >= 3 for e in captured)  # multi-turn, with tool and user messages
    for episode, row, ids in zip(captured, loss_mask, output["completion_ids"].tolist(), strict=True):
        last_model_token = max(i for i, m in enumerate(episode.env_mask) if m)
        expected = episode.env_mask[: last_model_token + 1]
        assert row[: len(expected)] == expected and not any(row[len(expected) :])
        assert ids[: len(expected)] == episode.completion_ids[: len(expected)]
        assert sum(expected) == sum(len(span) for span in backend.spans[episode.task_seed])
    assert output["advantages"].shape[0] == 4


def test_two_processes_on_cpu_with_accelerate(tiny_model_dir, tmp_path):
    out = tmp_path / "ddp"
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--cpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "-m",
        "envkit.cli",
        "train",
        "--env",
        "guess-number",
        "--model",
        str(tiny_model_dir),
        "--output-dir",
        str(out),
        *FAST,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=str(ROOT / "tests"))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["train_steps"] == 2
