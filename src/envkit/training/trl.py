"""Bridges to TRL's GRPOTrainer: envkit's rollout engine as a ``rollout_func``, and envs as an ``environment_factory``.

The rollout path (recommended) hands whole multi-turn episodes to GRPO::

    dataset = build_dataset(env_factory, seeds=range(512))
    trainer = GRPOTrainer(model, reward_funcs=env_score_reward, train_dataset=dataset, args=config,
                          rollout_func=make_rollout_func(env_factory, tokenizer=tokenizer))

``rollout_func`` returns ``prompt_ids``, ``completion_ids``, ``logprobs`` and ``env_mask`` (1 = model token, 0 = env
token, so GRPO's loss only sees what the model generated), plus per-episode fields that reach reward functions as
keyword arguments: ``envkit_messages`` (the episode's whole transcript: TRL's own ``completions`` is its parse of the
multi-turn token stream, every turn merged into one message), ``envkit_score``, ``envkit_turns``,
``envkit_tool_calls``, ``envkit_tool_errors``, ``envkit_truncated``, ``envkit_error``. Do not also pass
``tools``/``environment_factory``: TRL then ignores env_mask.

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
worth. TRL modes the rollout cannot serve are refused with :class:`UnsupportedTrainerMode` on the first call: see
:func:`check_trainer_mode`.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable, Iterable
from typing import Any

from envkit.backends import SamplingParams, TransformersBackend, request_seed
from envkit.core.env import Env
from envkit.rollout import Episode, RolloutEngine, summarize

SEED_KEY = "envkit_task_seed"
"""Key carried by the first prompt message of :func:`build_dataset` rows: the task seed of the row."""

logger = logging.getLogger(__name__)

COMPLETION_BUDGET_TURNS = 4
"""Default ``max_completion_tokens``: this many per-turn budgets (``max_completion_length``). With envkit train's
128 tokens per turn that is 512, TRL's own default ``max_completion_length``, the length TRL's memory is sized for."""


ZERO_VARIANCE_STEPS = 3
"""Training rollouts in a row in which every group's episodes scored the same before the rollout says, in one line,
that training cannot learn."""


class UnsupportedTrainerConfig(ValueError):
    """A GRPOConfig setting that envkit's ``rollout_func`` cannot honour; the message (one line) says what works."""


class UnsupportedTrainerMode(UnsupportedTrainerConfig):
    """A TRL parallelism or vLLM mode that envkit's ``rollout_func`` cannot serve (see :func:`check_trainer_mode`)."""


class ErrorRateExceeded(RuntimeError):
    """More of one step's episodes failed (env raised, timed out, or could not be rendered or generated) than
    ``max_error_rate`` allows: the env or the generation server is broken, and training on would only learn from
    what is left. The message (one line) gives the rate, the step and the first error."""


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
        "this prompt carries no task seed: build the training dataset with envkit.training.trl.build_dataset"
    )


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
        log: Where the main process writes its one-line warnings (every group scored equally for
            :data:`ZERO_VARIANCE_STEPS` training rollouts in a row); default: this module's logger, at WARNING.

    TRL passes each prompt once per generation (a group is ``num_generations`` consecutive copies); exactly one
    episode is returned per prompt, in order. Episodes of consecutive identical prompts form one group. On its first
    call with a trainer it refuses modes it cannot serve (:func:`check_trainer_mode`) and unsupported
    ``generation_kwargs`` with :class:`UnsupportedTrainerConfig`, before generating anything.
    """

    engines: dict[int, RolloutEngine] = {}  # one engine per trainer, built on first use and kept across steps
    calls: dict[int, int] = {}  # rollout calls per trainer: two calls at one step (training, evaluation) differ
    ends: dict[int, int] = {}  # the chat template's end-of-turn token id, per trainer
    flat: dict[int, int] = {}  # training rollouts in a row in which every group scored equally, per trainer

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
        call = calls[id(trainer)] = calls.get(id(trainer), -1) + 1
        if sampling is None:
            step_sampling = trainer_sampling(trainer, call=call)
        elif sampling.seed is not None:
            step_sampling = dataclasses.replace(sampling, seed=_step_seed(sampling.seed, trainer, call))
        else:
            step_sampling = sampling
        episodes = _run_in_order(engine, seeds, step_sampling)
        if on_episodes is not None:
            on_episodes(episodes)
        # Every process's episodes and leaked threads: each process calls this once per rollout.
        everyone, leaked = _gather_rollout(trainer, episodes, engine.leaked_threads)
        zero_variance = log_metrics(trainer, everyone)
        metrics = getattr(trainer, "_metrics", None)
        if metrics is not None:
            metrics["train" if _training(trainer) else "eval"]["envkit/leaked_threads"].append(float(leaked))
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        if _training(trainer):
            flat[id(trainer)] = flat.get(id(trainer), 0) + 1 if zero_variance == 1.0 else 0
            if flat[id(trainer)] == ZERO_VARIANCE_STEPS and _is_main_process(trainer):
                (log or logger.warning)(cannot_learn_message(everyone, step))
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


def _training(trainer: Any) -> bool:
    model = getattr(trainer, "model", None)
    return bool(getattr(model, "training", False))


def _is_main_process(trainer: Any) -> bool:
    return bool(getattr(getattr(trainer, "accelerator", None), "is_main_process", True))


def gather_episodes(trainer: Any, episodes: list[Episode]) -> list[Episode]:
    """Every training process's ``episodes``, in process order (TRL's order of the gathered batch), without their
    token lists, transcripts, info and timings: what metrics need. With one process, ``episodes`` itself.

    A collective call: with several processes each must call it, once per rollout.
    """
    return _gather_rollout(trainer, episodes, 0)[0]


def _gather_rollout(trainer: Any, episodes: list[Episode], leaked: int) -> tuple[list[Episode], int]:
    """:func:`gather_episodes`, and the sum of every process's ``leaked`` (threads), in one collective call."""
    accelerator = getattr(trainer, "accelerator", None)
    if accelerator is None or int(getattr(accelerator, "num_processes", 1) or 1) <= 1:
        return list(episodes), int(leaked)
    from accelerate.utils import gather_object

    light = [
        dataclasses.replace(
            e, messages=[], prompt_ids=[], completion_ids=[], env_mask=[], logprobs=[], info={}, timings={}
        )
        for e in episodes
    ]
    parts = gather_object([(light, int(leaked))])
    return [e for part, _ in parts for e in part], sum(n for _, n in parts)


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


def check_error_rate(episodes: list[Episode], max_error_rate: float | None, *, step: int | None = None) -> None:
    """Raise :class:`ErrorRateExceeded` when more than ``max_error_rate`` of ``episodes`` failed (``step``: the
    training step, named in the message; ``None`` outside training, e.g. ``envkit eval``)."""
    if max_error_rate is None or not episodes:
        return
    failed = [e for e in episodes if e.error is not None]
    rate = len(failed) / len(episodes)
    if rate > max_error_rate:
        raise ErrorRateExceeded(
            f"{len(failed)} of {len(episodes)} episodes failed{'' if step is None else f' at step {step}'} (error rate "
            f"{rate:.2f} > "
            f"--max-error-rate {max_error_rate:g}); first: {' '.join(str(failed[0].error).split())[:300]} — fix the "
            "env or the generation server (envkit validate / envkit eval show the failures), or raise --max-error-rate"
        )


def episodes_to_rollout(
    episodes: list[Episode],
    tokenizer: Any,
    *,
    end_of_turn_id: int | None = None,
    max_new_tokens: int | None = None,
) -> dict[str, list]:
    """TRL's rollout dict: token lists, flat logprobs, env_mask, and per-episode fields for reward functions
    (``envkit_messages``: the episode's transcript, a list of chat messages; ``envkit_score``, ``envkit_failed``,
    ``envkit_turns``, ``envkit_tool_calls``, ``envkit_tool_errors``, ``envkit_truncated``, ``envkit_error``).

    Env tokens after the model's last token are dropped (no gradient, and nothing before them attends to them), so
    TRL's truncation test reads the model's last token. A last turn that stopped on another stop token or string
    (closed by the engine with the template's end-of-turn ``end_of_turn_id``: :attr:`Episode.turn_finish_reasons`
    says ``closed``) keeps that closing token, so it ends on the end-of-turn token as a finished turn does; a last
    turn cut at the per-turn budget (``length``) or by the episode's budget (``budget``) does not, and looks
    truncated. Without ``end_of_turn_id`` every episode ends at the model's last token; ``max_new_tokens`` is only
    read for episodes without turn records (a last turn of that many tokens counts as cut).

    A failed episode (``error`` set: the env raised or timed out, its messages could not be rendered, or its
    generation failed twice) carries no gradient: its ``env_mask`` is all 0, so no token of it reaches the loss, and
    ``envkit_failed`` makes :func:`env_score_reward` (and the shaped rewards of :func:`make_reward_funcs`) return
    ``None`` for it, which GRPOTrainer treats as unscorable: NaN reward, left out of its group's mean and standard
    deviation, advantage 0. Its group's baseline is then the mean of the episodes that ran — a 0 reward for an env
    bug would instead lower the baseline and reward the group's other members for the env's fault.
    """
    completion_ids, env_mask, logprobs = [], [], []
    for episode in episodes:
        ids, mask, lps = list(episode.completion_ids), list(episode.env_mask), list(episode.logprobs)
        if episode.error is not None:
            mask = [0] * len(mask)
        # Env tokens after the model's last token carry no gradient (masked, and causal attention means they affect
        # nothing before them): drop them, so a finished episode ends at the model's end-of-turn token and TRL's
        # `mask_truncated_completions` sees exactly the episodes whose last turn was cut.
        end = len(mask)
        while end and mask[end - 1] == 0:
            end -= 1
        if end and _closed_by_engine(episode, ids, mask, end, end_of_turn_id, max_new_tokens):
            end += 1
        ids, mask, lps = ids[:end], mask[:end], lps[:end]
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
        "envkit_messages": [[dict(m) for m in e.messages] for e in episodes],
        "envkit_score": [float(e.score) for e in episodes],
        "envkit_failed": [e.error is not None for e in episodes],
        "envkit_turns": [e.turns for e in episodes],
        "envkit_tool_calls": [e.num_tool_calls for e in episodes],
        "envkit_tool_errors": [e.tool_errors for e in episodes],
        "envkit_truncated": [e.truncated for e in episodes],
        "envkit_error": [e.error or "" for e in episodes],
    }


def _closed_by_engine(
    episode: Episode,
    ids: list[int],
    mask: list[int],
    end: int,
    end_of_turn_id: int | None,
    max_new_tokens: int | None,
) -> bool:
    """Whether the model's last turn (ending at ``end``) stopped on a stop token or string other than the
    end-of-turn token and the engine closed it with that token (masked, at ``end``). The engine's record of how the
    turn ended (:attr:`Episode.turn_finish_reasons`) decides; for an episode without one, a turn of
    ``max_new_tokens`` model tokens counts as cut at the per-turn budget (the engine closes that too)."""
    if end_of_turn_id is None or end >= len(ids):
        return False
    if ids[end - 1] == end_of_turn_id or ids[end] != end_of_turn_id:
        return False
    if episode.turn_finish_reasons:
        return episode.turn_finish_reasons[-1] == "closed"
    if max_new_tokens is None:
        return False
    said = 0
    while said < end and mask[end - 1 - said] == 1:
        said += 1
    return said < max_new_tokens


def env_score_reward(
    completions: list[Any], envkit_score: list[float], envkit_failed: list[bool] | None = None, **kwargs: Any
) -> list[float | None]:
    """GRPO reward function: the env's score of each episode (from the rollout's ``envkit_score`` field); ``None``
    for a failed episode (``envkit_failed``), which GRPOTrainer leaves out of its group's statistics."""
    failed = envkit_failed or [False] * len(envkit_score)
    return [None if bad else float(s) for s, bad in zip(envkit_score, failed, strict=True)]


def make_reward_funcs(
    shaped: dict[str, tuple[Callable[..., list[float]], float]] | None = None,
) -> tuple[list[Callable[..., list[float]]], list[float]]:
    """``reward_funcs`` and ``reward_weights`` for GRPOConfig: the env score (weight 1) plus optional shaped rewards
    ``{name: (function, weight)}``; each function receives the rollout fields (``envkit_turns``, …) as kwargs."""
    functions: list[Callable[..., list[float]]] = [env_score_reward]
    weights = [1.0]
    for name, (function, weight) in (shaped or {}).items():

        def shaped_reward(
            *args: Any, _function: Callable[..., list[float]] = function, **kwargs: Any
        ) -> list[float | None]:
            values = list(_function(*args, **kwargs))
            failed = kwargs.get("envkit_failed") or [False] * len(values)
            return [None if bad else value for value, bad in zip(values, failed, strict=True)]

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
        from envkit.backends.trl_client import trl_server_backend

        return trl_server_backend(trainer, eos or [tokenizer.eos_token_id])
    model = trainer.accelerator.unwrap_model(trainer.model)
    return TransformersBackend(model, tokenizer, stop_token_ids=eos)


def trainer_sampling(trainer: Any, *, call: int = 0) -> SamplingParams:
    """Sampling parameters from the trainer's GRPOConfig (:func:`config_sampling`) with this step's seed.

    The seed is derived from the GRPOConfig ``seed`` (``--seed``), the trainer's ``global_step``, its process index
    (a group split across processes must not repeat samples) and ``call`` (several rollouts at one step): runs with
    the same seed sample the same episodes, and every step samples new ones.
    """
    return dataclasses.replace(config_sampling(trainer.args), seed=_step_seed(int(trainer.args.seed), trainer, call))


def _step_seed(base: int, trainer: Any, call: int) -> int:
    state = getattr(trainer, "state", None)
    step = int(getattr(state, "global_step", 0) or 0)
    process = int(getattr(getattr(trainer, "accelerator", None), "process_index", 0) or 0)
    return request_seed(base, step, process, call)


_STOP_KEYS = ("stop", "stop_strings", "stop_token_ids")
_OVERRIDE_KEYS = ("top_p", "top_k", "min_p", "repetition_penalty")
_REFUSED_KEYS = {
    "temperature": "set temperature (the GRPOConfig field) instead: TRL computes the policy's logprobs at that "
    "temperature, so sampling at another would train on a distribution the loss does not model",
    "max_tokens": "the per-turn budget is max_completion_length and the per-episode one max_completion_tokens",
    "max_new_tokens": "the per-turn budget is max_completion_length and the per-episode one max_completion_tokens",
    "seed": "set seed (the GRPOConfig field, --seed) instead: envkit derives one sampling seed per step from it",
}


def config_sampling(args: Any) -> SamplingParams:
    """Sampling parameters (no seed) from a GRPOConfig; raises :class:`UnsupportedTrainerConfig` for what envkit
    cannot honour.

    Every knob is *applied*, none silently dropped: ``temperature``, ``top_p``, ``top_k`` (0 = off), ``min_p`` and
    ``repetition_penalty`` reach every backend, which records the processed logprob of the distribution it sampled
    from, as TRL's own vLLM generation does (``logprobs_mode="processed_logprobs"``). ``max_completion_length`` is
    the token budget of one assistant turn. ``generation_kwargs`` is applied where envkit has the knob: ``stop`` /
    ``stop_strings`` (stop strings), ``stop_token_ids`` (extra stop tokens), and ``top_p``, ``top_k``, ``min_p``,
    ``repetition_penalty``, which override the fields as TRL documents; any other key (``temperature``, ``seed``,
    ``max_tokens``, ``num_beams``, ``frequency_penalty``, …) raises, naming the key and what works instead.
    """
    if args.max_completion_length is None:
        raise UnsupportedTrainerConfig(
            "max_completion_length is None: envkit's rollouts need a token budget per assistant turn; set "
            "max_completion_length (tokens per turn; --max-completion-tokens bounds the whole episode)"
        )
    values: dict[str, Any] = {
        "temperature": float(args.temperature),
        "top_p": args.top_p,
        "top_k": args.top_k,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
    }
    stop: list[str] = []
    stop_token_ids: list[int] = []
    extra = getattr(args, "generation_kwargs", None) or {}
    if not isinstance(extra, dict):
        raise UnsupportedTrainerConfig(f"generation_kwargs must be a JSON object, got {extra!r:.80}")
    for key in sorted(extra):
        value = extra[key]
        if key in _OVERRIDE_KEYS:
            values[key] = value
        elif key in ("stop", "stop_strings"):
            strings = [value] if isinstance(value, str) else value
            if not isinstance(strings, list) or not all(isinstance(s, str) for s in strings):
                raise UnsupportedTrainerConfig(f"generation_kwargs[{key!r}] must be a string or a list of strings")
            stop += [s for s in strings if s not in stop]
        elif key == "stop_token_ids":
            ids = [value] if isinstance(value, int) else value
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                raise UnsupportedTrainerConfig("generation_kwargs['stop_token_ids'] must be a list of token ids")
            stop_token_ids += [i for i in ids if i not in stop_token_ids]
        elif key in _REFUSED_KEYS:
            raise UnsupportedTrainerConfig(
                f"generation_kwargs key {key!r} is not supported by envkit's rollouts: {_REFUSED_KEYS[key]}"
            )
        else:
            raise UnsupportedTrainerConfig(
                f"generation_kwargs key {key!r} is not supported by envkit's rollouts (they would ignore it): "
                f"envkit honours {', '.join(_STOP_KEYS + _OVERRIDE_KEYS)}; sampling is set by the GRPOConfig fields "
                "temperature, top_p, top_k, min_p and repetition_penalty"
            )
    return SamplingParams(
        temperature=values["temperature"],
        top_p=float(values["top_p"]) if values["top_p"] is not None else 1.0,
        top_k=int(values["top_k"]) if values["top_k"] and int(values["top_k"]) > 0 else None,
        min_p=float(values["min_p"]) if values["min_p"] is not None else 0.0,
        repetition_penalty=float(values["repetition_penalty"]) if values["repetition_penalty"] is not None else 1.0,
        max_new_tokens=int(args.max_completion_length),
        stop=stop or None,
        stop_token_ids=stop_token_ids or None,
    )


def trainer_template_kwargs(trainer: Any) -> dict[str, Any] | None:
    """The trainer's ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}``), as chat-template variables."""
    kwargs = getattr(trainer.args, "chat_template_kwargs", None)
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        raise UnsupportedTrainerConfig(f"chat_template_kwargs must be a JSON object, got {kwargs!r:.80}")
    return dict(kwargs) or None


# ---- TRL modes ------------------------------------------------------------------------------------------------------
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
    tensor parallelism, or vLLM sleep mode (:func:`check_vllm_mode`). Read from the trainer's accelerator and args."""
    accelerator = trainer.accelerator
    zero_stage = None
    if getattr(trainer, "is_deepspeed_enabled", False):
        plugin = getattr(accelerator.state, "deepspeed_plugin", None)
        zero_stage = getattr(plugin, "zero_stage", None)
    check_sharding(zero_stage=zero_stage, fsdp=bool(getattr(trainer, "is_fsdp_enabled", False)))
    check_vllm_mode(trainer.args, world_size=int(accelerator.num_processes))


def log_metrics(trainer: Any, episodes: list[Episode]) -> float | None:
    """Add envkit's episode metrics to TRL's logs (``envkit/mean_score``, ``envkit/mean_turns``, …,
    ``envkit/zero_variance_groups``, and ``envkit/score/NAME``: the mean of each of the env's score components,
    :meth:`envkit.Env.score_components`); return the fraction of zero-variance groups (:func:`zero_variance_groups`).

    ``episodes`` are the step's episodes of every process (:func:`gather_episodes`): TRL logs the main process's
    ``_metrics`` only.
    """
    if not episodes:
        return None
    mode = "train" if _training(trainer) else "eval"
    group_size = getattr(trainer, "num_generations" if mode == "train" else "num_generations_eval", None)
    zero_variance = zero_variance_groups(episodes, group_size if isinstance(group_size, int) else None)
    metrics = getattr(trainer, "_metrics", None)
    if metrics is None:
        return zero_variance
    summary = summarize(episodes)
    summary["zero_variance_groups"] = zero_variance
    for key in (
        "mean_score",
        "mean_turns",
        "tool_calls_per_turn",
        "tool_error_rate",
        "truncation_rate",
        "error_rate",
        "zero_variance_groups",
        *(key for key in summary if key.startswith("score/")),
    ):
        value = summary.get(key)
        if value is not None and math.isfinite(value):
            metrics[mode][f"envkit/{key}"].append(value)
    return zero_variance


def zero_variance_groups(episodes: list[Episode], group_size: int | None = None) -> float:
    """The fraction of groups whose episodes all got the same score (within TRL's ``isclose`` of a zero standard
    deviation), failed episodes left out as GRPOTrainer leaves them out; a group with fewer than two scored episodes
    counts too. Such a group's advantages are all 0: the score gives it no gradient.

    Groups are consecutive blocks of ``group_size`` episodes, as GRPOTrainer groups its gathered batch; without a
    ``group_size`` that divides the batch, runs of consecutive episodes of one task seed.
    """
    if not episodes:
        return 0.0
    groups: list[list[Episode]] = []
    if group_size and len(episodes) % group_size == 0:
        groups = [episodes[i : i + group_size] for i in range(0, len(episodes), group_size)]
    else:
        for episode in episodes:
            if groups and groups[-1][-1].task_seed == episode.task_seed:
                groups[-1].append(episode)
            else:
                groups.append([episode])
    flat = 0
    for group in groups:
        scores = [float(e.score) for e in group if e.error is None]
        flat += len(scores) < 2 or max(scores) - min(scores) <= 1e-8
    return flat / len(groups)


def cannot_learn_message(episodes: list[Episode], step: int) -> str:
    """The one line said when every group scored equally for :data:`ZERO_VARIANCE_STEPS` training rollouts in a row."""
    scores = sorted({round(float(e.score), 6) for e in episodes if e.error is None})
    seen = ", ".join(f"{s:g}" for s in scores[:4]) + (", ..." if len(scores) > 4 else "")
    return (
        f"training cannot learn: at each of the last {ZERO_VARIANCE_STEPS} rollouts (up to step {step}) every group's "
        f"episodes got equal scores (this one: {seen or 'none scored'}), so every advantage is 0 and the env score "
        "gives no gradient (envkit/zero_variance_groups = 1). Fix: tasks the model solves sometimes (an easier tier, "
        "or a warm start with envkit sft), more varied episodes (a higher --rl-num-generations or temperature), or a "
        "graded score or shaped reward (make_reward_funcs)"
    )


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
