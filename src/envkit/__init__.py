"""envkit: Gym-style environments for multi-turn, tool-using LLM agents.

Write an env by subclassing :class:`Env` or :class:`ToolEnv`, check it with ``envkit validate``, roll it out with the
rollout engine and train on it with GRPO (TRL). ``import envkit`` registers the built-in envs with :func:`make` and
Gymnasium. The package map is ARCHITECTURE.md; module paths from before it stay importable (:mod:`envkit._moved`).
"""

from envkit import _moved
from envkit.chat import ChatRenderer, TemplateError, parse_assistant
from envkit.core import Ending, Env, Message, MessageSpace, ToolDefinitionError, ToolEnv, ToolError, tool
from envkit.registry import EnvSpecError, make, parse_config, register, registered, resolve, resolve_target

_moved.install()

__version__ = "0.1.0"

__all__ = [
    "ChatRenderer",
    "Ending",
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

import envkit.envs  # noqa: E402, F401  (registers the built-in envs; after the names above, which they import)
