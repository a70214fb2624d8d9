"""``envkit train``: GRPO through TRL's GRPOTrainer on an envkit env or a seed-style env class.

Flags come from two dataclasses parsed with TRL's ``TrlParser`` (:mod:`envkit.adapters.trl.config`):
:class:`TrainArguments` (envkit's own and the seed-style ``--rl-*`` flags) and TRL's ``GRPOConfig`` (every field is a
flag, e.g. ``--max-steps``, ``--per-device-train-batch-size``, ``--report-to``). ``--config file.yaml`` sets any of
them (an ``env:`` mapping sets environment variables); the command line wins. A live progress bar shows step, mean
score, mean turns, tool-error rate and ETA (``--disable-tqdm true``: one plain line per log);
``OUTPUT_DIR/reward_curve.png`` plots the mean score per step (:mod:`envkit.adapters.trl.progress`).

Seed-flag mapping: ``--rl-num-generations`` → ``num_generations``; ``--rl-kl-coef`` → ``beta``; ``--rl-clip-range`` →
``epsilon``; ``--rl-temperature`` / ``--rl-top-k`` / ``--rl-top-p`` → sampling; ``--rl-max-new-tokens`` → tokens per
assistant turn (and ``max_completion_length``); ``--vllm-server-url`` → ``vllm_server_base_url``;
``--use-vllm``, ``--vllm-mode``, ``--vllm-gpu-memory-utilization``, ``--vllm-tensor-parallel-size`` are GRPOConfig's
own fields; ``--vllm-server-gpus`` is the GPU count of the vLLM server (see the README's vLLM section).

For envkit envs (multi-turn rollouts) TRL's ``max_completion_length`` is the budget of *one assistant turn*;
``--max-completion-tokens`` bounds a whole episode's completion (model and env tokens after the prompt, what TRL
back-propagates through). GRPOConfig's ``min_p``, ``repetition_penalty``, ``chat_template_kwargs`` and ``seed`` reach
the rollouts; ``generation_kwargs`` keys other than stop strings/tokens and the sampling knobs are refused, as are
modes the rollouts cannot serve (vLLM server mode with several processes, colocated vLLM with tensor parallelism,
vLLM sleep mode, DeepSpeed ZeRO-3, FSDP): each with one line saying what works instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from envkit.adapters.trl.config import (
    TrainArguments,
    TrainUsageError,
    changed_fields,
    check_async_only_flags,
    episode_limits,
    parse,
    training_record,
)
from envkit.adapters.trl.heldout import (  # noqa: F401 - re-exported: envkit.adapters.trl.train names them
    EVAL_SEED_OFFSET,
    HeldOutEvalFailed,
    check_heldout,
    check_periodic_eval,
    eval_label,
    eval_overlap,
    eval_seeds,
    eval_shard,
    eval_tasks_seen_in_training,
    evaluate_heldout,
    heldout_line,
    opening_key,
)
from envkit.adapters.trl.hub import check_push_to_hub
from envkit.adapters.trl.lora import check_lora_targets, lora_config
from envkit.adapters.trl.resume import check_script_fields, resolve_checkpoint
from envkit.adapters.trl.seed_style import (  # noqa: F401 - re-exported: envkit.adapters.trl.train names them
    BUNDLED_RESPONSE_TEMPLATE,
    ENVKIT_ENV_ONLY,
    check_seed_style_flags,
    seed_style_eval_factory,
    seed_style_setup,
    set_bundled_response_template,
)
from envkit.adapters.trl.usage import help_text as _help_text
from envkit.util.paths import OutputPathError, check_not_the_model, check_output_folder
from envkit.util.process_exit import end_process_group


@contextlib.contextmanager
def _trl_deprecations_silenced() -> Iterator[None]:
    """TRL 1.16 still sets GRPOConfig's gradient_checkpointing and calls the model's gradient_checkpointing_* methods,
    which transformers 5.23 renamed (activation_checkpointing*): four FutureWarnings on every run that no flag of the
    user's can silence. Only those four messages are hidden, and only while a run trains (not for the process)."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message=r"`(is_)?gradient_checkpointing(_enable|_disable)?` is deprecated and will be removed in v6",
            category=FutureWarning,
        )
        yield


def help_text(full: bool = False) -> str:
    """``envkit train --help``: envkit's flags, then the GRPOConfig flags most runs touch; ``full``
    (``--help-all``): every GRPOConfig flag too. The defaults shown are the ones a run uses."""
    return _help_text(__doc__ or "", full=full)


def resolve_env(args: TrainArguments) -> tuple[type, dict[str, Any], str]:
    """The env class, its constructor config and a label; raises TrainUsageError."""
    from envkit.registry import EnvSpecError, merge_env_config, resolve_target

    try:  # parse() already merged the --config file's mapping into these (train_config)
        config = merge_env_config({"env_config": args.env_config, "rl_env_config": args.rl_env_config})
        cls, spec = resolve_target(args.env, args.rl_env_module, args.rl_env_class)
    except EnvSpecError as error:
        raise TrainUsageError(str(error)) from None
    try:
        cls(**config)
    except Exception as error:
        raise TrainUsageError(f"cannot build {cls.__name__} with {config}: {type(error).__name__}: {error}") from None
    return cls, config, spec


DEFAULT_EVAL_TASKS = 32
"""``--eval-tasks`` of an envkit env when not given (a seed-style class: 0, its tasks are its training rows)."""


def run(argv: list[str], log: Any = print, *, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """Train; return the summary (also written to ``OUTPUT_DIR/eval_summary.json``).

    Args:
        argv: ``envkit train``'s flags.
        log: Where the run's lines go (the progress bar aside).
        callbacks: transformers ``TrainerCallback`` instances the trainer calls besides its own (the ``callbacks=`` of
            TRL's trainers; sync and ``--async`` alike): to time steps, or keep something of one's own in each
            checkpoint (``on_save``).
    """
    with _trl_deprecations_silenced():
        return _run(argv, log, list(callbacks))


def _run(argv: list[str], log: Any, callbacks: list[Any]) -> dict[str, Any]:
    """The sync recipe: refuse what cannot run, load, assemble the trainer, evaluate, train, evaluate, save."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    args, config = parse(argv)
    cls, env_config, label = resolve_env(args)
    from envkit.validate.seed_style import is_seed_style

    seed_style = is_seed_style(cls)
    check_flags(args, config, seed_style=seed_style, cuda=torch.cuda.is_available())
    if args.async_grpo and args.print_server_command:
        from envkit.adapters.trl.async_grpo.run import print_server_command

        print_server_command(args, log=log)
        return {}
    try:  # the trainer creates it when it is built, after the model has loaded
        check_output_folder(config.output_dir, "--output-dir")
        check_not_the_model(config.output_dir, args.model, "--output-dir")
    except OutputPathError as error:
        raise TrainUsageError(str(error)) from None
    check_lora_targets(args)
    if args.async_grpo:  # generation on vLLM servers, TRL's AsyncGRPOTrainer: envkit.adapters.trl.async_grpo
        from envkit.adapters.trl.async_grpo.run import check_async_flags, run_async

        check_async_flags(args, config, cuda=torch.cuda.is_available())
        return run_async(args, config, label, env_config, log=log, callbacks=callbacks)
    env_workers = _env_workers(args)
    model, tokenizer = _load(args)
    from envkit.workers import EnvFactory

    factory = EnvFactory(label, env_config)  # picklable: every --env-workers kind builds envs from it
    shown: list[Any] = []  # the progress display, once installed: the rollout's warnings print above its bar

    def rollout_log(line: str) -> None:
        (shown[0].write if shown else log)(line)

    trainer_kwargs = (
        seed_style_setup(
            cls(**env_config),
            tokenizer,
            log=log if config.process_index == 0 else lambda _: None,
            max_error_rate=args.max_error_rate,
        )
        if seed_style
        else _env_setup(factory, args, config, tokenizer, env_workers=env_workers, log=rollout_log)
    )
    eval_factory = seed_style_eval_factory(label, env_config, args, trainer_kwargs) if seed_style else factory
    trainer = _trainer(
        model, tokenizer, args, config, {**trainer_kwargs, "callbacks": callbacks}, seed_style=seed_style
    )
    from envkit.adapters.trl.progress import install

    shown.append(install(trainer, disable=bool(config.disable_tqdm), log=log))  # the live bar, or a line per log
    main = trainer.accelerator.is_main_process
    from envkit.adapters.trl.env_classes import seed_style_spec

    env = seed_style_spec(label) if seed_style else label  # the spec envkit eval plays the class by
    summary: dict[str, Any] = {"env": env, "env_config": env_config, "model": args.model, "lora": not args.no_lora}
    summary["training"] = training_record(args, config, seed_style=seed_style)
    eval_name = "held-out"
    if args.eval_tasks > 0:
        prompts = trainer_kwargs["train_dataset"]["prompt"]
        eval_name = check_heldout(
            prompts, eval_factory, args, summary, seed_style=seed_style, log=log if main else None
        )
        # every process evaluates its share of the tasks (one process alone could outlast ddp_timeout)
        summary["before"] = evaluate_heldout(trainer, eval_factory, tokenizer, args, env_workers=env_workers)
        if main:
            log(heldout_line(eval_name, "before training", summary["before"]))
    trainer.accelerator.wait_for_everyone()
    started = time.perf_counter()
    if config.resume_from_checkpoint is not None:
        summary["resumed_from"] = config.resume_from_checkpoint
        if main:
            log(f"going on from {config.resume_from_checkpoint}")
    with envkit_reports_unscorable():
        trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    summary["train_s"] = time.perf_counter() - started  # generation included: it runs inside the training steps
    trainer.accelerator.wait_for_everyone()
    after_failed = None
    if args.eval_tasks > 0:
        try:
            summary["after"] = evaluate_heldout(
                trainer, eval_factory, tokenizer, args, env_workers=env_workers, when="after training"
            )
        except HeldOutEvalFailed as error:  # the trained model is saved first: the failure is the eval's
            after_failed = summary["after_failed"] = str(error)
    if main:
        if config.use_vllm and config.vllm_mode == "colocate" and args.verify_vllm_sync and not seed_style:
            summary["vllm_sync"] = verify_vllm_sync(trainer, factory, tokenizer, args)
            log(f"vLLM weight sync check: {summary['vllm_sync']}")
        _save(trainer, tokenizer, args, config, summary, label, eval_name, log)
    trainer.accelerator.wait_for_everyone()
    # python -m envkit.cli then ends a process of several without finalizing (envkit.util.process_exit)
    end_process_group(trainer.accelerator, trainer.model_wrapped)
    if after_failed is not None:
        raise HeldOutEvalFailed(f"{after_failed} (the trained model is saved in {config.output_dir})")
    return summary


UNSCORABLE_WARNING = "All reward functions returned None"
"""The start of GRPOTrainer's warning, at every step with a failed episode, that no reward function scored a row;
it prints the row's keyword arguments (for an envkit env, the episode's whole transcript)."""


class _DropUnscorableWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(UNSCORABLE_WARNING)


@contextlib.contextmanager
def envkit_reports_unscorable() -> Iterator[None]:
    """While training runs, leave out GRPOTrainer's :data:`UNSCORABLE_WARNING`: envkit says the first failed episode
    in one line, logs each step's share as ``envkit/error_rate`` and stops past ``--max-error-rate``. The filter is
    removed when the block ends."""
    trl_logger = logging.getLogger("trl.trainer.grpo_trainer")
    drop = _DropUnscorableWarning()
    trl_logger.addFilter(drop)
    try:
        yield
    finally:
        trl_logger.removeFilter(drop)


def check_flags(args: TrainArguments, config: Any, *, seed_style: bool, cuda: bool) -> None:
    """Refuse, in one line each (:class:`TrainUsageError`), what the sync path cannot run (and make a ``--model``
    folder's path absolute, as the saved LoRA adapter records it): no model, a negative
    ``--eval-tasks``, envkit-only flags or ``--async`` on a seed-style class, TRL modes the rollout cannot serve, vLLM
    missing or ``--vllm-mode server`` without GPUs. Fills ``--eval-tasks``' default (0 for a seed-style class)."""
    if not args.model:
        raise TrainUsageError("--model PATH is required")
    if Path(args.model).expanduser().is_dir():  # the saved adapter names its base model by this path: from anywhere
        args.model = str(Path(args.model).expanduser().resolve())
    check_script_fields(config, args.grpo_fields_given)
    check_async_only_flags(args, config)
    config.resume_from_checkpoint = resolve_checkpoint(config, lora=not args.no_lora)
    if seed_style:
        check_seed_style_flags(args)
    if args.eval_tasks is None:
        args.eval_tasks = 0 if seed_style else DEFAULT_EVAL_TASKS
    elif args.eval_tasks < 0:
        raise TrainUsageError(f"--eval-tasks must be 0 or more, got {args.eval_tasks}")
    if args.eval_tasks == 0 and changed_fields(args, ["eval_samples"]):
        raise TrainUsageError(
            "--eval-samples applies to the held-out eval, and --eval-tasks is 0 (a seed-style class's default): give "
            "--eval-tasks N, or drop --eval-samples"
        )
    check_periodic_eval(args, config, seed_style=seed_style)
    check_push_to_hub(config)  # last: the only check that asks a server
    if args.async_grpo:
        if seed_style:  # before --print-server-command prints a server line for a run that cannot start
            raise TrainUsageError(
                "--async trains envkit envs (the engine plays them); seed-style classes train without it"
            )
        return  # the async path has refusals of its own (check_async_flags)
    if "model_init_kwargs" in args.grpo_fields_given:  # TRL reads it only when it loads the model (--async)
        raise TrainUsageError(
            "--model-init-kwargs is not read without --async: envkit train loads --model itself (fp32) and hands TRL "
            "the loaded model; drop it"
        )
    if not seed_style:  # seed-style classes generate with TRL's own loop, which serves every TRL mode
        check_rollout_config(config)
    if config.use_vllm:
        from envkit.backends.vllm_support import VLLMNotInstalled, patch_cpu_linear, require_vllm

        try:
            require_vllm()
        except VLLMNotInstalled as error:
            raise TrainUsageError(str(error)) from None
        if config.vllm_mode == "colocate":
            patch_cpu_linear()  # before TRL builds the engine: CPU weight sync needs plain linear weights
        elif not cuda:
            raise TrainUsageError(
                "--vllm-mode server needs GPUs: TRL sends the updated weights to the vLLM server over NCCL after every "
                "step, which has no CPU path. On CPU use --vllm-mode colocate; to evaluate against a running vLLM "
                "server use `envkit eval --backend openai --base-url URL`; to train against vLLM servers on CPU use "
                "--async"
            )


def _load(args: TrainArguments) -> tuple[Any, Any]:
    """The model and its tokenizer (left padding, a pad token), after ``--torch-threads``; one line on failure."""
    from envkit.models.loading import ModelLoadError, load_model, load_tokenizer
    from envkit.util.threads import TorchThreadsError, apply_torch_threads

    try:
        apply_torch_threads(args.torch_threads)
    except TorchThreadsError as error:
        raise TrainUsageError(str(error)) from None
    try:
        tokenizer = load_tokenizer(args.model)
        model = load_model(args.model)
    except ModelLoadError as error:
        raise TrainUsageError(str(error)) from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _trainer(
    model: Any, tokenizer: Any, args: TrainArguments, config: Any, trainer_kwargs: dict[str, Any], *, seed_style: bool
) -> Any:
    """TRL's GRPOTrainer with the LoRA config of the flags (none with ``--no-lora``) and the rollout's kwargs."""
    peft_config = None if args.no_lora else lora_config(args)
    from trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=model, args=config, processing_class=tokenizer, peft_config=peft_config, **trainer_kwargs
    )
    if seed_style and "reward_funcs" in trainer_kwargs:
        trainer_kwargs["reward_funcs"][0].trainer = trainer  # type: ignore[attr-defined]
    return trainer


def _save(
    trainer: Any,
    tokenizer: Any,
    args: TrainArguments,
    config: Any,
    summary: dict[str, Any],
    label: str,
    eval_name: str,
    log: Any,
) -> None:
    """OUTPUT_DIR: the model (and ``merged/`` with ``--merge``), ``log_history.json``, ``eval_summary.json`` and
    ``reward_curve.png``; the before/after line."""
    from envkit.adapters.trl.progress import write_reward_curve

    output = Path(config.output_dir)
    trainer.save_model(str(output))
    tokenizer.save_pretrained(str(output))
    (output / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1, default=float))
    if args.merge and not args.no_lora:
        merged = trainer.accelerator.unwrap_model(trainer.model).merge_and_unload()
        merged.save_pretrained(str(output / "merged"))
        tokenizer.save_pretrained(str(output / "merged"))
    if "after" in summary:
        log(heldout_line(eval_name, "after training", summary["after"], before=summary["before"]))
    summary["train_steps"] = trainer.state.global_step
    (output / "eval_summary.json").write_text(json.dumps(summary, indent=2, default=float))
    markers = {k: summary[k]["mean_score"] for k in ("before", "after") if k in summary}
    curve = write_reward_curve(
        trainer.state.log_history, output, **markers, title=f"envkit train {label}", eval_label=eval_name, log=log
    )
    if curve is not None:
        log(f"reward curve: {curve}")


def check_rollout_config(config: Any) -> None:
    """Refuse, before anything heavy is built, what envkit's rollouts cannot do with this GRPOConfig and launch:
    the modes of :func:`envkit.adapters.trl.check_trainer_mode` (read from the config and accelerate's environment),
    the fields only TRL's own generation reads, and unsupported ``generation_kwargs`` / ``chat_template_kwargs``.
    Raises TrainUsageError (one line)."""
    from envkit.adapters.trl import (
        UnsupportedTrainerConfig,
        UnsupportedTrainerMode,
        check_generation_fields,
        check_sharding,
        check_vllm_mode,
        config_sampling,
    )

    plugin = getattr(config, "deepspeed_plugin", None)
    fsdp = bool(getattr(config, "fsdp", None)) or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    try:
        check_sharding(zero_stage=getattr(plugin, "zero_stage", None), fsdp=fsdp)
        check_vllm_mode(config, world_size=int(config.world_size))
        check_generation_fields(config)
        config_sampling(config)
    except UnsupportedTrainerMode as error:  # the modes --async serves: generation on servers, nothing to gather
        raise TrainUsageError(f"{error} (or train with --async: generation on vLLM servers)") from None
    except UnsupportedTrainerConfig as error:
        raise TrainUsageError(str(error)) from None
    if config.chat_template_kwargs is not None and not isinstance(config.chat_template_kwargs, dict):
        raise TrainUsageError(f"--chat-template-kwargs must be a JSON object, got {config.chat_template_kwargs!r:.80}")


def _env_workers(args: TrainArguments) -> Any:
    """``--env-workers`` / ``--ray-address`` as what RolloutEngine's ``env_workers=`` takes; raises TrainUsageError."""
    from envkit.workers import workers_from_flags

    try:
        return workers_from_flags(args.env_workers, args.concurrency, args.ray_address)
    except (ValueError, ImportError) as error:
        raise TrainUsageError(str(error)) from None


def _env_setup(
    factory: Any, args: TrainArguments, config: Any, tokenizer: Any, env_workers: Any = None, log: Any = None
) -> dict[str, Any]:
    """GRPOTrainer's arguments for an envkit env: the env's score as the reward, the training tasks (and, with
    ``--eval-strategy``, the held-out ones TRL evaluates periodically) as datasets, and envkit's rollout."""
    from envkit.adapters.trl import build_dataset, env_score_reward, make_rollout_func

    # No sampling argument: the rollout samples with the trainer's GRPOConfig (where the --rl-* flags land), the same
    # temperature TRL uses to compute the policy's logprobs, even when a GRPOConfig flag overrides an --rl-* one.
    rollout = make_rollout_func(
        factory,
        tokenizer=tokenizer,
        **episode_limits(args),
        max_error_rate=args.max_error_rate,
        env_workers=env_workers,
        log=log,
    )
    kwargs = {
        "reward_funcs": [env_score_reward],
        "train_dataset": build_dataset(factory, range(args.train_tasks)),
        "rollout_func": rollout,
    }
    if config.eval_strategy != "no":  # the held-out tasks, through the same rollout (check_periodic_eval)
        kwargs["eval_dataset"] = build_dataset(factory, eval_seeds(args))
    return kwargs


def verify_vllm_sync(trainer: Any, factory: Any, tokenizer: Any, args: TrainArguments) -> dict[str, Any]:
    """Compare the colocated vLLM engine's logprobs with the trained model's (and with the initial model's).

    Stale weights in vLLM are a silent failure (generation goes on, from the wrong policy): this makes it visible.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from envkit.adapters.trl import trainer_template_kwargs
    from envkit.backends import SamplingParams, VLLMBackend
    from envkit.rollout import RolloutEngine, teacher_forced_logprobs

    trainer.vllm_generation.sync_weights()
    engine = RolloutEngine(
        factory,
        VLLMBackend(trainer.vllm_generation.llm),
        tokenizer,
        max_turns=1,
        step_timeout_s=args.step_timeout,
        generate_timeout_s=args.generate_timeout,
        template_kwargs=trainer_template_kwargs(trainer),
    )
    seeds = list(range(EVAL_SEED_OFFSET, EVAL_SEED_OFFSET + 4))
    episodes = engine.run(seeds, 1, SamplingParams(temperature=1.0, top_k=None, max_new_tokens=8, seed=0))
    trained = trainer.accelerator.unwrap_model(trainer.model).eval()
    initial = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    diffs: dict[str, float] = {"trained": 0.0, "initial": 0.0}
    tokens = 0
    for episode in episodes:
        for name, model in (("trained", trained), ("initial", initial)):
            reference = teacher_forced_logprobs(model, episode)
            for mask, logprob, expected in zip(episode.env_mask, episode.logprobs, reference, strict=True):
                if mask:
                    diffs[name] = max(diffs[name], abs(logprob - expected))
                    tokens += name == "trained"
    return {
        "max_abs_logprob_diff": diffs["trained"],
        "max_abs_logprob_diff_vs_initial": diffs["initial"],
        "tokens": tokens,
        "weights_changed": diffs["initial"] > 2 * diffs["trained"],
        "in_sync": diffs["trained"] < 0.05,
    }


def main(argv: list[str] | None = None) -> int:
    """``envkit train`` entry point; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv or "--help-all" in argv:
        print(help_text(full="--help-all" in argv))
        return 0
    from envkit.adapters.trl import ErrorRateExceeded
    from envkit.chat.render import TemplateError
    from envkit.workers import LeakedThreadsError

    try:
        run(argv)
    except TrainUsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except TemplateError as error:  # the model's chat template cannot serve the env (the message names the fix)
        print(f"\nerror: {error}", file=sys.stderr)
        return 2
    except HeldOutEvalFailed as error:  # not training's failure: the run may have trained and saved its model
        print(f"\nerror: {error}", file=sys.stderr)
        return 1
    except (ErrorRateExceeded, LeakedThreadsError) as error:
        # On a line of its own: the trainer's progress bar is left open mid-line when a step raises.
        print(f"\nerror: training stopped: {error}", file=sys.stderr)
        return 1
    return 0
