"""Demonstrations: an env's oracle played through the chat template as token-exact trajectories.

:class:`OracleBackend` is a generation backend whose "model" is the env's ``oracle()``: each reply is the chat
template's own text of the oracle's next message (so the "model tokens" are what a model that had learned the template
would emit). Run through :class:`~envkit.rollout.RolloutEngine` like any model, it gives an :class:`Episode` with the
same layout as a rollout (``prompt_ids``, ``completion_ids``, ``env_mask``) from the same loop. Used to warm-start a
model by supervised fine-tuning before GRPO (``envkit sft``), and by tests as a scripted policy.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from envkit.backends import Generation, SamplingParams
from envkit.backends.oracle import NoOracle, OracleBackend, UnknownPrompt  # noqa: F401  (the old envkit.demos had all three)
from envkit.chat.render import ChatRenderer
from envkit.core.env import Env
from envkit.rollout import Episode, RolloutEngine


class OracleEpisodeFailed(ValueError):
    """An oracle episode ended with an error (the env raised, timed out, or its messages could not be rendered);
    the message names the env, the seed and the error."""


_NO_DEADLINE_S = 24 * 3600.0


class _GivenRenderer(RolloutEngine):
    """The rollout engine with one given renderer (its template, tools and end-of-turn token) for every env."""

    def __init__(self, *args: Any, renderer: ChatRenderer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.renderer = renderer

    def renderer_for(self, tools: list[dict[str, Any]] | None) -> ChatRenderer:
        return self.renderer


def oracle_episode(env: Env, renderer: ChatRenderer, seed: int, *, max_turns: int | None = None) -> Episode:
    """Play the oracle on task ``seed`` and record it token-exactly.

    The episode runs on ``env`` through the rollout engine, with an :class:`OracleBackend` playing on a copy of it
    (``copy.deepcopy``). Raises :class:`NoOracle` when ``oracle()`` returns ``None`` (and whatever ``oracle()``
    raises), and :class:`OracleEpisodeFailed` naming the error when the episode fails otherwise (the env raised in
    ``step``).
    """
    try:
        template = copy.deepcopy(env)
    except Exception as error:
        raise TypeError(
            f"oracle_episode plays the oracle on a copy of the env, and copy.deepcopy({type(env).__name__}) failed "
            f"({type(error).__name__}: {error}). Use oracle_episodes(env_factory, ...) instead"
        ) from None
    return _play_oracle(env, lambda: copy.deepcopy(template), renderer, seed, max_turns)


def _play_oracle(
    env: Env, replica_factory: Callable[[], Env], renderer: ChatRenderer, seed: int, max_turns: int | None
) -> Episode:
    """One engine episode of ``env`` on ``seed``, the oracle playing on replicas from ``replica_factory``."""
    backend = OracleBackend(replica_factory, renderer.tokenizer, [seed], renderer=renderer)
    # One episode: replies in line (nothing to batch), env calls without a practical deadline (as when the oracle was
    # played directly).
    engine = _GivenRenderer(
        lambda: env,
        _InLineBackend(backend),
        renderer.tokenizer,
        max_turns=max_turns,
        concurrency=1,
        step_timeout_s=_NO_DEADLINE_S,
        renderer=renderer,
    )
    try:
        episode = engine.run([seed], 1, SamplingParams())[0]
    finally:
        engine.close()
    if episode.error is not None:
        if backend.last_error is not None and episode.error.startswith("generation failed"):
            raise backend.last_error  # e.g. NoOracle: the engine keeps only its message
        raise OracleEpisodeFailed(f"the oracle episode of {type(env).__name__} on seed {seed} failed: {episode.error}")
    return episode


class _InLineBackend:
    """``agenerate`` over a batch backend, in line on the event loop (one episode: nothing to batch)."""

    def __init__(self, backend: OracleBackend) -> None:
        self.backend = backend

    async def agenerate(
        self, prompt: list[int], sampling: SamplingParams, seed: int | None = None, *, timeout_s: float | None = None
    ) -> Generation:
        return self.backend.generate([prompt], sampling)[0]  # in line: no deadline can interrupt it


def oracle_episodes(
    env_factory: Callable[[], Env], tokenizer: Any, seeds: list[int], *, min_score: float = 1.0, **renderer_kwargs: Any
) -> list[Episode]:
    """Oracle demonstrations for ``seeds``, keeping those that reach ``min_score``.

    Each seed is one rollout-engine episode on a fresh env, played by an :class:`OracleBackend`.
    """
    renderer = ChatRenderer(tokenizer, getattr(env_factory(), "tools", None) or None, **renderer_kwargs)
    episodes = [_play_oracle(env_factory(), env_factory, renderer, seed, None) for seed in seeds]
    return [e for e in episodes if e.score >= min_score]
