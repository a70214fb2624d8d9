"""envkit: Gym-style environments for multi-turn, tool-using LLM agents.

Write an env by subclassing :class:`Env` or :class:`ToolEnv`, check it with ``envkit validate``, roll it out with the
rollout engine and train on it with GRPO (TRL). ``import envkit`` registers the built-in envs with :func:`make` and
Gymnasium. The package map is ARCHITECTURE.md.
"""

from pathlib import Path as _Path

# Run from a clone (its root on sys.path, no install), envkit.adapters and envkit.envs are the clone's adapters/ and
# envs/ beside this folder (the design card's layout; setup.py maps them the same way for an install).
if (_Path(__file__).parent.parent / "setup.py").is_file() and (_Path(__file__).parent.parent / "adapters").is_dir():
    __path__.append(str(_Path(__file__).parent.parent))

from envkit.chat import ChatRenderer, TemplateError, parse_assistant
from envkit.core import Ending, Env, Message, MessageSpace, ToolDefinitionError, ToolEnv, ToolError, tool
from envkit.registry import EnvSpecError, make, parse_config, register, registered, resolve, resolve_target

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

import envkit.envs  # noqa: F401  (registers the built-in envs; after the names above, which they import)
