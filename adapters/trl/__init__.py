"""Bridges to TRL's GRPOTrainer: envkit's rollout engine as a ``rollout_func``, and envs as an ``environment_factory``.

The rollout path (recommended) hands whole multi-turn episodes to GRPO::

    dataset = build_dataset(env_factory, seeds=range(512))
    trainer = GRPOTrainer(model, reward_funcs=env_score_reward, train_dataset=dataset, args=config,
                          rollout_func=make_rollout_func(env_factory, tokenizer=tokenizer))

``rollout_func`` returns ``prompt_ids``, ``completion_ids``, ``logprobs`` and ``env_mask`` (1 = model token, 0 = env
token, so GRPO's loss only sees what the model generated), plus per-episode fields that reach reward functions as
keyword arguments: ``envkit_messages`` (the episode's whole transcript: TRL's own ``completions`` is its parse of the
multi-turn token stream, every turn merged into one message), ``envkit_score``, ``envkit_turns``,
``envkit_tool_calls``, ``envkit_tool_errors``, ``envkit_truncated``, ``envkit_error``. A trainer also given
``tools``/``environment_factory`` is refused on the first rollout: TRL would run its own tool loop and ignore env_mask.

TRL tells finished completions from cut ones by their last token (``mask_truncated_completions``,
``completions/clipped_ratio``), against its own eos ids. The rollout adds the chat template's end-of-turn token to
them (a base model's eos, e.g. Qwen2.5's ``<|endoftext|>``, is not the ``<|im_end|>`` that closes its turns) and ends
every episode whose last turn finished on it: an episode looks truncated to TRL exactly when its last turn was cut
(at ``max_completion_length`` or the episode's token budget).

``envkit/*`` metrics are over every process's episodes of a step (gathered), as TRL's own are;
``envkit/leaked_threads`` is the number of timed-out env calls still running on abandoned threads, summed over the
processes (:attr:`envkit.rollout.RolloutEngine.leaked_threads`).
``envkit/zero_variance_groups`` is the fraction of a step's groups whose episodes all scored the same (no advantage,
no gradient from the score); after :data:`ZERO_VARIANCE_STEPS` training rollouts in a row where every group did, one
line says that training cannot learn and what to change.

:func:`to_environment_factory` instead exports a :class:`envkit.ToolEnv` for TRL's own tool loop. That loop can only
express tool calls: turns without tool calls end the episode, so ``on_text`` (a simulated user) never runs, and
``max_turns`` is TRL's ``max_tool_calling_iterations``.

What the rollout takes from the trainer's GRPOConfig: ``temperature``, ``top_p``, ``top_k``, ``min_p`` and
``repetition_penalty`` (every backend applies them and records processed logprobs), ``max_completion_length`` as the
token budget of *one assistant turn*, ``chat_template_kwargs`` (e.g. Qwen3's ``enable_thinking``) as the chat
template's variables, the stop keys of ``generation_kwargs`` (any other key is refused), and ``seed`` (one sampling
seed per step is derived from it). The whole episode's completion (model and env tokens after the prompt, which TRL
back-propagates through) is bounded by ``max_completion_tokens``, by default :data:`COMPLETION_BUDGET_TURNS` turns'
worth. TRL modes the rollout cannot serve are refused with :class:`UnsupportedTrainerMode` on the first call, and
fields only TRL's own generation reads (:data:`TRL_GENERATION_ONLY`) with :class:`UnsupportedTrainerConfig`: see
:func:`check_trainer_mode`.

The package, by job: :mod:`~envkit.adapters.trl.rollout_func` (the ``rollout_func`` and the trainer's backend),
:mod:`~envkit.adapters.trl.dataset` (task seeds as a dataset), :mod:`~envkit.adapters.trl.sampling` (GRPOConfig to
sampling), :mod:`~envkit.adapters.trl.modes` (refused TRL modes), :mod:`~envkit.adapters.trl.rewards` (episodes as
TRL's rollout dict, reward functions), :mod:`~envkit.adapters.trl.metrics` (``envkit/*`` metrics, error-rate stop) and
:mod:`~envkit.adapters.trl.environment_factory`; every public name imports from here.
"""

from __future__ import annotations

from envkit.adapters.trl.advantages import group_advantages
from envkit.adapters.trl.dataset import (
    SEED_KEY,
    build_dataset,
    task_seed_of,
)
from envkit.adapters.trl.environment_factory import (
    to_environment_factory,
)
from envkit.adapters.trl.metrics import (
    ZERO_VARIANCE_STEPS,
    ErrorRateExceeded,
    cannot_learn_message,
    check_error_rate,
    gather_episodes,
    log_metrics,
    zero_variance_groups,
)
from envkit.adapters.trl.modes import (
    TRL_GENERATION_ONLY,
    UnsupportedTrainerMode,
    check_generation_fields,
    check_sharding,
    check_trainer_mode,
    check_vllm_mode,
)
from envkit.adapters.trl.rewards import (
    env_score_reward,
    episodes_to_rollout,
    make_reward_funcs,
)
from envkit.adapters.trl.rollout_func import (
    COMPLETION_BUDGET_TURNS,
    logger,
    make_rollout_func,
    recognise_end_of_turn,
    trainer_backend,
)
from envkit.adapters.trl.sampling import (
    UnsupportedTrainerConfig,
    config_sampling,
    trainer_sampling,
    trainer_template_kwargs,
)

__all__ = [
    "COMPLETION_BUDGET_TURNS",
    "SEED_KEY",
    "TRL_GENERATION_ONLY",
    "ZERO_VARIANCE_STEPS",
    "ErrorRateExceeded",
    "UnsupportedTrainerConfig",
    "UnsupportedTrainerMode",
    "build_dataset",
    "cannot_learn_message",
    "check_error_rate",
    "check_generation_fields",
    "check_sharding",
    "check_trainer_mode",
    "check_vllm_mode",
    "config_sampling",
    "env_score_reward",
    "episodes_to_rollout",
    "gather_episodes",
    "group_advantages",
    "log_metrics",
    "logger",
    "make_reward_funcs",
    "make_rollout_func",
    "recognise_end_of_turn",
    "task_seed_of",
    "to_environment_factory",
    "trainer_backend",
    "trainer_sampling",
    "trainer_template_kwargs",
    "zero_variance_groups",
]
