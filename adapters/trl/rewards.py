"""Episodes as TRL's rollout dict (token lists, logprobs, ``env_mask``, the per-episode ``envkit_*`` fields) and
the reward functions that read those fields."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envkit.rollout import Episode


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
