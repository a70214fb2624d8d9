"""``envkit train --async`` derives TRL's ``AsyncGRPOConfig`` from envkit train's ``GRPOConfig``
(:mod:`envkit.adapters.trl.async_grpo.async_config`): every shared field is copied, every set field AsyncGRPO cannot
honour is refused in one line, β defaults to 0, and the two dataclasses' difference is the reviewed one."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("trl.experimental.async_grpo")

from envkit.adapters.trl.async_grpo import async_config as derive

GRPO_ONLY = {
    "beta", "cache_implementation", "cast_lm_head_to_fp32", "delta", "disable_dropout", "ds3_gather_for_generation",
    "entropy_coef", "entropy_coef_delta", "entropy_coef_max", "entropy_coef_min", "entropy_target",
    "generation_batch_size", "generation_kwargs", "importance_sampling_level", "log_completions_hub_repo",
    "log_multimodal", "log_unique_prompts", "loss_type", "mask_truncated_completions", "multi_objective_aggregation",
    "num_generations_eval", "num_iterations", "off_policy_mask_threshold", "pad_to_multiple_of",
    "ref_model_mixup_alpha", "ref_model_sync_steps", "reward_weights", "sapo_temperature_neg", "sapo_temperature_pos",
    "scale_rewards", "shuffle_dataset", "steps_per_generation", "sync_ref_model", "top_entropy_quantile",
    "transformers_continuous_batching_config", "use_adaptive_entropy", "use_bias_correction_kl",
    "use_transformers_continuous_batching", "use_transformers_paged", "use_vllm", "vespo_k_neg", "vespo_k_pos",
    "vespo_lambda_neg", "vespo_lambda_pos", "vllm_enable_sleep_mode", "vllm_gpu_memory_utilization",
    "vllm_group_port", "vllm_importance_sampling_cap", "vllm_importance_sampling_clip_max",
    "vllm_importance_sampling_clip_min", "vllm_importance_sampling_correction", "vllm_importance_sampling_mode",
    "vllm_max_model_length", "vllm_mode", "vllm_model_impl", "vllm_server_host", "vllm_server_port",
    "vllm_structured_outputs_regex", "vllm_tensor_parallel_size",
}  # fmt: skip
"""GRPOConfig fields AsyncGRPOConfig lacks (TRL 1.16): refused when set, but ENVKIT_HONOURS."""
ASYNC_ONLY = {
    "dtype", "fork_threshold_tokens", "heartbeat_stale_after_s", "max_inflight_tasks", "max_staleness",
    "queue_maxsize", "request_timeout", "token_budget", "weight_sync_steps", "weight_sync_timeout",
}  # fmt: skip
"""AsyncGRPOConfig fields GRPOConfig lacks: TRL's defaults, or set by envkit (max_staleness, token_budget)."""
SHARED_DIFFERENT_DEFAULTS = {
    "ignore_data_skip", "logging_steps", "lr_scheduler_type", "max_completion_length", "remove_unused_columns",
    "vllm_server_base_url",
}  # fmt: skip
"""Shared fields whose defaults differ: copying the GRPOConfig's value changes what AsyncGRPO would have used."""


def _defaults(cls: type) -> dict[str, object]:
    out = {}
    for f in dataclasses.fields(cls):
        if f.init:
            out[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
    return out


def test_the_two_configs_differ_exactly_as_reviewed():
    """A TRL release that adds, removes or re-defaults a field fails here: review where it goes (copied, refused,
    honoured by envkit) and update the sets above."""
    grpo, async_ = derive.config_classes()
    g, a = _defaults(grpo), _defaults(async_)
    assert derive.grpo_only_fields() == set(g) - set(a) == GRPO_ONLY
    assert set(a) - set(g) == ASYNC_ONLY
    assert {n for n in derive.shared_fields() if repr(g[n]) != repr(a[n])} == SHARED_DIFFERENT_DEFAULTS
    assert set(derive.ENVKIT_HONOURS) <= GRPO_ONLY
    assert set(derive.TRL_WORKER_ONLY) | set(derive.SET_BY_ENVKIT) <= derive.shared_fields()


def _parse(*flags: str):
    from envkit.adapters.trl.config import parse

    return parse(["guess-number", "--model", "m", "--async", "--vllm-server-url", "http://127.0.0.1:1", *flags])


def _derive(config, args, *, cuda: bool = False):
    return derive.async_config(
        config,
        server_url="http://127.0.0.1:1",
        max_staleness=args.max_staleness,
        cuda=cuda,
        train_tasks=args.train_tasks,
        world_size=1,
    )


TRAINER_FLAGS = [
    "--lr-scheduler-type", "cosine", "--warmup-steps", "3", "--max-grad-norm", "0.5", "--weight-decay", "0.01",
    "--epsilon-high", "0.28", "--max-steps", "7",
]  # fmt: skip


def test_trainer_flags_reach_the_async_trainer_through_train(tiny_model_dir, tmp_path, monkeypatch):
    """Through ``run.py``'s ``_train`` (the trainer class replaced by one that records its ``args``): the five flags
    6880d0c dropped arrive, and every shared field equals the GRPOConfig's (but the ones envkit sets)."""
    from envkit.adapters.trl.async_grpo import run, trl_async
    from envkit.adapters.trl.config import parse

    seen = {}

    class Recorded(Exception):
        pass

    def record(*args, **kwargs):
        seen["args"] = kwargs["args"]
        kwargs["rollout_worker"].engine.close()
        raise Recorded

    monkeypatch.setattr(trl_async, "EnvkitAsyncGRPOTrainer", record)
    argv = ["guess-number", "--model", str(tiny_model_dir), "--async", "--vllm-server-url", "http://127.0.0.1:1"]
    args, config = parse([*argv, "--output-dir", str(tmp_path), *TRAINER_FLAGS])
    with pytest.raises(Recorded):
        run._train(args, config, "guess-number", {}, ["http://127.0.0.1:1"], print, cuda=False)
    got = seen["args"]
    assert str(getattr(got.lr_scheduler_type, "value", got.lr_scheduler_type)) == "cosine"
    assert (got.warmup_steps, got.max_grad_norm, got.weight_decay, got.epsilon_high) == (3, 0.5, 0.01, 0.28)
    assert got.max_steps == 7 and got.max_staleness == args.max_staleness
    for name in derive.shared_fields() - set(derive.SET_BY_ENVKIT) - set(derive.CPU_OFF):
        assert getattr(got, name) == getattr(config, name), name
    assert not got.bf16 and not got.activation_checkpointing and got.use_cpu  # no CUDA here


def test_bf16_and_checkpointing_are_copied_on_cuda_only():
    args, config = _parse("--bf16", "true", "--gradient-checkpointing", "true")
    cpu = _derive(config, args)
    assert not cpu.bf16 and not cpu.activation_checkpointing and not cpu.gradient_checkpointing and cpu.use_cpu
    config.use_cpu = False
    values = {n: getattr(config, n) for n in derive.shared_fields() - set(derive.SET_BY_ENVKIT)}
    assert values["bf16"] and values["activation_checkpointing"]  # what async_config copies on CUDA
    if __import__("torch").cuda.is_available():
        cuda = _derive(config, args, cuda=True)
        assert cuda.bf16 and cuda.activation_checkpointing


def test_epochs_become_the_steps_the_synchronous_run_takes():
    """Without ``--max-steps``: ``num_train_epochs`` over ``--train-tasks`` groups, one sample per episode."""
    args, config = _parse("--num-train-epochs", "2", "--train-tasks", "12", "--per-device-train-batch-size", "8")
    assert _derive(config, args).max_steps == 2 * 12 * 4 // 8


def test_async_beta_defaults_to_0_and_sync_keeps_envkit_s_0_1():
    from envkit.adapters.trl.async_grpo.run import check_async_flags
    from envkit.adapters.trl.config import parse

    args, config = _parse()
    assert config.beta == 0.0
    check_async_flags(args, config, cuda=False)  # a plain --async run is not refused
    _, sync = parse(["guess-number", "--model", "m"])
    assert sync.beta == 0.1


def test_help_says_async_trains_with_beta_0(capsys):
    from envkit.cli import main

    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "with --async 0 (AsyncGRPO has no KL term" in text


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--loss-type", "grpo"], "--loss-type grpo (no such AsyncGRPO setting)"),
        (["--num-iterations", "2"], "--num-iterations 2"),
        (["--beta", "0.1"], "--beta 0.1 (AsyncGRPO has no KL term"),
        (["--rl-kl-coef", "0.04"], "--beta 0.04"),
        (["--scale-rewards", "batch"], "--scale-rewards batch"),
        (["--mask-truncated-completions", "true"], "--mask-truncated-completions True"),
        (["--max-tool-calling-iterations", "3"], "(use --max-turns)"),
        (["--loss-type", "grpo", "--num-iterations", "2"], "--loss-type grpo (no such AsyncGRPO setting); --num-"),
    ],
)
def test_settings_async_cannot_honour_are_refused_in_one_line(flags, expected, capsys, tmp_path):
    from envkit.adapters.trl.train import main

    argv = ["guess-number", "--model", str(tmp_path), "--async", "--vllm-server-url", "http://127.0.0.1:1"]
    code = main([*argv, "--output-dir", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--async cannot honour" in err and expected in err and "\n" not in err, err


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--env-workers", "processes"], "--env-workers: --async does not use it (its rollout worker plays the envs"),
        (["--merge"], "--merge: --async does not use it (it saves the LoRA adapter only"),
        (["--torch-threads", "2"], "--torch-threads: --async does not use it (it splits the cores"),
        (["--generation-kwargs", '{"top_p": 5}'], "generation_kwargs['top_p'] must be above 0 and at most 1"),
    ],
)
def test_envkit_settings_only_the_synchronous_path_uses_are_refused_in_one_line(flags, expected, capsys, tmp_path):
    """They were accepted and ignored: the envs ran on threads, no merged model was saved, the threads stayed; and
    generation_kwargs is checked as the synchronous path checks it (it was a traceback once servers had started)."""
    from envkit.adapters.trl.train import main

    argv = ["guess-number", "--model", str(tmp_path), "--async", "--vllm-server-url", "http://127.0.0.1:1"]
    code = main([*argv, "--output-dir", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and expected in err and "\n" not in err, err


def test_settings_from_the_config_file_are_refused_too_and_defaults_given_are_not(capsys, tmp_path):
    from envkit.adapters.trl.train import main

    (tmp_path / "run.yaml").write_text("loss_type: grpo\nnum_iterations: 1\nbeta: 0.0\ngeneration_kwargs: {}\n")
    argv = ["guess-number", "--model", str(tmp_path), "--async", "--vllm-server-url", "http://127.0.0.1:1"]
    code = main([*argv, "--output-dir", str(tmp_path / "o"), "--config", str(tmp_path / "run.yaml")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "--loss-type grpo" in err and "--num-iterations" not in err and "--beta" not in err, err
