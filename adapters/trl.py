"""Bridges to TRL's GRPOTrainer: envkit's rollout engine as a ``rollout_func``, and envs as an ``environment_factory``.

The rollout path (recommended) hands whole multi-turn episodes to GRPO::

    dataset = build_dataset(env_factory, seeds=range(512))
    trainer = GRPOTrainer(model, reward_funcs=env_score_reward, train_dataset=dataset, args=config,
                          rollout_func=make_rollout_func(env_factory, tokenizer=tokenizer))

``rollout_func`` returns ``prompt_ids``, ``completion_ids``, ``logprobs`` and ``env_mask`` (1 = model token, 0 = env
token, so GRPO's loss only sees what the model generated), plus per-episode fields that reach reward functions as
keyword arguments: ``envkit_score``, ``envkit_turns``, ``envkit_tool_calls``, ``envkit_tool_errors``,
``envkit_truncated``, ``envkit_error``. Do not also pass ``tools``/``environment_factory``: TRL then ignores env_mask.

:func:`to_environment_factory` instead exports a :class:`envkit.ToolEnv` for TRL's own tool loop. That loop can only
express tool calls: turns without tool calls end the episode, so ``on_text`` (a simulated user) never runs, and
``max_turns`` is TRL's ``max_tool_calling_iterations``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable
from typing import Any

from envkit.backends import SamplingParams, TransformersBackend
from envkit.core import Env
from envkit.rollout import Episode, RolloutEngine, summarize

SEED_KEY = "envkit_task_seed"
"""Key carried by the first prompt message of :func:`build_dataset` rows: the task seed of the row."""


def build_dataset(env_factory: Callable[[], Env], seeds: Iterable[int]) -> Any:
    """A GRPO dataset: one row per task seed with a conversational ``prompt`` (the env's opening messages) and
    ``task_seed``. GRPOTrainer repeats each row ``num_generations`` times, so every group is one task.

    The seed also rides on the first prompt message (``envkit_task_seed``, ignored by chat templates), because a
    ``rollout_func`` receives only the prompts.
    """
    from datasets import Dataset

    env = env_factory()
    prompts, task_seeds = [], []
    for seed in seeds:
        opening, _ = env.reset(seed=int(seed))
        messages = [{"role": m["role"], "content": m["content"], SEED_KEY: None} for m in opening]
        messages[0][SEED_KEY] = int(seed)
        prompts.append(messages)
        task_seeds.append(int(seed))
    return Dataset.from_dict({"prompt": prompts, "task_seed": task_seeds})


def task_seed_of(prompt: Any) -> int:
    """The task seed a :func:`build_dataset` prompt carries."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict) and prompt[0].get(SEED_KEY) is not None:
        return int(prompt[0][SEED_KEY])
    raise ValueError(
        "this prompt carries no task seed: build the training dataset with envkit.adapters.trl.build_dataset"
    )


def make_rollout_func(
    env_factory: Callable[[], Env],
    *,
    tokenizer: Any = None,
    backend: Any = None,
    max_turns: int | None = None,
    max_episode_tokens: int | None = None,
    concurrency: int = 32,
    step_timeout_s: float = 60.0,
    sampling: SamplingParams | None = None,
    on_episodes: Callable[[list[Episode]], None] | None = None,
) -> Callable[[list[Any], Any], dict[str, list]]:
    """A ``rollout_func`` for ``GRPOTrainer`` that runs envkit's rollout engine on the prompts TRL hands it.

    Args:
        env_factory: Builds a fresh env per episode.
        tokenizer: Defaults to the trainer's processing class.
        backend: Generation backend; by default the trainer's own: its in-process vLLM engine when
            ``use_vllm`` (colocate), else the policy model being trained (TransformersBackend, eval mode, no grad).
        max_turns, max_episode_tokens, concurrency, step_timeout_s: See :class:`envkit.rollout.RolloutEngine`.
        sampling: Defaults to the trainer's ``temperature``, ``top_p``, ``top_k`` and ``max_completion_length``
            (as tokens per turn).
        on_episodes: Called with each batch of finished episodes (logging, saving).

    TRL passes each prompt once per generation (a group is ``num_generations`` consecutive copies); exactly one
    episode is returned per prompt, in order. Episodes of consecutive identical prompts form one group.
    """

    engines: dict[int, RolloutEngine] = {}  # one engine per trainer, built on first use and kept across steps

    def rollout_func(prompts: list[Any], trainer: Any) -> dict[str, list]:
        seeds = [task_seed_of(p) for p in prompts]
        engine = engines.get(id(trainer))
        if engine is None:
            engine = engines[id(trainer)] = RolloutEngine(
                env_factory,
                backend if backend is not None else trainer_backend(trainer),
                tokenizer if tokenizer is not None else _tokenizer_of(trainer),
                max_turns=max_turns,
                max_episode_tokens=max_episode_tokens,
                concurrency=concurrency,
                step_timeout_s=step_timeout_s,
            )
        episodes = _run_in_order(engine, seeds, sampling or trainer_sampling(trainer))
        if on_episodes is not None:
            on_episodes(episodes)
        log_metrics(trainer, episodes)
        return episodes_to_rollout(episodes, engine.tokenizer)

    return rollout_func


def _run_in_order(engine: RolloutEngine, seeds: list[int], sampling: SamplingParams) -> list[Episode]:
    """Run one episode per seed (runs of equal seeds share one engine call, as groups) and keep the input order."""
    runs: list[tuple[int, int]] = []  # (seed, count) of consecutive equal seeds
    for seed in seeds:
        if runs and runs[-1][0] == seed:
            runs[-1] = (seed, runs[-1][1] + 1)
        else:
            runs.append((seed, 1))
    if len({count for _, count in runs}) == 1:  # the usual case: equal groups, one engine call
        return engine.run([seed for seed, _ in runs], runs[0][1], sampling)
    episodes: list[Episode] = []
    for seed, count in runs:
        episodes += engine.run([seed], count, sampling)
    return episodes


def episodes_to_rollout(episodes: list[Episode], tokenizer: Any) -> dict[str, list]:
    """TRL's rollout dict: token lists, flat logprobs, env_mask, and per-episode fields for reward functions."""
    completion_ids, env_mask, logprobs = [], [], []
    for episode in episodes:
        ids, mask, lps = list(episode.completion_ids), list(episode.env_mask), list(episode.logprobs)
        # Env tokens after the model's last token carry no gradient (masked, and causal attention means they affect
        # nothing before them): drop them, so a finished episode ends at the model's end-of-turn token and TRL's
        # `mask_truncated_completions` sees exactly the episodes whose last turn was cut.
        while mask and mask[-1] == 0:
            ids.pop(), mask.pop(), lps.pop()
        if not ids:  # the prompt alone filled the budget: one masked token keeps TRL's shapes valid
            ids, mask, lps = [tokenizer.eos_token_id], [0], [0.0]
        completion_ids.append(ids)
        env_mask.append(mask)
        logprobs.append(lps)
    return {
        "prompt_ids": [list(e.prompt_ids) for e in episodes],
        "completion_ids": completion_ids,
        "logprobs": logprobs,
        "env_mask": env_mask,
        "envkit_score": [float(e.score) for e in episodes],
        "envkit_turns": [e.turns for e in episodes],
        "envkit_tool_calls": [e.num_tool_calls for e in episodes],
        "envkit_tool_errors": [e.tool_errors for e in episodes],
        "envkit_truncated": [e.truncated for e in episodes],
        "envkit_error": [e.error or "" for e in episodes],
    }


def env_score_reward(completions: list[Any], envkit_score: list[float], **kwargs: Any) -> list[float]:
    """GRPO reward function: the env's score of each episode (from the rollout's ``envkit_score`` field)."""
    return [float(s) for s in envkit_score]


def make_reward_funcs(
    shaped: dict[str, tuple[Callable[..., list[float]], float]] | None = None,
) -> tuple[list[Callable[..., list[float]]], list[float]]:
    """``reward_funcs`` and ``reward_weights`` for GRPOConfig: the env score (weight 1) plus optional shaped rewards
    ``{name: (function, weight)}``; each function receives the rollout fields (``envkit_turns``, …) as kwargs."""
    functions: list[Callable[..., list[float]]] = [env_score_reward]
    weights = [1.0]
    for name, (function, weight) in (shaped or {}).items():

        def shaped_reward(*args: Any, _function: Callable[..., list[float]] = function, **kwargs: Any) -> list[float]:
            return _function(*args, **kwargs)

        shaped_reward.__name__ = name  # TRL logs each reward under its function's name
        functions.append(shaped_reward)
        weights.append(float(weight))
    return functions, weights


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
        from envkit.vllm_support import trl_server_backend

        return trl_server_backend(trainer, eos or [tokenizer.eos_token_id])
    model = trainer.accelerator.unwrap_model(trainer.model)
    return TransformersBackend(model, tokenizer, stop_token_ids=eos)


def trainer_sampling(trainer: Any) -> SamplingParams:
    """Sampling parameters from the trainer's GRPOConfig."""
    args = trainer.args
    return SamplingParams(
        temperature=float(args.temperature),
        top_p=float(args.top_p if args.top_p is not None else 1.0),
        top_k=int(args.top_k) if args.top_k else None,
        max_new_tokens=int(args.max_completion_length),
    )


def log_metrics(trainer: Any, episodes: list[Episode]) -> None:
    """Add envkit's episode metrics to TRL's logs (``envkit/mean_score``, ``envkit/mean_turns``, …)."""
    metrics = getattr(trainer, "_metrics", None)
    if metrics is None or not episodes:
        return
    mode = "train" if trainer.model.training else "eval"
    summary = summarize(episodes)
    for key in ("mean_score", "mean_turns", "tool_calls_per_turn", "tool_error_rate", "truncation_rate", "error_rate"):
        value = summary.get(key)
        if value is not None and math.isfinite(value):
            metrics[mode][f"envkit/{key}"].append(value)


def _tokenizer_of(trainer: Any) -> Any:
    processing = trainer.processing_class
    return getattr(processing, "tokenizer", processing)


# ---- TRL's native environment_factory ------------------------------------------------------------------------------
def to_environment_factory(env_class: type[Env], **config: Any) -> Callable[[], Any]:
    """Export a :class:`envkit.ToolEnv` class for ``GRPOTrainer(environment_factory=...)``.

    Each instance wraps a fresh env: ``reset(**row)`` resets it with the row's ``task_seed`` (rows from
    :func:`build_dataset`), every ``@tool`` becomes a public method with the same signature and docstring, and
    ``get_reward()`` returns the env's score. What TRL's loop cannot express: turns without tool calls (``on_text``,
    e.g. a simulated user) — the episode ends at the first such turn — and envkit's token-exact suffixes (TRL renders
    tool results itself).
    """
    tools = getattr(env_class, "_tool_specs", {})
    if not tools:
        raise TypeError(f"{env_class.__name__} has no @tool methods: TRL's environment_factory needs tools")

    def reset(self: Any, **row: Any) -> None:
        self.env.reset(seed=int(row.get("task_seed", 0)))
        return None

    def get_reward(self: Any) -> float:
        return float(self.env.score())

    def make_method(name: str) -> Callable[..., str]:
        original = getattr(env_class, name)

        @functools.wraps(original)
        def method(self: Any, **arguments: Any) -> str:
            _, content, failed = self.env.call_tool({"function": {"name": name, "arguments": arguments}})
            if failed:
                raise RuntimeError(content.removeprefix("Error: "))
            return content

        return method

    namespace: dict[str, Any] = {
        "__init__": lambda self: setattr(self, "env", env_class(**config)),
        "__doc__": f"TRL environment wrapping envkit's {env_class.__name__}.",
        "reset": reset,
        "get_reward": get_reward,
    }
    namespace.update({name: make_method(name) for name in tools})
    exported = type(f"{env_class.__name__}ForTRL", (), namespace)
    return exported
