"""From the trainer's GRPOConfig to the rollout's sampling: :func:`config_sampling` (every knob applied or
refused), the per-step seed (:func:`trainer_sampling`) and the chat template's variables."""

from __future__ import annotations

import dataclasses
from typing import Any

from envkit.adapters.trl.metrics import in_training
from envkit.backends import SamplingParams, SamplingRangeError, request_seed


class UnsupportedTrainerConfig(ValueError):
    """A GRPOConfig setting that envkit's ``rollout_func`` cannot honour; the message (one line) says what works."""


def trainer_sampling(trainer: Any, *, call: int = 0) -> SamplingParams:
    """Sampling parameters from the trainer's GRPOConfig (:func:`config_sampling`) with this step's seed.

    The seed is derived from the GRPOConfig ``seed`` (``--seed``), the trainer's ``global_step``, its process index
    (a group split across processes must not repeat samples) and ``call`` (several rollouts at one step): runs with
    the same seed sample the same episodes, and every step samples new ones.
    """
    return dataclasses.replace(config_sampling(trainer.args), seed=step_seed(int(trainer.args.seed), trainer, call))


def step_seed(base: int, trainer: Any, call: int) -> int:
    """The sampling seed of rollout ``call`` at the trainer's step, on its process; an evaluation's rollouts (the
    model in eval mode: TRL's ``evaluate``) draw from a stream of their own, so they never repeat a training step's
    samples and an evaluation does not move the training seeds that follow it."""
    state = getattr(trainer, "state", None)
    step = int(getattr(state, "global_step", 0) or 0)
    process = int(getattr(getattr(trainer, "accelerator", None), "process_index", 0) or 0)
    return request_seed(base, step, process, call, *(() if in_training(trainer) else (1,)))


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
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UnsupportedTrainerConfig(f"generation_kwargs[{key!r}] must be a number, got {value!r:.60}")
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
    try:
        return SamplingParams(
            temperature=values["temperature"],
            top_p=float(values["top_p"]) if values["top_p"] is not None else 1.0,
            # 0 (transformers') and -1 (vLLM's) are off; another negative one is refused
            top_k=None if values["top_k"] in (None, 0, -1) else int(values["top_k"]),
            min_p=float(values["min_p"]) if values["min_p"] is not None else 0.0,
            repetition_penalty=float(values["repetition_penalty"]) if values["repetition_penalty"] is not None else 1.0,
            max_new_tokens=int(args.max_completion_length),
            stop=stop or None,
            stop_token_ids=stop_token_ids or None,
        )
    except SamplingRangeError as error:
        where = f"generation_kwargs[{error.field!r}]" if error.field in extra else error.field
        raise UnsupportedTrainerConfig(f"{where} {error.requirement}") from None


def trainer_template_kwargs(trainer: Any) -> dict[str, Any] | None:
    """The trainer's ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}``), as chat-template variables."""
    kwargs = getattr(trainer.args, "chat_template_kwargs", None)
    if kwargs is None:
        return None
    if not isinstance(kwargs, dict):
        raise UnsupportedTrainerConfig(f"chat_template_kwargs must be a JSON object, got {kwargs!r:.80}")
    return dict(kwargs) or None
