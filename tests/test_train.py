"""envkit train: short GRPO runs through the real TRL GRPOTrainer, the loss mask, and one-line errors."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import CounterEnv, accelerate_launch, hung_step_env_file, quick_train_flags

from envkit.adapters.trl.config import ASYNC_ONLY_FLAGS
from envkit.adapters.trl.seed_style import ENVKIT_ENV_ONLY, SEED_STYLE_IN_FORCE
from envkit.cli.app import main

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[1]
FAST = quick_train_flags()


def _without(argv: list[str], *flags: str) -> list[str]:
    """argv less each of ``flags`` and its value."""
    out = list(argv)
    for flag in flags:
        index = out.index(flag)
        del out[index : index + 2]
    return out


SEED_FAST = _without(FAST, "--max-turns", "--eval-tasks", "--train-tasks")  # seed-style: no envkit-env-only flags


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
    assert any("envkit/cut_turn_rate" in entry for entry in log)  # turns cut at --rl-max-new-tokens
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


def test_the_saved_adapter_names_its_base_model_by_an_absolute_path(tiny_model_dir, tmp_path, monkeypatch):
    """``--model`` given relative to the working folder: the adapter recorded it as given, so loading the trained
    model from any other folder looked for a model of that name elsewhere (and then on the hub)."""
    monkeypatch.chdir(tmp_path)
    relative = os.path.relpath(tiny_model_dir, tmp_path)
    assert main(["train", "guess-number", "--model", relative, "--output-dir", "run", *FAST]) == 0
    recorded = json.loads((tmp_path / "run" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == str(Path(tiny_model_dir).resolve())


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
            *SEED_FAST,
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
            *SEED_FAST,
        ]
    )
    assert code == 0


def test_every_lora_setting_is_refused_with_no_lora():
    """LORA_FLAGS is the list --no-lora refuses: a LoRA field added to TrainArguments fails here until it is in it."""
    from envkit.adapters.trl.config import LORA_FLAGS, TrainArguments

    lora_fields = {f.name for f in dataclasses.fields(TrainArguments) if f.name.startswith("lora_")}
    assert lora_fields <= set(LORA_FLAGS) and "merge" in LORA_FLAGS


def test_lora_target_modules_are_matched_by_peft_before_the_model_loads(tiny_model_dir):
    """Each name goes through peft's own matching against the model's modules (built on the meta device): a layer's
    short name and its full path pass, and peft builds its adapter on them; a name of no module is one line."""
    from peft import get_peft_model

    from envkit.adapters.trl.config import TrainArguments, TrainUsageError
    from envkit.adapters.trl.lora import check_lora_targets, lora_config
    from envkit.models.loading import load_model

    targets = ["v_proj", "model.layers.0.self_attn.q_proj"]
    args = TrainArguments(model=str(tiny_model_dir), lora_target_modules=targets)
    check_lora_targets(args)
    adapted = get_peft_model(load_model(str(tiny_model_dir)), lora_config(args))
    wrapped = {name for name, module in adapted.named_modules() if hasattr(module, "lora_A")}
    assert any(name.endswith("layers.0.self_attn.q_proj") for name in wrapped) and len(wrapped) > 1
    with pytest.raises(TrainUsageError, match=r"^--lora-target-modules q: no such module in .*\bq_proj\b"):
        check_lora_targets(TrainArguments(model=str(tiny_model_dir), lora_target_modules=["q", "v_proj"]))


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
        # Each of these trained on nothing, raised deep inside, or trained as something else.
        (["--env", "guess-number", "--train-tasks", "0"], "--train-tasks must be at least 1, got 0"),
        (["--env", "guess-number", "--concurrency", "0"], "--concurrency must be at least 1, got 0"),
        (["--env", "guess-number", "--max-turns", "0"], "--max-turns must be at least 1, got 0"),
        (["--env", "guess-number", "--max-episode-tokens", "0"], "--max-episode-tokens must be at least 1"),
        (["--env", "guess-number", "--lora-r", "0"], "--lora-r must be at least 1, got 0"),
        (["--env", "guess-number", "--rl-num-generations", "0"], "--rl-num-generations (--num-generations) must be at"),
        (["--env", "guess-number", "--per-device-train-batch-size", "0"], "--per-device-train-batch-size must be at"),
        (["--env", "guess-number", "--gradient-accumulation-steps", "0"], "--gradient-accumulation-steps must be at"),
        (["--env", "guess-number", "--rl-max-new-tokens", "0"], "--rl-max-new-tokens (--max-completion-length) must"),
        (["--env", "guess-number", "--lora-dropout", "2"], "--lora-dropout must be at least 0 and below 1, got 2"),
        (["--env", "guess-number", "--learning-rate", "-1"], "--learning-rate must be a finite number above 0, got -1"),
        # Each of these trained and exited 0: inf to NaN weights, the rest out of PPO's or LoRA's range.
        (["--env", "guess-number", "--learning-rate", "inf"], "--learning-rate must be a finite number above 0, got"),
        (["--env", "guess-number", "--rl-clip-range", "nan"], "--rl-clip-range (--epsilon) must be a finite number"),
        (["--env", "guess-number", "--rl-clip-range", "-1"], "--rl-clip-range (--epsilon) must be a finite number"),
        (["--env", "guess-number", "--rl-kl-coef", "-1"], "--rl-kl-coef (--beta) must be a finite number 0 (no KL"),
        (["--env", "guess-number", "--max-grad-norm", "nan"], "--max-grad-norm must be a finite number 0 (no clip"),
        (["--env", "guess-number", "--weight-decay", "nan"], "--weight-decay must be a finite number 0 or more, got"),
        (["--env", "guess-number", "--lora-alpha", "-5"], "--lora-alpha must be above 0, got -5"),
        # Raised after the model loaded: a KeyError (no held-out episodes), numpy's and accelerate's seed range.
        (["--env", "guess-number", "--eval-samples", "0"], "--eval-samples must be at least 1, got 0"),
        (["--env", "guess-number", "--seed", "-1"], "--seed must be 0 to 4294967295, got -1"),
        # Ignored before: LoRA settings with --no-lora, --eval-samples with no held-out eval, model_init_kwargs.
        (["--env", "guess-number", "--no-lora", "--lora-r", "8", "--merge"], "--lora-r, --merge: LoRA settings, and"),
        (["--env", "guess-number", "--eval-tasks", "0", "--eval-samples", "3"], "--eval-samples applies to the held"),
        (
            ["--env", "guess-number", "--model-init-kwargs", '{"dtype": "bfloat16"}'],
            "--model-init-kwargs is not read without --async",
        ),
        # peft's NoMatchingPeftModuleError, a traceback once the model had loaded (with --async, after the servers).
        (
            ["--env", "guess-number", "--lora-target-modules", "q_proj", "qkv"],
            "--lora-target-modules qkv: no such module in ",
        ),
        # transformers trains a max_steps of 0 (or -5) for num_train_epochs instead.
        (["--env", "guess-number", "--max-steps", "0"], "--max-steps must be at least 1 (or -1: train for --num-tra"),
        (["--env", "guess-number", "--max-steps", "-5"], "--max-steps must be at least 1 (or -1: train for --num-tra"),
        (["--env", "guess-number", "--rl-temperature", "-1"], "--temperature (--rl-temperature) must be above 0"),
        (["--env", "guess-number", "--rl-top-p", "2"], "--top-p (--rl-top-p) must be above 0 and at most 1"),
        (["--env", "guess-number", "--rl-top-k", "-3"], "--top-k (--rl-top-k) must be 0 (off) or more, got -3"),
        # Checked where SamplingParams checks every sampler (before, min-p 2 and penalty 0 raised mid-rollout).
        (["--env", "guess-number", "--min-p", "2"], "--min-p must be between 0 (off) and 1, got 2"),
        (["--env", "guess-number", "--repetition-penalty", "0"], "--repetition-penalty must be above 0 (1 = off)"),
        # The same ranges for generation_kwargs' overrides (a traceback, or for top_k -3 top-k off, before).
        (
            ["--env", "guess-number", "--generation-kwargs", '{"top_p": 5}'],
            "generation_kwargs['top_p'] must be above 0 and at most 1 (1 = off), got 5",
        ),
        (
            ["--env", "guess-number", "--generation-kwargs", '{"top_k": -3}'],
            "generation_kwargs['top_k'] must be 0 (off) or more, got -3",
        ),
        (
            ["--env", "guess-number", "--generation-kwargs", '{"min_p": "high"}'],
            "generation_kwargs['min_p'] must be a number, got 'high'",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tiny_model_dir, extra, message, capsys):
    model = [] if message.startswith("--model PATH") else ["--model", str(tiny_model_dir)]
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
    from envkit.adapters.trl.train import parse

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
    from test_rollout import CheckedOracleBackend
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    from envkit.adapters.trl import build_dataset, env_score_reward, make_rollout_func

    seeds = [0, 1]
    backend = CheckedOracleBackend(CounterEnv, local_tokenizer, seeds)
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


def test_callbacks_given_to_run_are_called_by_the_trainer(tiny_model_dir, tmp_path):
    """``run(argv, callbacks=[...])``: TrainerCallbacks of one's own, called by TRL's trainer with its own (here, one
    that timestamps every step and one that keeps a file of its own in each checkpoint)."""
    from transformers import TrainerCallback

    from envkit.adapters.trl.train import run

    class StepTimes(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[int] = []

        def on_step_end(self, args, state, control, **kwargs) -> None:
            self.steps.append(state.global_step)

    class Stamp(TrainerCallback):
        def on_save(self, args, state, control, **kwargs) -> None:
            (Path(args.output_dir) / f"checkpoint-{state.global_step}" / "stamp.txt").write_text("mine")

    times = StepTimes()
    out = tmp_path / "out"
    argv = ["--env", "guess-number", "--model", str(tiny_model_dir), "--output-dir", str(out), *FAST]
    run([*argv, "--save-strategy", "steps", "--save-steps", "1"], log=lambda _: None, callbacks=[times, Stamp()])
    assert times.steps == [1, 2]
    assert (out / "checkpoint-2" / "stamp.txt").read_text() == "mine"


def test_two_processes_on_cpu_with_accelerate(tiny_model_dir, tmp_path):
    """Two processes, DDP over gloo (``--multi_gpu`` with GRPOConfig's ``use_cpu``; accelerate's ``--cpu`` would
    start one process): training and the held-out eval before, during (``--eval-strategy``) and after, sharded across
    both, finish, and both processes exit (freeing the DDP model when the run returned could deadlock with gloo's
    threads: envkit.util.process_exit.keep_until_exit)."""
    out = tmp_path / "ddp"
    train = ["--env", "guess-number", "--model", str(tiny_model_dir), "--output-dir", str(out), *FAST]
    train += ["--eval-strategy", "steps", "--eval-steps", "1"]
    command = accelerate_launch("ddp_train_script.py", str(tmp_path), *train)  # envkit train, as python -m envkit.cli
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=str(ROOT / "tests"))
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):  # the DDP model outlives the run, on every process
        assert json.loads((tmp_path / f"kept-rank{rank}.json").read_text()) == ["DistributedDataParallel"]
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["train_steps"] == 2
    assert summary["before"]["episodes"] == summary["after"]["episodes"] == 2  # --eval-tasks 2, over both processes
    log = json.loads((out / "log_history.json").read_text())
    assert "rewards/env_score_reward/mean" in log[0]
    assert [entry["step"] for entry in log if "eval_envkit/mean_score" in entry] == [1, 2]


# ---- progress, reward curve, --report-to ----------------------------------------------------------------------------
QUICK = [*FAST[: FAST.index("--eval-tasks")], "--eval-tasks", "0"]


def test_progress_bar_by_default_and_the_reward_curve(tiny_model_dir, tmp_path, capsys, monkeypatch):
    import envkit.adapters.trl.progress as progress

    curves = []
    real = progress.write_reward_curve
    monkeypatch.setattr(progress, "write_reward_curve", lambda *a, **k: curves.append(k) or real(*a, **k))
    out = tmp_path / "bar"
    assert (
        main(["train", "--env", "guess-number", "--model", str(tiny_model_dir), "--output-dir", str(out), *FAST]) == 0
    )
    captured = capsys.readouterr()
    frames = captured.err.replace("\r", "\n").splitlines()
    last = [frame for frame in frames if frame.startswith("train 2/2 |")][-1]
    for shown in ("score ", "turns ", "tool errors ", "ETA "):
        assert shown in last, last
    assert "{'loss'" not in captured.out + captured.err  # no raw dicts
    png = out / "reward_curve.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"reward curve: {png}" in captured.out
    summary = json.loads((out / "eval_summary.json").read_text())
    assert curves[0]["before"] == summary["before"]["mean_score"]  # held-out before/after as markers
    assert curves[0]["after"] == summary["after"]["mean_score"]


class FlatScore(CounterEnv):
    """Every episode scores 0.5: no group ever has a spread, so GRPO has nothing to learn from."""

    def score(self) -> float:
        return 0.5


def test_training_that_cannot_learn_says_so_in_one_line_above_the_bar(tiny_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    argv = ["train", "--env", f"{__name__}:FlatScore", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path)]
    assert main([*argv, *_without(QUICK, "--max-steps"), "--max-steps", "3"]) == 0
    captured = capsys.readouterr()
    said = [line for line in captured.out.splitlines() if "training cannot learn" in line]
    assert len(said) == 1 and said[0].startswith("training cannot learn: at each of the last 3 rollouts (up to step 2)")
    assert "(this one: 0.5)" in said[0] and "Fix: " in said[0]
    history = json.loads((tmp_path / "log_history.json").read_text())
    assert [e["envkit/zero_variance_groups"] for e in history if "loss" in e] == [1.0, 1.0, 1.0]


def test_disable_tqdm_prints_one_plain_line_per_log_and_no_matplotlib_is_one_line(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.ticker"):
        monkeypatch.setitem(sys.modules, name, None)  # a user install without matplotlib
    out = tmp_path / "plain"
    argv = ["train", "--env", "guess-number", "--model", str(tiny_model_dir), "--output-dir", str(out), *QUICK]
    assert main([*argv, "--disable-tqdm", "true"]) == 0
    captured = capsys.readouterr()
    lines = [line for line in captured.out.splitlines() if line.startswith("step ")]
    assert [line.split(" · ")[0] for line in lines] == ["step 1/2", "step 2/2"]
    assert all("score " in line and "turns " in line and "tool errors " in line and "ETA " in line for line in lines)
    assert "train 1/2 |" not in captured.err and "{'loss'" not in captured.out + captured.err
    skipped = [line for line in captured.out.splitlines() if "reward_curve.png" in line]
    assert skipped == ["reward_curve.png not written: matplotlib is not installed (pip install matplotlib)"]
    assert not (out / "reward_curve.png").exists() and (out / "eval_summary.json").is_file()


def test_reward_curve_plots_the_training_scores_and_the_held_out_markers(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install -e '.[dev]')")
    from envkit.adapters.trl.progress import reward_curve_figure, write_reward_curve

    history = [
        {"step": 1, "envkit/mean_score": 0.25, "reward": 0.25},
        {"step": 2, "envkit/mean_score": 0.5, "reward": 0.5},
        {"step": 2, "train_runtime": 3.0},
    ]
    axis = reward_curve_figure(history, before=0.1, after=0.6).axes[0]
    (line,) = axis.get_lines()
    assert list(line.get_xdata()) == [1, 2] and list(line.get_ydata()) == [0.25, 0.5]
    markers = [tuple(c.get_offsets()[0]) for c in axis.collections]
    assert markers == [(0.0, 0.1), (2.0, 0.6)]
    messages = []
    assert write_reward_curve(history, tmp_path, log=messages.append) == tmp_path / "reward_curve.png"
    assert write_reward_curve([], tmp_path / "none", log=messages.append) is None
    assert messages == ["reward_curve.png not written: no mean score was logged"]


def test_report_to_reaches_trls_config(monkeypatch):
    import envkit.adapters.trl.config as train_config
    from envkit.adapters.trl.train import parse

    _, config = parse(["--env", "guess-number", "--model", "m"])
    assert config.report_to == []
    monkeypatch.setattr(train_config, "check_report_to", lambda report_to: None)  # installed or not
    _, config = parse(["--env", "guess-number", "--model", "m", "--report-to", "tensorboard"])
    assert config.report_to == ["tensorboard"]


def test_report_to_tensorboard_writes_event_files(tiny_model_dir, tmp_path, capsys):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        assert (
            main(["train", "--env", "guess-number", "--model", str(tiny_model_dir), "--report-to", "tensorboard"]) == 2
        )
        err = capsys.readouterr().err
        assert "--report-to tensorboard: tensorboard is not installed" in err and err.count("\n") == 1
        pytest.skip("tensorboard is not installed (pip install tensorboard): checked the one-line error instead")
    out = tmp_path / "tb"
    argv = ["train", "--env", "guess-number", "--model", str(tiny_model_dir), "--output-dir", str(out), *QUICK]
    assert main([*argv, "--report-to", "tensorboard"]) == 0
    events = list(out.glob("runs/*/events.out.tfevents.*"))
    assert events and any(b"envkit/mean_score" in event.read_bytes() for event in events)


# ---- --config through TRL's TrlParser, --env-config ----------------------------------------------------------------
def test_config_yaml_goes_through_trls_parser_and_the_command_line_wins(tmp_path, monkeypatch):
    import trl

    from envkit.adapters.trl.train import parse, resolve_env

    calls = []
    real = trl.TrlParser.parse_args_and_config
    monkeypatch.setattr(
        trl.TrlParser, "parse_args_and_config", lambda self, *a, **k: calls.append(a) or real(self, *a, **k)
    )
    monkeypatch.setenv("ENVKIT_FROM_YAML", "unset")
    path = tmp_path / "train.yaml"
    path.write_text(
        "env:\n  ENVKIT_FROM_YAML: set\n"  # TRL's env block: environment variables
        "max-steps: 3\nrl_num_generations: 2\nper_device_train_batch_size: 4\nlora_target_modules: [q_proj, v_proj]\n"
        "env_config: {low: 1, high: 32}\n"
    )
    args, config = parse(["--env", "guess-number", "--model", "m", "--config", str(path), "--max-steps", "5"])
    assert calls and os.environ["ENVKIT_FROM_YAML"] == "set"
    assert config.max_steps == 5 and config.num_generations == 2 and config.per_device_train_batch_size == 4
    assert args.lora_target_modules == ["q_proj", "v_proj"]
    assert resolve_env(args)[1] == {"low": 1, "high": 32}
    # `env:` as a name is envkit's --env (the env to train on); the command line's --env still wins.
    path.write_text("env: guess-number\nmax_steps: 3\n")
    assert parse(["--model", "m", "--config", str(path)])[0].env == "guess-number"
    assert parse(["--model", "m", "--config", str(path), "--env", "hotel-booking"])[0].env == "hotel-booking"
    assert parse(["--model", "m", f"--config={path}"])[1].max_steps == 3


def test_env_config_and_its_seed_style_alias():
    from envkit.adapters.trl.train import parse, resolve_env

    args, _ = parse(["--env", "guess-number", "--model", "m", "--env-config", '{"low": 1, "high": 32}'])
    assert resolve_env(args)[1] == {"low": 1, "high": 32}
    args, _ = parse(["--env", "guess-number", "--model", "m", "--rl-env-config", '{"low": 1, "high": 8}'])
    assert resolve_env(args)[1] == {"low": 1, "high": 8}


@pytest.mark.parametrize(
    ("yaml_text", "extra", "message"),
    [
        ("max_steps: 2\nbogus_key: 1\n", [], "unknown keys in --config"),
        ("- max_steps\n", [], "must hold a YAML mapping"),
        ("max_steps: [1\n", [], "cannot read --config"),
        ("max_steps: 2\n", ["--max-steps", "abc"], "invalid int value: 'abc'"),
        ("max_steps: 2\n", ["--no-such-flag", "1"], "unknown arguments: --no-such-flag 1"),
    ],
)
def test_bad_config_or_flags_are_one_line_and_exit_2(tiny_model_dir, tmp_path, yaml_text, extra, message, capsys):
    path = tmp_path / "train.yaml"
    path.write_text(yaml_text)
    assert main(["train", "--env", "guess-number", "--model", str(tiny_model_dir), "--config", str(path), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "usage:" not in err, err


# ---- seed-style classes whose prompts are text with the tools rendered in -------------------------------------------
def test_seed_style_text_prompts_with_tools_train_on_the_text_scored_by_score_episode(tiny_model_dir, tmp_path, capsys):
    from seed_style_text_prompts import TextPromptsWithTools

    TextPromptsWithTools.scored.clear()
    out = tmp_path / "text-prompts"
    code = main(
        [
            "train",
            "--rl-env-module",
            "seed_style_text_prompts",
            "--rl-env-class",
            "TextPromptsWithTools",
            "--model",
            str(tiny_model_dir),
            "--output-dir",
            str(out),
            "--disable-tqdm",
            "true",
            *_without(QUICK, "--max-turns", "--train-tasks"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    notices = [line for line in captured.out.splitlines() if "tool loop" in line]
    assert len(notices) == 1 and "tools already in it" in notices[0] and "TRL's tool loop is not used" in notices[0]
    assert all('"name": "add"' in prompt for prompt in TextPromptsWithTools.prompts)  # the tools are in the text
    scored = TextPromptsWithTools.scored
    assert len(scored) == 2 * 4 and all(isinstance(completion, str) for completion, _, _ in scored)
    assert all(scored[i][1] == scored[i + 1][1] for i in range(0, 8, 2))  # a group: one case, 2 completions
    log = json.loads((out / "log_history.json").read_text())
    steps = [entry for entry in log if "reward" in entry]
    expected = [sum(s for _, _, s in scored[i : i + 4]) / 4 for i in (0, 4)]
    assert [entry["reward"] for entry in steps] == pytest.approx(expected)  # the rewards are score_episode's
    assert [entry["rewards/score_episode_reward/mean"] for entry in steps] == pytest.approx(expected)
    assert not any(key.startswith("tools/") for entry in log for key in entry)  # TRL's tool loop did not run


# ---- --rl-* vs their GRPOConfig twins, env-config merging, seed-style flags, typed YAML values ----------------------
def test_rl_flags_on_the_command_line_beat_their_grpo_twins_in_the_yaml(tmp_path):
    from envkit.adapters.trl.train import parse

    path = tmp_path / "train.yaml"
    path.write_text(
        "temperature: 0.9\nnum_generations: 8\nbeta: 0.3\nepsilon: 0.3\ntop_k: 5\ntop_p: 0.5\n"
        "max_completion_length: 64\nvllm_server_base_url: http://file:1\n"
    )
    argv = ["--env", "guess-number", "--model", "m", "--config", str(path)]
    rl = [
        *("--rl-temperature", "0.5", "--rl-num-generations", "2", "--rl-kl-coef", "0.05", "--rl-clip-range", "0.1"),
        *("--rl-top-k", "3", "--rl-top-p", "0.8", "--rl-max-new-tokens", "16", "--vllm-server-url", "http://cli:2"),
    ]
    args, config = parse([*argv, *rl])
    assert (config.temperature, config.num_generations, config.beta, config.epsilon) == (0.5, 2, 0.05, 0.1)
    assert (config.top_k, config.top_p, config.max_completion_length) == (3, 0.8, 16)
    assert config.vllm_server_base_url == "http://cli:2" and args.max_completion_tokens == 4 * 16
    _, config = parse(argv)  # no --rl-* on the command line: the file's values
    assert (config.temperature, config.num_generations, config.max_completion_length) == (0.9, 8, 64)
    _, config = parse([*argv, "--rl-temperature", "0.5", "--temperature", "0.7"])  # the twin itself typed: it wins
    assert config.temperature == 0.7


def test_env_config_and_rl_env_config_together_are_a_usage_error(tmp_path, capsys):
    message = "error: --env-config and --rl-env-config are the same option; give one\n"
    both = ["--env-config", '{"low": 1}', "--rl-env-config", '{"high": 8}']
    assert main(["train", "--env", "guess-number", "--model", "m", *both]) == 2
    assert capsys.readouterr().err == message
    path = tmp_path / "train.yaml"
    path.write_text("env_config: {low: 1}\n")
    argv = ["train", "--env", "guess-number", "--model", "m", "--config", str(path), "--rl-env-config", '{"high": 8}']
    assert main(argv) == 2
    assert capsys.readouterr().err == message


def test_yaml_env_config_is_merged_key_by_key_with_the_command_lines(tmp_path):
    from envkit.adapters.trl.train import parse, resolve_env

    path = tmp_path / "train.yaml"
    path.write_text("env_config: {low: 1, high: 32}\n")
    argv = ["--env", "guess-number", "--model", "m", "--config", str(path)]
    assert resolve_env(parse([*argv, "--env-config", '{"high": 8}'])[0])[1] == {"low": 1, "high": 8}
    assert resolve_env(parse(argv)[0])[1] == {"low": 1, "high": 32}
    path.write_text('env_config: \'{"low": 2, "high": 32}\'\n')  # a JSON string in the file merges the same way
    assert resolve_env(parse([*argv, "--env-config=" + '{"high": 8}'])[0])[1] == {"low": 2, "high": 8}


SEED_STYLE = ["--rl-env-module", "seed_style_arithmetic", "--rl-env-class", "SeedArithmetic", "--model", "m"]


ENVKIT_ENV_VALUES = {
    "max_turns": "2",
    "max_episode_tokens": "100",
    "max_completion_tokens": "300",
    "concurrency": "4",
    "step_timeout": "5",
    "generate_timeout": "5",
    "env_workers": "processes",
    "ray_address": "auto",
    "train_tasks": "8",
}
"""A value other than the default of each envkit-env-only flag a seed-style run refuses."""
SEED_STYLE_USES = {
    *("model", "env", "env_config", "rl_env_module", "rl_env_class", "rl_env_config", "torch_threads"),
    *("rl_num_generations", "rl_kl_coef", "rl_clip_range", "rl_max_new_tokens", "rl_top_k", "rl_top_p"),
    *("rl_temperature", "vllm_server_url", "max_error_rate", "eval_tasks", "eval_samples", "no_lora", "merge"),
    *("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"),
}
"""The TrainArguments fields a seed-style run uses (TRL's GRPOConfig and its own loop, the LoRA, the held-out eval)."""
ASYNC_ONLY = {"async_grpo", *ASYNC_ONLY_FLAGS}
"""``--async`` and its settings: ``--async`` itself is refused for a seed-style class, its settings without it."""
ASYNC_ONLY_VALUES = {
    "max_staleness": "1",
    "vllm_servers": "2",
    "vllm_python": "python3",
    "vllm_server_gpus": "1",
    "adapter_dir": "adapters",
}


@pytest.mark.parametrize("name", ASYNC_ONLY_FLAGS)
def test_an_async_setting_without_async_is_a_usage_error(name, tiny_model_dir, capsys):
    """Without --async these did nothing (--print-server-command trained instead of printing the command)."""
    flag = "--" + name.replace("_", "-")
    value = [ASYNC_ONLY_VALUES[name]] if name in ASYNC_ONLY_VALUES else []
    assert main(["train", "guess-number", "--model", str(tiny_model_dir), flag, *value]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {flag} applies to --async only: add --async, or drop it\n"


def test_a_vllm_server_url_without_async_or_use_vllm_is_a_usage_error(tiny_model_dir, capsys):
    """It trained locally and never asked the server."""
    argv = ["train", "guess-number", "--model", str(tiny_model_dir), "--vllm-server-url", "http://127.0.0.1:9"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: --vllm-server-url: generation goes to a vLLM server with --async")
        and err.count("\n") == 1
    )


def test_every_train_flag_is_one_a_seed_style_run_uses_or_refuses():
    """A new TrainArguments field fails here until it is placed: used by seed-style runs, or in
    ``ENVKIT_ENV_ONLY`` so that setting it for a seed-style class is refused instead of silently doing nothing."""
    from envkit.adapters.trl.config import TrainArguments

    fields = {f.name for f in dataclasses.fields(TrainArguments) if f.init}
    placed = [set(ENVKIT_ENV_ONLY), SEED_STYLE_USES, ASYNC_ONLY]
    assert set().union(*placed) == fields and sum(map(len, placed)) == len(fields)


@pytest.mark.parametrize("name", sorted(set(ENVKIT_ENV_ONLY) - set(SEED_STYLE_IN_FORCE)))
def test_envkit_env_flags_on_a_seed_style_class_are_a_usage_error(name, capsys):
    flag = "--" + name.replace("_", "-")
    assert main(["train", *SEED_STYLE, flag, ENVKIT_ENV_VALUES[name]]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag} applies to envkit envs only") and err.count("\n") == 1, err


@pytest.mark.parametrize("extra", [["--vllm-servers", "1"], ["--print-server-command"]])
def test_async_on_a_seed_style_class_is_a_usage_error_before_anything_prints(extra, capsys):
    """A seed-style class trains in TRL's own loop, never with ``--async``: refused in one line, and
    ``--print-server-command`` prints no server line for a run that could not start."""
    assert main(["train", *SEED_STYLE, "--async", *extra]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "error: --async trains envkit envs (the engine plays them); seed-style classes train without it\n"
    )
    assert captured.out == ""


def test_seed_style_flags_check_compares_what_the_user_gave(tmp_path):
    from envkit.adapters.trl.train import check_seed_style_flags, parse

    args, _ = parse(SEED_STYLE)
    assert args.max_completion_tokens == 4 * 128  # auto-filled from the per-turn budget: not the user's
    check_seed_style_flags(args)
    check_seed_style_flags(parse([*SEED_STYLE, "--eval-tasks", "0", "--verify-vllm-sync", "false"])[0])  # = what runs
    path = tmp_path / "train.yaml"
    path.write_text("max_turns: 3\n")
    from envkit.adapters.trl.config import TrainUsageError

    with pytest.raises(TrainUsageError, match="--max-turns applies to envkit envs only"):
        check_seed_style_flags(parse([*SEED_STYLE, "--config", str(path)])[0])


def test_config_path_with_a_tilde_and_messages_name_the_users_file(tmp_path, monkeypatch, capsys):
    from envkit.adapters.trl.train import parse

    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / "t.yaml"
    path.write_text("max_steps: 3\n")
    assert parse(["--env", "guess-number", "--model", "m", "--config=~/t.yaml"])[1].max_steps == 3
    assert parse(["--env", "guess-number", "--model", "m", "--config", "~/t.yaml"])[1].max_steps == 3
    path.write_text("env: guess-number\nmax_steps: 3\n")  # `env: NAME`: TRL reads a copy without it
    assert parse(["--model", "m", "--config=~/t.yaml"])[0].env == "guess-number"
    path.write_text("env: guess-number\nbogus_key: 1\n")
    assert main(["train", "--model", "m", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"unknown keys in --config {path}: bogus_key" in err and "envkit-train-" not in err, err


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("env_config: [tier, hard]\n", "env_config must be a mapping of the env's constructor arguments"),
        ("env_config: 5\n", "env_config must be a mapping of the env's constructor arguments"),
        ("rl_env_config: [1]\n", "rl_env_config must be a mapping of the env's constructor arguments"),
        ("logging_steps: [1]\n", "logging_steps: must be a single value, got [1]"),
        ("max_steps: {a: 1}\n", "max_steps: must be a single value"),
        ("logging_steps: null\n", "logging_steps must be a number, got None"),
        ("rl_num_generations: 2.5\n", "rl_num_generations must be a whole number, got 2.5"),  # not silently 2.5
        ("max_steps: true\n", "max_steps must be a whole number, got True"),
        ("use_vllm: 1\n", "use_vllm must be true or false, got 1"),
    ],
)
def test_wrongly_typed_yaml_values_are_one_line_and_exit_2(tmp_path, yaml_text, message, capsys):
    path = tmp_path / "train.yaml"
    path.write_text(yaml_text)
    assert main(["train", "--env", "guess-number", "--model", "m", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_yaml_numbers_written_as_yaml_strings_still_parse(tmp_path):
    """YAML reads ``5e-4`` as a string: argparse converts it like a command-line value (no false type error)."""
    from envkit.adapters.trl.config import parse

    path = tmp_path / "train.yaml"
    path.write_text("learning_rate: 5e-4\nmax_steps: 3\nbf16: false\n")
    _, grpo = parse(["--env", "guess-number", "--model", "m", "--config", str(path)])
    assert (grpo.learning_rate, grpo.max_steps, grpo.bf16) == (5e-4, 3, False)


def test_step_timeout_reaches_training_and_the_stop_message_names_it(tiny_model_dir, tmp_path, capsys):
    # Every env step blocks until the test ends and --step-timeout is 10 (far above the first rendering call's, which
    # builds the renderer: seconds on a loaded machine; so only the steps can pass it): every episode of the first
    # step times out, training stops at once with one line, and the episode error it quotes names the flag to raise.
    fast = [*_without(FAST, "--eval-tasks"), "--eval-tasks", "0", "--step-timeout", "10", "--generate-timeout", "60"]
    with hung_step_env_file(tmp_path) as env:
        run = ["train", "--env", env, "--model", str(tiny_model_dir), "--output-dir", str(tmp_path / "run"), *fast]
        assert main(run)
    err = capsys.readouterr().err
    assert "episodes failed at step 0" in err and "took longer than 10s" in err and "--step-timeout" in err, err
    assert main(["train", "--env", "guess-number", "--model", "m", "--generate-timeout", "-1"]) == 2
    assert capsys.readouterr().err == "error: --generate-timeout must be a positive number of seconds, got -1\n"


def test_a_held_out_eval_whose_episodes_fail_stops_the_run_instead_of_scoring_them_0(tiny_model_dir, tmp_path, capsys):
    """A failed held-out episode counts 0 in the eval's mean: past --max-error-rate the run stops before training,
    in one line; below it the before/after lines say how many failed."""
    spec = "helpers:FailsOnSomeSeeds"
    argv = ["train", spec, "--model", str(tiny_model_dir), *quick_train_flags(max_steps=1, eval_tasks=4)]
    assert main([*argv, "--env-config", '{"first": 1000000}', "--output-dir", str(tmp_path / "all")]) == 1
    err = capsys.readouterr().err
    assert (
        "\nerror: the held-out eval before training: 4 of 4 episodes failed (error rate 1.00 > --max-error-rate" in err
    )
    assert "RuntimeError: tool server unreachable" in err and not (tmp_path / "all" / "eval_summary.json").exists()

    half = ["--env-config", '{"first": 1000000, "every": 2}', "--max-error-rate", "0.5"]
    assert main([*argv, *half, "--output-dir", str(tmp_path / "half")]) == 0
    out = capsys.readouterr().out
    assert "held-out before training: mean score 0.500 (2 of 4 episodes failed, counted 0)" in out
    assert "held-out after training: mean score 0.500 (2 of 4 episodes failed, counted 0) (before 0.500)" in out


def test_failed_training_episodes_are_said_once_in_a_line_not_dumped_at_every_step(tiny_model_dir, tmp_path, capsys):
    """Every training episode fails (under --max-error-rate 1, which never stops): envkit says the first in one line
    and counts them in envkit/error_rate; GRPOTrainer's warning that no reward scored a row, which printed the row's
    whole transcript at every step, is left out while envkit trains."""
    out = tmp_path / "failing"
    argv = ["train", "helpers:FailsOnSomeSeeds", "--model", str(tiny_model_dir), "--output-dir", str(out)]
    assert main([*argv, "--max-error-rate", "1", *quick_train_flags(max_steps=2, eval_tasks=0)]) == 0
    captured = capsys.readouterr()
    said = [line for line in captured.out.splitlines() if "an episode failed at step" in line]
    assert len(said) == 1 and "RuntimeError: tool server unreachable" in said[0], captured.out[-2000:]
    assert "All reward functions returned None" not in captured.out + captured.err
    steps = [entry for entry in json.loads((out / "log_history.json").read_text()) if "envkit/error_rate" in entry]
    assert [entry["envkit/error_rate"] for entry in steps] == [1.0, 1.0]


def test_a_held_out_eval_failing_after_training_saves_the_trained_model_first(tiny_model_dir, tmp_path):
    """The tool server goes down as training ends: the eval after training stops the run, but only once the trained
    model and eval_summary.json (with the failure) are saved."""
    from transformers import TrainerCallback

    from envkit.adapters.trl.heldout import HeldOutEvalFailed
    from envkit.adapters.trl.train import run

    down = tmp_path / "server-down"

    class ServerGoesDown(TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs) -> None:
            down.touch()

    out = tmp_path / "run"
    config = json.dumps({"first": 1_000_000, "once_exists": str(down)})
    argv = ["helpers:FailsOnSomeSeeds", "--env-config", config, "--model", str(tiny_model_dir), "--no-lora"]
    with pytest.raises(HeldOutEvalFailed, match=r"^the held-out eval after training: 4 of 4 episodes failed") as caught:
        flags = [*argv, "--output-dir", str(out), *quick_train_flags(max_steps=1, eval_tasks=4)]
        run(flags, log=lambda _: None, callbacks=[ServerGoesDown()])
    assert str(caught.value).endswith(f"(the trained model is saved in {out})")
    assert (out / "model.safetensors").is_file()
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["before"]["mean_score"] == 1.0 and "after" not in summary
    assert summary["after_failed"].startswith("the held-out eval after training: 4 of 4 episodes failed")


def test_eval_of_a_trained_model_says_when_it_scores_training_tasks_or_other_budgets(tiny_model_dir, tmp_path, capsys):
    """envkit train records how the model trained (eval_summary.json's ``training``); envkit eval of that folder on
    the same env warns when its task seeds are training tasks or its budgets differ, and is quiet on held-out tasks
    under the same budgets."""
    from envkit.adapters.trl.heldout import EVAL_SEED_OFFSET

    out = tmp_path / "run"
    train = ["train", "guess-number", "--model", str(tiny_model_dir), "--output-dir", str(out), "--no-lora"]
    assert main([*train, *quick_train_flags(max_steps=1, eval_tasks=0)]) == 0
    recorded = json.loads((out / "eval_summary.json").read_text())["training"]
    assert recorded == {"train_tasks": 8, "max_new_tokens": 8, "max_completion_tokens": 32, "max_turns": 2}
    capsys.readouterr()

    evaluate = ["eval", "guess-number", "--model", str(out), "--tasks", "2", "--max-turns", "1"]
    assert main(evaluate) == 0
    err = capsys.readouterr().err
    assert f"2 of the 2 task seeds are tasks {out} trained on (seeds 0-7" in err
    assert f"--seed {EVAL_SEED_OFFSET} evaluates the held-out tasks" in err
    assert f"{out} trained with 8 tokens per turn and an episode budget of 32; this eval gives 256 and none" in err

    same = ["--seed", str(EVAL_SEED_OFFSET), "--max-new-tokens", "8", "--max-completion-tokens", "32"]
    assert main([*evaluate, *same]) == 0
    assert "warning" not in capsys.readouterr().err
