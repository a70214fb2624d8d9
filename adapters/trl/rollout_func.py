"""envkit's rollout engine as GRPOTrainer's ``rollout_func`` (:func:`make_rollout_func`) and the trainer's own
generator as a backend (:func:`trainer_backend`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from envkit.adapters.trl.dataset import task_seed_of
from envkit.adapters.trl.metrics import (
    ZERO_VARIANCE_STEPS,
    cannot_learn_message,
    check_error_rate,
    gather_rollout,
    in_training,
    is_main_process,
    log_metrics,
)
from envkit.adapters.trl.modes import check_trainer_mode
from envkit.adapters.trl.rewards import episodes_to_rollout
from envkit.adapters.trl.sampling import config_sampling, step_seed, trainer_sampling, trainer_template_kwargs
from envkit.backends import SamplingParams, TransformersBackend
from envkit.core.env import Env
from envkit.rollout import Episode, RolloutEngine
from envkit.util.text import one_line

logger = logging.getLogger("envkit.adapters.trl")  # the package's name, which users configure

COMPLETION_BUDGET_TURNS = 4
"""Default ``max_completion_tokens``: this many per-turn budgets (``max_completion_length``). With envkit train's
128 tokens per turn that is 512, TRL's own default ``max_completion_length``, the length TRL's memory is sized for."""


def make_rollout_func(
    env_factory: Callable[[], Env],
    *,
    tokenizer: Any = None,
    backend: Any = None,
    max_turns: int | None = None,
    max_episode_tokens: int | None = None,
    max_completion_tokens: int | None = None,
    concurrency: int = 32,
    step_timeout_s: float = 60.0,
    generate_timeout_s: float | None = 1800.0,
    sampling: SamplingParams | None = None,
    template_kwargs: dict[str, Any] | None = None,
    on_episodes: Callable[[list[Episode]], None] | None = None,
    max_error_rate: float | None = 0.5,
    env_workers: Any = None,
    log: Callable[[str], Any] | None = None,
) -> Callable[[list[Any], Any], dict[str, list]]:
    """A ``rollout_func`` for ``GRPOTrainer`` that runs envkit's rollout engine on the prompts TRL hands it.

    Args:
        env_factory: Builds a fresh env per episode.
        tokenizer: Defaults to the trainer's processing class.
        backend: Generation backend; by default the trainer's own: its in-process vLLM engine when
            ``use_vllm`` (colocate), else the policy model being trained (TransformersBackend, eval mode, no grad).
        max_turns, max_episode_tokens, concurrency, step_timeout_s, generate_timeout_s: See
            :class:`envkit.rollout.RolloutEngine`.
        max_completion_tokens: Cap on one episode's completion tokens (model and env tokens after the prompt): the
            sequence TRL back-propagates through, so what bounds its memory. Default: :data:`COMPLETION_BUDGET_TURNS`
            × the per-turn budget (``sampling.max_new_tokens``, else the trainer's ``max_completion_length``).
        sampling: Defaults to :func:`trainer_sampling` (the trainer's GRPOConfig; ``max_completion_length`` is the
            budget of one assistant turn). Its ``seed``, when set, is the base of the per-step seeds; ``None`` samples
            without seeds.
        template_kwargs: Chat-template variables; default: the trainer's ``chat_template_kwargs``.
        on_episodes: Called with each batch of finished episodes (logging, saving).
        max_error_rate: Stop training (:class:`ErrorRateExceeded`) when more than this fraction of one call's
            episodes failed; ``None`` never stops. Failed episodes never reach the loss either way
            (:func:`episodes_to_rollout`); their share is logged as ``envkit/error_rate``.
        env_workers: Where envs live: ``"threads"`` (default), ``"processes"``, ``"ray"`` or an
            :class:`envkit.workers.EnvWorkers` (see :class:`envkit.rollout.RolloutEngine`; out-of-process kinds need a
            picklable ``env_factory``, e.g. :class:`envkit.workers.EnvFactory`).
        log: Where the main process writes its one-line warnings (the first failed episode; every group scored
            equally for :data:`ZERO_VARIANCE_STEPS` training rollouts in a row); default: this module's logger, at
            WARNING.

    TRL passes each prompt once per generation (a group is ``num_generations`` consecutive copies); exactly one
    episode is returned per prompt, in order. Episodes of consecutive identical prompts form one group. On its first
    call with a trainer it refuses modes it cannot serve (:func:`check_trainer_mode`) and unsupported
    ``generation_kwargs`` with :class:`UnsupportedTrainerConfig`, before generating anything.
    """

    engines: dict[int, RolloutEngine] = {}  # one engine per trainer, built on first use and kept across steps
    # (global step, rollout calls at it) per trainer and mode (training, evaluation): two calls at one step differ,
    # and the count starts again at each step, so a run resumed from a checkpoint samples what the uncut run sampled.
    calls: dict[tuple[int, bool], tuple[int, int]] = {}
    ends: dict[int, int] = {}  # the chat template's end-of-turn token id, per trainer
    flat: dict[int, int] = {}  # training rollouts in a row in which every group scored equally, per trainer
    said: set[int] = set()  # trainers whose first failed episode was said

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
        engine = engines.get(id(trainer))
        if engine is None:
            check_trainer_mode(trainer)
            per_turn = (sampling or config_sampling(trainer.args)).max_new_tokens
            engine = engines[id(trainer)] = RolloutEngine(
                env_factory,
                backend if backend is not None else trainer_backend(trainer),
                tokenizer if tokenizer is not None else _tokenizer_of(trainer),
                max_turns=max_turns,
                max_episode_tokens=max_episode_tokens,
                max_completion_tokens=(
                    max_completion_tokens if max_completion_tokens is not None else COMPLETION_BUDGET_TURNS * per_turn
                ),
                concurrency=concurrency,
                step_timeout_s=step_timeout_s,
                generate_timeout_s=generate_timeout_s,
                template_kwargs=template_kwargs if template_kwargs is not None else trainer_template_kwargs(trainer),
                env_workers=env_workers,
            )
            ends[id(trainer)] = recognise_end_of_turn(trainer, engine.renderer_for(None).end_of_turn_id)
        seeds = [task_seed_of(p) for p in prompts]
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)  # fixed for the whole rollout
        training = in_training(trainer)
        key = (id(trainer), training)
        last_step, last_call = calls.get(key, (step, -1))
        call = last_call + 1 if last_step == step else 0
        calls[key] = (step, call)
        if sampling is None:
            step_sampling = trainer_sampling(trainer, call=call)
        elif sampling.seed is not None:
            step_sampling = dataclasses.replace(sampling, seed=step_seed(sampling.seed, trainer, call))
        else:
            step_sampling = sampling
        episodes = _run_in_order(engine, seeds, step_sampling)
        if on_episodes is not None:
            on_episodes(episodes)
        # Every process's episodes and leaked threads: each process calls this once per rollout.
        everyone, leaked = gather_rollout(trainer, episodes, engine.leaked_threads)
        zero_variance = log_metrics(trainer, everyone)
        metrics = getattr(trainer, "_metrics", None)
        if metrics is not None:
            metrics["train" if training else "eval"]["envkit/leaked_threads"].append(float(leaked))
        if training:
            flat[id(trainer)] = flat.get(id(trainer), 0) + 1 if zero_variance == 1.0 else 0
            if flat[id(trainer)] == ZERO_VARIANCE_STEPS and is_main_process(trainer):
                (log or logger.warning)(cannot_learn_message(everyone, step))
        failed = next((e for e in everyone if e.error is not None), None)
        if failed is not None and id(trainer) not in said and is_main_process(trainer):
            said.add(id(trainer))
            (log or logger.warning)(
                f"an episode failed at step {step} (task seed {failed.task_seed}: "
                f"{one_line(failed.error, 300)}): a failed episode is left out of the loss and counted "
                "in envkit/error_rate (the progress bar's 'failed'); this is said once"
            )
        check_error_rate(everyone, max_error_rate, step=step)  # on every process alike: all stop, or none
        return episodes_to_rollout(
            episodes, engine.tokenizer, end_of_turn_id=ends[id(trainer)], max_new_tokens=step_sampling.max_new_tokens
        )

    return rollout_func


def recognise_end_of_turn(trainer: Any, end_of_turn_id: int) -> int:
    """Add the chat template's end-of-turn token to the trainer's eos ids (``trainer.eos_token_ids``), which TRL reads
    to tell a finished completion from a cut one (``mask_truncated_completions``, ``completions/clipped_ratio``).

    TRL's list holds the tokenizer's and the model's eos; a base model's (Qwen2.5 base: ``<|endoftext|>``) is not the
    token its chat template closes turns with (``<|im_end|>``), so without this every finished episode would look
    truncated: all masked out of the loss with ``mask_truncated_completions=True``, a clipped ratio of 1.0 without.
    Returns ``end_of_turn_id``.
    """
    eos = getattr(trainer, "eos_token_ids", None)
    if eos is not None and end_of_turn_id not in eos:
        trainer.eos_token_ids = [*eos, end_of_turn_id]
    return end_of_turn_id


def _run_in_order(engine: RolloutEngine, seeds: list[int], sampling: SamplingParams) -> list[Episode]:
    """Run one episode per seed and keep the input order: runs of equal consecutive seeds are groups, and all groups
    run at once in one engine call, also when they differ in size (a process's share of a group split across
    processes)."""
    runs: list[tuple[int, int]] = []  # (seed, count) of consecutive equal seeds
    for seed in seeds:
        if runs and runs[-1][0] == seed:
            runs[-1] = (seed, runs[-1][1] + 1)
        else:
            runs.append((seed, 1))
    return engine.run([seed for seed, _ in runs], [count for _, count in runs], sampling)


def trainer_backend(trainer: Any) -> Any:
    """The trainer's own generator: its colocated vLLM engine, or the policy model being trained."""
    tokenizer = _tokenizer_of(trainer)
    eos = list(getattr(trainer, "eos_token_ids", None) or []) or None
    if getattr(trainer, "use_vllm", False):
        from envkit.backends import VLLMBackend

        generation = getattr(trainer, "vllm_generation", None)
        llm = getattr(generation, "llm", None)
        if llm is not None:
            return VLLMBackend(llm)
        from envkit.adapters.trl.vllm_client import trl_server_backend

        return trl_server_backend(trainer, eos or [tokenizer.eos_token_id])
    model = trainer.accelerator.unwrap_model(trainer.model)
    return TransformersBackend(model, tokenizer, stop_token_ids=eos)


def _tokenizer_of(trainer: Any) -> Any:
    processing = trainer.processing_class
    return getattr(processing, "tokenizer", processing)
