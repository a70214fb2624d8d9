"""envkit: Gym-style environments for multi-turn, tool-using LLM agents.

Write an env by subclassing :class:`Env` or :class:`ToolEnv`, check it with ``envkit validate``, roll it out with the
rollout engine and train on it with GRPO (TRL). ``import envkit`` registers the built-in envs with :func:`make` and
Gymnasium. The package map is ARCHITECTURE.md.
"""

import importlib.machinery as _machinery
import sys as _sys
from pathlib import Path as _Path

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


def _clone_root() -> list[str]:
    """The clone's root, when this package was imported from a clone that nothing maps: an editable install (setup.py
    puts the clone's root on ``sys.path``), Python started in the clone's root with envkit not installed, or installed
    as a wheel that the clone's ``envkit/`` shadows. Then ``envkit.adapters`` and ``envkit.envs`` are the clone's
    ``adapters/`` and ``envs/`` beside this folder (the design card's layout; setup.py maps them the same way for a
    wheel). A wheel has them inside this folder, and an import hook that maps them (setuptools' ``lenient`` editable
    mode) answers for them: nothing is added then, so the package path holds only envkit's own folder."""
    root = _Path(__file__).parent.parent
    if not ((root / "setup.py").is_file() and (root / "adapters" / "__init__.py").is_file()):
        return []
    if (_Path(__file__).parent / "adapters").is_dir():
        return []
    for finder in _sys.meta_path:
        if finder is _machinery.PathFinder or not hasattr(finder, "find_spec"):
            continue
        try:
            if finder.find_spec("envkit.adapters", None) is not None:
                return []
        except Exception:  # a finder of another library that cannot answer for this name
            continue
    return [str(root)]


# Before envkit's own folder, which stays the last entry: tools that read a package's folder from its path's last
# entry (and walk it) see envkit's folder, not the whole clone. The order finds the same modules: the root's other
# folders have no __init__.py (models/, tests/), and a regular package (envkit/models/) wins over a namespace one.
__path__[:0] = _clone_root()

import envkit.envs  # noqa: E402, F401  (registers the built-in envs; after the names above, which they import)
