"""envkit: Gym-style environments for multi-turn, tool-using LLM agents.

Write an env by subclassing :class:`Env` or :class:`ToolEnv`, check it with ``envkit validate``, roll it out with the
rollout engine and train on it with GRPO (TRL). ``import envkit`` registers the built-in envs with :func:`make` and
Gymnasium.
"""

from envkit.chat import ChatRenderer, TemplateError
from envkit.core import Env
from envkit.messages import Message, MessageSpace
from envkit.parsing import parse_assistant
from envkit.registry import EnvSpecError, make, parse_config, register, registered, resolve, resolve_target
from envkit.tools import ToolDefinitionError, ToolEnv, ToolError, tool

__version__ = "0.1.0"

__all__ = [
    "ChatRenderer",
    "Env",
    "EnvSpecError",
    "Message",
    "MessageSpace",
    "TemplateError",
    "ToolDefinitionError",
    "ToolEnv",
    "ToolError",
    "make",
    "parse_assistant",
    "parse_config",
    "register",
    "registered",
    "resolve",
    "resolve_target",
    "tool",
]

import envkit.envs  # noqa: F401  (registers the built-in envs)
