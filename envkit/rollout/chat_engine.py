"""The rollout engine's loop at the message level (:class:`ChatRolloutEngine`): episodes played by a model behind a
chat endpoint (:class:`~envkit.backends.ChatCompletionsBackend`), for evaluation only.

The same episode walk as :class:`~envkit.rollout.RolloutEngine` (reset → the model's turn → ``step`` → … →
``score``), its env workers, deadlines, turn cap, fault handling and :class:`~envkit.rollout.Episode` results, but
the model sees messages and tools, not token ids: the server renders the prompt with its own template and parses
tool calls with its own parser. Episodes have no token ids and no logprobs (``prompt_ids``, ``completion_ids``,
``logprobs`` stay empty), so they can be scored and summarized but never trained on.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any

from envkit.backends.base import ChatBackend, GenerationTimeout, SamplingParams, request_seed
from envkit.core.env import Ending, Env
from envkit.rollout.engine import RolloutEngine
from envkit.rollout.episode import Episode
from envkit.rollout.renderers import OpeningPrompts
from envkit.rollout.steps import StepResult
from envkit.workers import EnvSession, LeakedThreadsError

__all__ = ["ChatRolloutEngine"]


class ChatRolloutEngine(RolloutEngine):
    """Run episodes of an env with a chat backend (messages and tools in, an assistant message out).

    Args:
        env_factory: ``env_factory()`` returns a fresh :class:`envkit.Env` (one per episode).
        backend: A :class:`~envkit.backends.base.ChatBackend` (``await achat(messages, tools, sampling, seed,
            timeout_s=)``), e.g. :class:`~envkit.backends.ChatCompletionsBackend`.
        **kwargs: :class:`~envkit.rollout.RolloutEngine`'s ``max_turns``, ``concurrency``, ``step_timeout_s``,
            ``generate_timeout_s``, ``progress`` and ``env_workers``. Token budgets (``max_episode_tokens``,
            ``max_completion_tokens``) and chat-template options do not apply: the server renders the prompt, and
            its own context length bounds an episode; ``sampling.max_new_tokens`` bounds each turn.
    """

    def __init__(self, env_factory: Callable[[], Env], backend: ChatBackend, **kwargs: Any) -> None:
        for name in ("max_episode_tokens", "max_completion_tokens", "chat_template", "template_kwargs"):
            if kwargs.get(name) is not None:
                raise ValueError(
                    f"{name} does not apply to a chat backend (the server renders the prompt and counts its tokens): "
                    "leave it unset"
                )
        super().__init__(env_factory, backend, None, **kwargs)

    def _check_backend(self, backend: Any) -> None:
        if not isinstance(backend, ChatBackend):
            raise TypeError(
                f"ChatRolloutEngine plays a chat backend (achat(messages, tools, ...)), not {type(backend).__name__}: "
                "use RolloutEngine for token-id backends"
            )

    def _generator(self) -> Callable[..., Awaitable[Any]]:
        return self.backend.achat

    async def _play(
        self,
        episode: Episode,
        sampling: SamplingParams,
        generate: Callable[..., Awaitable[Any]],
        on_turn: Callable[[Episode], None] | None = None,
        openings: OpeningPrompts | None = None,
        on_generate: Callable[[int], None] | None = None,
    ) -> None:
        started = time.perf_counter()
        episode.timings.update(env=0.0, generate=0.0)
        live = self._live_envs()
        await live.acquire()
        session: EnvSession | None = None
        played = False
        try:
            try:
                session = await self._env_call(
                    episode, "construction", lambda timeout: self.workers.open(self.env_factory, timeout_s=timeout)
                )
                episode.worker = dict(getattr(session, "placement", None) or {})
                opening, info, tools = await self._env_call(
                    episode, "reset", lambda timeout: session.reset(episode.task_seed, timeout_s=timeout)
                )
                episode.info, episode.messages, episode.tools = info, list(opening), list(tools or [])
                while True:
                    if on_generate is not None:
                        on_generate(episode.turns + 1)
                    reply = await self._chat(episode, sampling)
                    episode.turns += 1
                    episode.turn_models.append(reply.model or "")
                    episode.turn_finish_reasons.append("length" if reply.finish_reason == "length" else "stop")
                    if on_turn is not None:
                        on_turn(episode)
                    last = self.max_turns is not None and episode.turns >= self.max_turns
                    action = reply.message
                    outcome = await self._env_call(
                        episode, "step", lambda timeout, action=action: session.step(action, timeout_s=timeout)
                    )
                    episode.messages = outcome.history + outcome.observation
                    fields = {f.name: getattr(outcome, f.name) for f in dataclasses.fields(outcome)}
                    self._after_step(episode, StepResult(**fields), last)
            except LeakedThreadsError:
                raise
            except Exception as error:
                if not episode.finish_reason:  # else the engine ended the episode (_end raises to get here)
                    self._end(episode, Ending.ERROR, error=f"{type(error).__name__}: {error}", raise_=False)
            if session is not None and episode.error is None:
                await self._score(episode, session)
            played = True
        finally:  # also when the run is cancelled or fails: the env's worker is given back
            try:
                if session is not None:
                    await self._close(session, wait=played)
            finally:
                live.release()
        episode.timings["total"] = time.perf_counter() - started

    async def _chat(self, episode: Episode, sampling: SamplingParams) -> Any:
        """The model's next turn (a :class:`~envkit.backends.ChatReply`), tried twice, as the token engine does."""
        seed = None
        if sampling.seed is not None:  # one seed per request: group members never share a sample
            seed = request_seed(sampling.seed, episode.task_seed, episode.group_index, episode.turns)
        start = time.perf_counter()
        failures = []
        try:
            for _ in range(2):
                try:
                    return await self.backend.achat(
                        episode.messages, episode.tools or None, sampling, seed, timeout_s=self.generate_timeout_s
                    )
                except GenerationTimeout as error:  # a hung server: retrying would only wait again
                    self._end(
                        episode,
                        Ending.ERROR,
                        error=f"{error} (if generations are this slow, raise generate_timeout_s / --generate-timeout)",
                    )
                except Exception as error:
                    failures.append(f"{type(error).__name__}: {error}")
        finally:
            episode.timings["generate"] += time.perf_counter() - start
        self._end(episode, Ending.ERROR, error=f"generation failed twice: {failures[-1]}")
        raise AssertionError("unreachable")
