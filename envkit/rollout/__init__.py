"""The rollout engine: many multi-turn episodes at once, token-exact (see :mod:`envkit.rollout.engine`)."""

from envkit.backends import SamplingParams
from envkit.rollout.batching import GenerationTimeout
from envkit.rollout.chat_engine import ChatRolloutEngine
from envkit.rollout.engine import RolloutEngine
from envkit.rollout.episode import Episode, summarize, teacher_forced_logprobs

__all__ = [
    "ChatRolloutEngine",
    "Episode",
    "GenerationTimeout",
    "RolloutEngine",
    "SamplingParams",
    "summarize",
    "teacher_forced_logprobs",
]
