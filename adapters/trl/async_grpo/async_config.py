"""What ``envkit train --async`` takes from envkit train's ``GRPOConfig``: derived from the two dataclasses, not
hand-picked, so a flag either reaches TRL's ``AsyncGRPOConfig`` or is refused, never dropped.

* **Copied**: every field ``GRPOConfig`` and ``AsyncGRPOConfig`` share (``dataclasses.fields`` of both), so the
  schedule (``--lr-scheduler-type``, ``--warmup-steps``), the optimizer (``--weight-decay``, ``--max-grad-norm``), the
  clipping (``--epsilon``, ``--epsilon-high``), logging and saving are the synchronous run's. The exceptions are
  :data:`SET_BY_ENVKIT` (the first server's URL, the epochs as optimizer steps) and, without CUDA only,
  :data:`CPU_OFF` (``bf16``, activation checkpointing).
* **Refused** (:func:`refused_flags`, one line at start-up, before a server starts): a field the user set, on the
  command line or in ``--config``, to a value other than the default the run uses, when it is a ``GRPOConfig``-only
  field (the difference of the two dataclasses, minus :data:`ENVKIT_HONOURS`, the fields envkit applies itself) or a
  shared field only TRL's own rollout worker reads (:data:`TRL_WORKER_ONLY`: envkit's engine replaces that worker).
  ``--loss-type``, ``--num-iterations``, ``--scale-rewards``, ``--mask-truncated-completions``, … have no async
  counterpart: AsyncGRPO's loss is the clipped token-level objective with group-normalised advantages.
* **β**: AsyncGRPO has no KL term and no reference model. ``--async``'s default β is therefore 0 (the synchronous
  default is 0.1), and a non-zero β given with ``--async`` is refused like any other field it cannot honour.

A TRL release that adds a field to either dataclass changes these sets; ``tests/test_async_config.py`` diffs them
against a checked-in expectation so the change is reviewed, not silently copied or refused.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

ENVKIT_HONOURS: dict[str, str] = {
    "generation_kwargs": "envkit's sampling applies it to every turn (envkit.adapters.trl.config_sampling)",
}
"""``GRPOConfig``-only fields envkit applies itself under ``--async`` (never refused), and where."""

TRL_WORKER_ONLY: dict[str, str] = {
    "max_tool_calling_iterations": "use --max-turns",
    "log_completions": "envkit logs envkit/* metrics per group",
    "num_completions_to_print": "envkit logs envkit/* metrics per group",
    "vllm_server_timeout": "envkit waits for the servers it starts itself",
}
"""Shared fields only TRL's own rollout worker (or its vLLM client) reads; envkit's engine replaces both, so a value
set here would do nothing: refused when set, with what to use instead."""

SET_BY_ENVKIT: tuple[str, ...] = ("vllm_server_base_url", "max_steps", "ignore_data_skip")
"""Shared fields envkit sets for the async run instead of copying: the first server's URL (TRL's client only reads
the model length from it), ``max_steps`` (the epochs as optimizer steps when not given, see :func:`async_config`),
``ignore_data_skip`` (TRL forces it on: a live rollout queue cannot be skipped and replayed)."""

CPU_OFF: tuple[str, ...] = ("bf16", "fp16", "activation_checkpointing", "gradient_checkpointing")
"""Shared fields forced off without CUDA (TRL's CPU path trains in fp32 without checkpointing); copied on CUDA."""

REASONS: dict[str, str] = {
    "beta": "AsyncGRPO has no KL term: --async trains with beta 0",
}
"""Why a refused field cannot be honoured, where the generic reason ("no such AsyncGRPO setting") says too little."""


def _init_fields(cls: type) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls) if f.init}


def _default(field: dataclasses.Field) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def config_classes() -> tuple[type, type]:
    """``(GRPOConfig, AsyncGRPOConfig)`` of the installed TRL."""
    from trl import GRPOConfig
    from trl.experimental.async_grpo import AsyncGRPOConfig

    return GRPOConfig, AsyncGRPOConfig


def shared_fields() -> set[str]:
    """The fields both configs take (copied, but for :data:`SET_BY_ENVKIT` and, without CUDA, :data:`CPU_OFF`)."""
    grpo, async_ = config_classes()
    return set(_init_fields(grpo)) & set(_init_fields(async_))


def grpo_only_fields() -> set[str]:
    """``GRPOConfig`` fields ``AsyncGRPOConfig`` lacks."""
    grpo, async_ = config_classes()
    return set(_init_fields(grpo)) - set(_init_fields(async_))


def unhonoured_fields() -> set[str]:
    """The fields ``--async`` refuses when set: :func:`grpo_only_fields` but :data:`ENVKIT_HONOURS`, and
    :data:`TRL_WORKER_ONLY`."""
    return (grpo_only_fields() - set(ENVKIT_HONOURS)) | set(TRL_WORKER_ONLY)


def refused_flags(args: Any, config: Any) -> list[str]:
    """The fields of ``config`` (a ``GRPOConfig``) that ``--async`` cannot honour and the user set to a non-default
    value, each as ``--flag value (why)``, sorted.

    Args:
        args: envkit's ``TrainArguments``; ``grpo_fields_given`` names the fields the command line or ``--config``
            set (a ``--rl-*`` flag sets its twin); the default a value is compared with is envkit's for an
            ``--async`` run (:func:`envkit.adapters.trl.config.envkit_defaults`), else TRL's.
        config: The parsed ``GRPOConfig``.

    Returns:
        One entry per refused field; empty when ``--async`` honours everything that was set.
    """
    from envkit.adapters.trl.config import TrainArguments, envkit_defaults

    grpo, _ = config_classes()
    fields = _init_fields(grpo)
    # envkit's defaults with none of the --rl-* twins set: a twin's value is the user's, not a default
    defaults = envkit_defaults(TrainArguments(async_grpo=True, vllm_server_url=args.vllm_server_url))
    given = set(getattr(args, "grpo_fields_given", ()))
    refused = []
    for name in sorted(unhonoured_fields() & given):
        value = getattr(config, name)
        default = defaults.get(name, _default(fields[name]))
        if value == default:
            continue
        why = REASONS.get(name) or TRL_WORKER_ONLY.get(name) or "no such AsyncGRPO setting"
        refused.append(f"--{name.replace('_', '-')} {value} ({why})")
    return refused


def async_config(
    config: Any,
    *,
    server_url: str,
    max_staleness: int,
    cuda: bool,
    train_tasks: int,
    world_size: int,
) -> Any:
    """The ``AsyncGRPOConfig`` of an ``envkit train --async`` run (see the module).

    Args:
        config: The run's ``GRPOConfig``; every shared field is copied from it.
        server_url: A vLLM server of the run (``vllm_server_base_url``).
        max_staleness: ``--max-staleness``.
        cuda: Whether training runs on CUDA; without it :data:`CPU_OFF` are forced off and ``use_cpu`` on.
        train_tasks: ``--train-tasks``: an epoch is this many groups of ``num_generations`` episodes.
        world_size: Training processes.

    Returns:
        The ``AsyncGRPOConfig``. ``max_steps``: ``config.max_steps`` when positive; else ``num_train_epochs`` epochs
        as optimizer steps, ``ceil(epochs × train_tasks × num_generations / samples per step)`` (envkit's rollout
        worker makes one sample per episode), so a decaying ``--lr-scheduler-type`` decays over the run as in the
        synchronous trainer instead of over TRL's 32-rows-per-conversation safety ceiling.
    """
    _, async_cls = config_classes()
    values = {name: getattr(config, name) for name in shared_fields() - set(SET_BY_ENVKIT)}
    if not cuda:
        values.update({name: False for name in CPU_OFF if name in values}, use_cpu=True)
    steps = int(config.max_steps)
    if steps <= 0:
        per_step = int(config.per_device_train_batch_size) * int(config.gradient_accumulation_steps) * world_size
        samples = float(config.num_train_epochs) * train_tasks * int(config.num_generations)
        steps = max(1, math.ceil(samples / per_step))
    values.update(vllm_server_base_url=server_url, max_staleness=max_staleness, max_steps=steps)
    return async_cls(**values)
