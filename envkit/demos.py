"""Demonstrations: an env's oracle played through the chat template as token-exact trajectories.

The oracle's actions are rendered by the chat template (so the "model tokens" are what a model that had learned the
template would emit), env messages are appended as template suffixes, and the result is an :class:`Episode` with the
same layout as a rollout: ``prompt_ids``, ``completion_ids`` and ``env_mask``. Used to warm-start a model by
supervised fine-tuning before GRPO (``envkit sft``), and by tests as a scripted policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envkit.chat import ChatRenderer
from envkit.core import Env
from envkit.parsing import parse_assistant
from envkit.rollout import Episode


class NoOracle(ValueError):
    """The env has no ``oracle()``, so it cannot demonstrate its tasks."""


def oracle_episode(env: Env, renderer: ChatRenderer, seed: int, *, max_turns: int | None = None) -> Episode:
    """Play the oracle on task ``seed`` and record it token-exactly."""
    opening, info = env.reset(seed=seed)
    episode = Episode(task_seed=seed, group_index=0, info=dict(info))
    episode.prompt_ids = renderer.prompt_ids(opening)
    limit = max_turns or env.max_turns
    while not env.done and episode.turns < limit:
        action = env.oracle()
        if action is None:
            raise NoOracle(f"{type(env).__name__}.oracle() returned None on seed {seed}")
        prompt = renderer.render(env.messages, add_generation_prompt=True)
        full = renderer.render([*env.messages, action])
        end = full.rfind(renderer.end_of_turn) + len(renderer.end_of_turn)
        generated = renderer.encode(full[len(prompt) : end])
        episode.completion_ids += generated
        episode.env_mask += [1] * len(generated)
        episode.logprobs += [0.0] * len(generated)
        episode.turns += 1
        text = renderer.tokenizer.decode(generated[:-1])
        parsed = parse_assistant(text, renderer.tokenizer, chat_template=renderer.chat_template)
        observation, reward, _terminated, _truncated, step_info = env.step(parsed)
        episode.rewards.append(float(reward))
        episode.num_tool_calls += int(step_info.get("tool_calls", 0))
        episode.tool_errors += int(step_info.get("tool_errors", 0))
        if observation or not env.done:  # no new message but the episode goes on: still open the next turn
            suffix = renderer.suffix_ids(
                env.messages[: len(env.messages) - len(observation)], observation, add_generation_prompt=not env.done
            )
            episode.completion_ids += suffix
            episode.env_mask += [0] * len(suffix)
            episode.logprobs += [0.0] * len(suffix)
    episode.messages = list(env.messages)
    episode.score = float(env.score())
    episode.truncated = not env.done
    episode.finish_reason = "done" if env.done else "max_turns"
    return episode


def oracle_episodes(
    env_factory: Callable[[], Env], tokenizer: Any, seeds: list[int], *, min_score: float = 1.0, **renderer_kwargs: Any
) -> list[Episode]:
    """Oracle demonstrations for ``seeds``, keeping those that reach ``min_score``."""
    env = env_factory()
    renderer = ChatRenderer(tokenizer, getattr(env, "tools", None) or None, **renderer_kwargs)
    episodes = [oracle_episode(env, renderer, seed) for seed in seeds]
    return [e for e in episodes if e.score >= min_score]
