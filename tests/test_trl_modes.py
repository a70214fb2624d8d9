"""What envkit's rollout_func takes from TRL's GRPOConfig, and the TRL modes it refuses (one line, up front)."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import CounterEnv, free_port

from envkit.adapters.trl import (
    TRL_GENERATION_ONLY,
    UnsupportedTrainerConfig,
    UnsupportedTrainerMode,
    build_dataset,
    config_sampling,
    env_score_reward,
    make_rollout_func,
    trainer_sampling,
)
from envkit.adapters.trl.modes import GENERATION_METHODS
from envkit.cli.app import main

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def trainer(tiny_model_dir, local_tokenizer, tmp_path_factory):
    """A real GRPOTrainer on CPU (no training step is taken); tests change its mode with monkeypatch."""
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    local_tokenizer.padding_side = "left"
    config = GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("modes")),
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=1,
        max_completion_length=8,
        bf16=False,
        use_cpu=True,
        report_to="none",
        beta=0.0,
    )
    return GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
        args=config,
        reward_funcs=env_score_reward,
        train_dataset=build_dataset(CounterEnv, [0, 1]),
        processing_class=local_tokenizer,
        rollout_func=make_rollout_func(CounterEnv),
    )


def _use_vllm(monkeypatch, trainer, **fields):
    monkeypatch.setattr(trainer, "use_vllm", True)
    monkeypatch.setattr(trainer.args, "use_vllm", True)
    for name, value in fields.items():
        monkeypatch.setattr(trainer.args, name, value)


def _server_mode_with_two_processes(monkeypatch, trainer):
    _use_vllm(monkeypatch, trainer, vllm_mode="server")
    monkeypatch.setattr(type(trainer.accelerator), "num_processes", property(lambda self: 2))


def _zero3(monkeypatch, trainer):
    from accelerate.utils import DeepSpeedPlugin

    plugin = DeepSpeedPlugin(zero_stage=3)
    monkeypatch.setattr(trainer, "is_deepspeed_enabled", True)
    monkeypatch.setattr(type(trainer.accelerator.state), "deepspeed_plugin", property(lambda self: plugin))


MODES = {
    "sleep-mode": (
        lambda mp, t: _use_vllm(mp, t, vllm_mode="colocate", vllm_enable_sleep_mode=True),
        "turn sleep mode off",
    ),
    "colocate-tp2": (
        lambda mp, t: _use_vllm(mp, t, vllm_mode="colocate", vllm_tensor_parallel_size=2),
        "use vllm_tensor_parallel_size 1",
    ),
    "server-2-processes": (_server_mode_with_two_processes, "use server mode with one training process"),
    "zero3": (_zero3, "use ZeRO-2 (or ZeRO-1) or DDP"),
    "fsdp": (lambda mp, t: mp.setattr(t, "is_fsdp_enabled", True), "use DDP or DeepSpeed ZeRO-2"),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_rollout_func_refuses_modes_it_cannot_serve(trainer, monkeypatch, mode):
    """The check reads the trainer's own accelerator and args on the first call, before any generation."""
    setup, instead = MODES[mode]
    setup(monkeypatch, trainer)
    generated = []
    rollout = make_rollout_func(CounterEnv, on_episodes=generated.extend)
    prompts = [trainer.train_dataset[0]["prompt"]] * 2
    with pytest.raises(UnsupportedTrainerMode) as caught:
        rollout(prompts, trainer)
    message = str(caught.value)
    assert instead in message and "\n" not in message
    assert not generated


@pytest.mark.parametrize(
    ("generation_kwargs", "named"),
    [
        ({"frequency_penalty": 0.5}, "'frequency_penalty'"),
        ({"stop": ["###"], "num_beams": 2}, "'num_beams'"),
        ({"temperature": 0.7}, "set temperature (the GRPOConfig field)"),
        ({"seed": 3}, "set seed (the GRPOConfig field, --seed)"),
        ({"max_tokens": 64}, "per-turn budget is max_completion_length"),
    ],
)
def test_unsupported_generation_kwargs_are_refused_in_one_line(trainer, monkeypatch, generation_kwargs, named):
    monkeypatch.setattr(trainer.args, "generation_kwargs", generation_kwargs)
    rollout = make_rollout_func(CounterEnv)
    with pytest.raises(UnsupportedTrainerConfig) as caught:
        rollout([trainer.train_dataset[0]["prompt"]] * 2, trainer)
    message = str(caught.value)
    assert named in message and "\n" not in message


@pytest.mark.parametrize(
    ("attribute", "value", "named"),
    [("tools", [lambda q: q], "GRPOTrainer(tools=...)"), ("environment_factories", {None: CounterEnv}, "environment")],
)
def test_trls_own_tool_loop_beside_the_rollout_func_is_refused(trainer, monkeypatch, attribute, value, named):
    """With tools (or an environment_factory, whose tools TRL collects into ``trainer.tools``) TRL runs its own tool
    loop on envkit's episodes and ignores env_mask: the env's tokens would train as the model's. Refused in one line
    on the first rollout, before anything is generated."""
    monkeypatch.setattr(trainer, attribute, value)
    with pytest.raises(UnsupportedTrainerConfig) as caught:
        make_rollout_func(CounterEnv)([trainer.train_dataset[0]["prompt"]] * 2, trainer)
    message = str(caught.value)
    assert named in message and "ignores envkit's env_mask" in message and "\n" not in message


def _args_read_by(function: ast.FunctionDef) -> set[str]:
    """The ``args.X`` / ``self.args.X`` fields a method reads."""

    def is_args(node: ast.expr) -> bool:
        return (isinstance(node, ast.Name) and node.id == "args") or (
            isinstance(node, ast.Attribute) and node.attr == "args" and isinstance(node.value, ast.Name)
        )

    return {n.attr for n in ast.walk(function) if isinstance(n, ast.Attribute) and is_args(n.value)}


def test_every_field_only_trls_own_generation_reads_is_refused_by_name():
    from trl import GRPOConfig
    from trl.trainer import grpo_trainer

    module = ast.parse(inspect.getsource(grpo_trainer))
    trainer_class = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "GRPOTrainer")
    methods = {f.name: f for f in trainer_class.body if isinstance(f, ast.FunctionDef)}
    assert set(GENERATION_METHODS) <= set(methods)  # a rename upstream fails here, not silently
    in_generation = set().union(*(_args_read_by(methods[name]) for name in GENERATION_METHODS))
    elsewhere = set().union(*(_args_read_by(f) for name, f in methods.items() if name not in GENERATION_METHODS))
    # bf16 / fp16: transformers' Trainer reads them (mixed precision), not GRPOTrainer's own methods.
    generation_only = in_generation - elsewhere - {"bf16", "fp16"}
    assert generation_only <= set(TRL_GENERATION_ONLY), generation_only - set(TRL_GENERATION_ONLY)
    # The rest of the list flows through the generation config __init__ builds; each must still be a field.
    assert set(TRL_GENERATION_ONLY) <= {f.name for f in dataclasses.fields(GRPOConfig)}


VLLM_SETTINGS_ENVKIT_USES = {
    # the engine (colocate) or the client (server) TRL builds, which envkit's backends generate through
    "vllm_mode",
    "vllm_server_base_url",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_group_port",
    "vllm_server_timeout",
    "vllm_tensor_parallel_size",
    "vllm_gpu_memory_utilization",
    "vllm_max_model_length",
    "per_device_train_batch_size",
    "steps_per_generation",
    "vllm_enable_sleep_mode",
    "vllm_model_impl",
    "trust_remote_code",
    "generation_kwargs",  # envkit's own sampling reads it too (adapters/trl/sampling.py)
}


def test_every_field_trl_hands_its_vllm_generation_is_used_by_envkit_or_refused_by_name():
    """GRPOTrainer's ``__init__`` builds TRL's vLLM generation from GRPOConfig fields: envkit generates through that
    generation's engine or client, but not through its ``generate``. Each field is one or the other, so a TRL release
    that adds one fails here (``vllm_structured_outputs_regex`` was accepted and ignored)."""
    from trl.trainer import grpo_trainer

    module = ast.parse(inspect.getsource(grpo_trainer))
    trainer_class = next(n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "GRPOTrainer")
    init = next(f for f in trainer_class.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    (call,) = [n for n in ast.walk(init) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "VLLMGeneration"]
    handed = set().union(*(_args_read_by(ast.FunctionDef(name="", body=[ast.Expr(k.value)])) for k in call.keywords))
    assert "vllm_structured_outputs_regex" in handed  # the test reads what it should
    unaccounted = handed - VLLM_SETTINGS_ENVKIT_USES - set(TRL_GENERATION_ONLY)
    assert not unaccounted, (
        f"GRPOConfig fields TRL's vLLM generation reads that envkit neither uses nor refuses: {unaccounted}"
    )


GENERATION_ONLY_VALUES = {
    "max_tool_calling_iterations": 3,
    "use_transformers_continuous_batching": True,
    "transformers_continuous_batching_config": {"max_batch_tokens": 64},
    "cache_implementation": "static",
    "ds3_gather_for_generation": False,
    "vllm_structured_outputs_regex": r"\d+",
}


@pytest.mark.parametrize("name", sorted(TRL_GENERATION_ONLY))
def test_a_field_only_trls_generation_reads_is_refused_on_the_first_rollout(trainer, monkeypatch, name):
    monkeypatch.setattr(trainer.args, name, GENERATION_ONLY_VALUES[name])
    with pytest.raises(UnsupportedTrainerConfig) as caught:
        make_rollout_func(CounterEnv)([trainer.train_dataset[0]["prompt"]] * 2, trainer)
    message = str(caught.value)
    assert message.startswith(f"{name}=") and TRL_GENERATION_ONLY[name] in message and "\n" not in message


def test_envkit_train_refuses_max_tool_calling_iterations_and_names_max_turns(tiny_model_dir, capsys):
    argv = ["train", "guess-number", "--model", str(tiny_model_dir), "--max-tool-calling-iterations", "3"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "max_tool_calling_iterations=3 is not used by envkit's rollouts" in err and "--max-turns" in err
    assert err.count("\n") == 1


def test_grpo_config_sampling_fields_and_stop_generation_kwargs_are_applied(trainer, monkeypatch):
    monkeypatch.setattr(trainer.args, "min_p", 0.05)
    monkeypatch.setattr(trainer.args, "repetition_penalty", 1.3)
    monkeypatch.setattr(trainer.args, "top_k", 0)
    monkeypatch.setattr(trainer.args, "generation_kwargs", {"stop": "###", "stop_token_ids": [7], "top_p": 0.9})
    sampling = config_sampling(trainer.args)
    assert (sampling.min_p, sampling.repetition_penalty, sampling.top_k, sampling.top_p) == (0.05, 1.3, None, 0.9)
    assert sampling.stop == ["###"] and sampling.stop_token_ids == [7] and sampling.max_new_tokens == 8


@pytest.mark.parametrize(("top_k", "expected"), [(0, None), (-1, None), (5, 5)])
def test_a_top_k_override_of_0_or_vllms_minus_1_is_off(trainer, monkeypatch, top_k, expected):
    monkeypatch.setattr(trainer.args, "generation_kwargs", {"top_k": top_k})
    assert config_sampling(trainer.args).top_k == expected


def test_rollout_seed_follows_the_training_seed_and_changes_every_step(trainer, monkeypatch):
    first = trainer_sampling(trainer).seed
    assert first is not None and trainer_sampling(trainer).seed == first  # reproducible
    assert trainer_sampling(trainer, call=1).seed != first  # a second rollout at the same step
    monkeypatch.setattr(trainer.state, "global_step", trainer.state.global_step + 1)
    assert trainer_sampling(trainer).seed not in (None, first)
    monkeypatch.setattr(trainer.args, "seed", trainer.args.seed + 1)
    monkeypatch.setattr(trainer.state, "global_step", trainer.state.global_step - 1)
    assert trainer_sampling(trainer).seed not in (None, first)


def test_grpo_config_reaches_every_rollout_of_a_real_run(tiny_model_dir, tmp_path, monkeypatch):
    """envkit train with min_p, repetition_penalty, chat_template_kwargs and --max-completion-tokens: the training and
    evaluation rollouts sample with them, render the template with them, and no episode's completion is longer."""
    from envkit.adapters.trl.train import run
    from envkit.rollout import RolloutEngine

    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    template = (model / "chat_template.jinja").read_text()
    opening = "{{- '<|im_start|>system\\n' + system -}}"
    assert opening in template
    thinking_off = "('/no_think ' if enable_thinking is defined and not enable_thinking else '')"
    (model / "chat_template.jinja").write_text(
        template.replace(opening, "{{- '<|im_start|>system\\n' + " + thinking_off + " + system -}}")
    )
    calls = []
    original = RolloutEngine.run

    def recording_run(self, tasks, group_size, sampling, **kwargs):
        episodes = original(self, tasks, group_size, sampling, **kwargs)
        calls.append((self, sampling, episodes))
        return episodes

    monkeypatch.setattr(RolloutEngine, "run", recording_run)
    budget = 14
    summary = run(
        [
            "--env",
            "guess-number",
            "--model",
            str(model),
            "--output-dir",
            str(tmp_path / "out"),
            "--max-steps",
            "2",
            "--rl-max-new-tokens",
            "8",
            "--max-turns",
            "3",
            "--max-completion-tokens",
            str(budget),
            "--per-device-train-batch-size",
            "4",
            "--rl-num-generations",
            "2",
            "--train-tasks",
            "8",
            "--eval-tasks",
            "1",
            "--min-p",
            "0.05",
            "--repetition-penalty",
            "1.3",
            "--chat-template-kwargs",
            json.dumps({"enable_thinking": False}),
            "--seed",
            "7",
        ],
        log=lambda *_: None,
    )
    assert summary["train_steps"] == 2
    training = [call for call in calls if call[1].seed != 0]  # evaluation samples with seed 0
    assert len(training) == 2 and len(calls) == 4
    assert training[0][1].seed != training[1][1].seed
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model))
    for engine, sampling, episodes in calls:
        assert (sampling.min_p, sampling.repetition_penalty, sampling.top_k) == (0.05, 1.3, None)
        assert sampling.max_new_tokens == 8
        assert engine.template_kwargs == {"enable_thinking": False} and engine.max_completion_tokens == budget
        for episode in episodes:
            assert tokenizer.decode(episode.prompt_ids).startswith("<|im_start|>system\n/no_think ")
            assert len(episode.completion_ids) <= budget
    episodes = [e for _, _, batch in training for e in batch]
    assert any(e.finish_reason == "max_episode_tokens" for e in episodes)  # the budget cut episodes short


def test_fsdp_is_refused_by_envkit_train(tiny_model_dir, monkeypatch, capsys):
    monkeypatch.delenv("FSDP_CPU_RAM_EFFICIENT_LOADING", raising=False)  # set by TrainingArguments for FSDP
    assert main(["train", "--env", "guess-number", "--model", str(tiny_model_dir), "--fsdp", "full_shard"]) == 2
    err = capsys.readouterr().err
    assert "FSDP is not supported" in err and "use DDP or DeepSpeed ZeRO-2" in err and err.count("\n") == 1


def test_vllm_server_mode_with_two_processes_is_refused_by_envkit_train(tiny_model_dir, tmp_path):
    """Two CPU processes under torchrun (``accelerate launch --cpu`` would start one): each refuses up front, before
    loading the model or asking for vLLM."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "envkit.cli",
        "train",
        "--env",
        "guess-number",
        "--model",
        str(tiny_model_dir),
        "--output-dir",
        str(tmp_path / "out"),
        "--use-vllm",
        "--vllm-server-url",
        "http://127.0.0.1:1",
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=str(ROOT / "tests"))
    assert result.returncode != 0
    # Each process refuses with its own line; the two writes may interleave on the shared stderr, so count them.
    assert result.stderr.count("error: vLLM server mode with 2 training processes") == 2, result.stderr[-3000:]
    assert result.stderr.count("use server mode with one training process") == 2
