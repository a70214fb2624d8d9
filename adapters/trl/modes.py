"""The TRL modes and settings envkit's ``rollout_func`` cannot serve (sharded weights, some vLLM modes, the fields
only TRL's own generation reads), refused up front."""

from __future__ import annotations

from typing import Any

from envkit.adapters.trl.sampling import UnsupportedTrainerConfig

GENERATION_METHODS = ("_generate_single_turn", "_tool_call_loop", "_get_tool_suffix_ids", "_tokenize_prompts")
"""The GRPOTrainer methods a ``rollout_func`` replaces: TRL's own tokenizing, generating and tool loop."""

TRL_GENERATION_ONLY: dict[str, str] = {
    "max_tool_calling_iterations": "use --max-turns (max_turns=): assistant turns per episode",
    "use_transformers_continuous_batching": "envkit's engine batches concurrent episodes itself (--concurrency)",
    "transformers_continuous_batching_config": "envkit's engine batches concurrent episodes itself (--concurrency)",
    "cache_implementation": "envkit's backends keep their own KV cache",
    "ds3_gather_for_generation": "it applies to DeepSpeed ZeRO-3, which envkit's rollouts refuse",
    "vllm_structured_outputs_regex": "envkit's rollouts do not constrain decoding; have the env answer a reply "
    "that breaks the format with an error message (ToolEnv does for a tool call that does not parse)",
}
"""GRPOConfig fields only TRL's own generation (:data:`GENERATION_METHODS`, and the generation config its
``__init__`` builds for them) reads. envkit's ``rollout_func`` replaces that generation, so a value other than the
default would do nothing: :func:`check_generation_fields` refuses it, with what to use instead.
``tests/test_trl_modes.py`` reads GRPOTrainer's source for the fields those methods read, and for those its
``__init__`` hands TRL's vLLM generation, so a TRL release that adds one fails CI until it is listed here (or among
the vLLM settings envkit's backends use through TRL's engine or client)."""


def check_generation_fields(args: Any) -> None:
    """Refuse (:class:`UnsupportedTrainerConfig`) a :data:`TRL_GENERATION_ONLY` field set to other than its default."""
    import dataclasses

    defaults = {f.name: f.default for f in dataclasses.fields(type(args)) if f.name in TRL_GENERATION_ONLY}
    for name, default in defaults.items():
        value = getattr(args, name)
        if value != default:
            raise UnsupportedTrainerConfig(
                f"{name}={value!r:.60} is not used by envkit's rollouts (only TRL's own generation reads it): "
                f"{TRL_GENERATION_ONLY[name]}"
            )


class UnsupportedTrainerMode(UnsupportedTrainerConfig):
    """A TRL parallelism or vLLM mode that envkit's ``rollout_func`` cannot serve (see :func:`check_trainer_mode`)."""


def check_sharding(*, zero_stage: int | None, fsdp: bool) -> None:
    """Refuse DeepSpeed ZeRO-3 and FSDP (:class:`UnsupportedTrainerMode`).

    Both shard the policy's weights. envkit generates with the unwrapped model (not TRL's
    ``unwrap_model_for_generation``), and each rank generates a data-dependent number of times (episodes end at
    different turns), so the ranks' parameter gathers would not line up: a deadlock, not an error.
    """
    if zero_stage == 3:
        raise UnsupportedTrainerMode(
            "DeepSpeed ZeRO-3 is not supported by envkit's rollouts (it shards the weights envkit generates with, and "
            "ranks generate a data-dependent number of times, so its gathers deadlock): use ZeRO-2 (or ZeRO-1) or DDP"
        )
    if fsdp:
        raise UnsupportedTrainerMode(
            "FSDP is not supported by envkit's rollouts (it shards the weights envkit generates with, and ranks "
            "generate a data-dependent number of times, so its gathers deadlock): use DDP or DeepSpeed ZeRO-2"
        )


def check_vllm_mode(args: Any, *, world_size: int) -> None:
    """Refuse the vLLM settings envkit's rollouts cannot serve (:class:`UnsupportedTrainerMode`).

    * Server mode with more than one training process: TRL creates its ``vllm_client`` on rank 0 only and gathers
      every rank's prompts for one call; envkit's ranks generate independently, a data-dependent number of times.
    * Colocate with ``vllm_tensor_parallel_size > 1``: TRL all-gathers prompts across the TP group on every
      generate call, so the ranks of a group must call generate equally often with the group's prompts.
    * ``vllm_enable_sleep_mode``: TRL wakes only the weights before a ``rollout_func`` and leaves the KV cache asleep.
    """
    if not getattr(args, "use_vllm", False):
        return
    mode = getattr(args, "vllm_mode", "colocate")
    if mode == "server" and world_size > 1:
        raise UnsupportedTrainerMode(
            f"vLLM server mode with {world_size} training processes is not supported by envkit's rollouts (TRL's "
            "vLLM client exists on the main process only): use server mode with one training process, or colocate "
            "mode (one vLLM engine per process)"
        )
    tensor_parallel = int(getattr(args, "vllm_tensor_parallel_size", 1) or 1)
    if mode == "colocate" and tensor_parallel > 1:
        raise UnsupportedTrainerMode(
            f"colocated vLLM with vllm_tensor_parallel_size={tensor_parallel} is not supported by envkit's rollouts "
            "(TRL gathers prompts across the tensor-parallel group, which needs every rank to generate in lockstep): "
            "use vllm_tensor_parallel_size 1, or a tensor-parallel vLLM server (server mode, one training process)"
        )
    if getattr(args, "vllm_enable_sleep_mode", False):
        raise UnsupportedTrainerMode(
            "vllm_enable_sleep_mode is not supported by envkit's rollouts (TRL wakes only vLLM's weights before a "
            "rollout_func, its KV cache stays asleep): turn sleep mode off and lower vllm_gpu_memory_utilization "
            "to leave room for training"
        )


def check_trainer_mode(trainer: Any) -> None:
    """Raise :class:`UnsupportedTrainerMode` if the trainer runs in a mode envkit's ``rollout_func`` cannot serve:
    DeepSpeed ZeRO-3 or FSDP (:func:`check_sharding`), vLLM server mode with several processes, colocated vLLM with
    tensor parallelism, or vLLM sleep mode (:func:`check_vllm_mode`); :class:`UnsupportedTrainerConfig` for a field
    only TRL's own generation reads (:func:`check_generation_fields`) and for TRL's own tool loop
    (:func:`check_own_tool_loop`). Read from the trainer's accelerator and args."""
    accelerator = trainer.accelerator
    zero_stage = None
    if getattr(trainer, "is_deepspeed_enabled", False):
        plugin = getattr(accelerator.state, "deepspeed_plugin", None)
        zero_stage = getattr(plugin, "zero_stage", None)
    check_sharding(zero_stage=zero_stage, fsdp=bool(getattr(trainer, "is_fsdp_enabled", False)))
    check_vllm_mode(trainer.args, world_size=int(accelerator.num_processes))
    check_generation_fields(trainer.args)
    check_own_tool_loop(trainer)


OWN_TOOL_LOOP = {"tools": "tools", "environment_factories": "environment_factory"}
"""GRPOTrainer's attributes that turn on its own tool loop, and the constructor arguments that set them."""


def check_own_tool_loop(trainer: Any) -> None:
    """Refuse (:class:`UnsupportedTrainerConfig`) a trainer given ``tools=`` or ``environment_factory=`` beside
    envkit's ``rollout_func``: TRL then runs its own tool loop on envkit's finished episodes and builds its own mask,
    ignoring envkit's ``env_mask``, so the env's tokens would be trained on as the model's."""
    given = [argument for attribute, argument in OWN_TOOL_LOOP.items() if getattr(trainer, attribute, None)]
    if given:
        arguments = ", ".join(f"{argument}=" for argument in given)
        raise UnsupportedTrainerConfig(
            f"GRPOTrainer({arguments}...) runs TRL's own tool loop, which ignores envkit's env_mask (the env's tokens "
            "would train as the model's): drop it; envkit's rollout_func plays the env's tools itself"
        )
