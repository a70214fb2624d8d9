"""Envs of other libraries named ``PREFIX:REST`` (``openenv:…``, ``mcp:…``, ``reasoning-gym:…``, ``textarena:…``,
``textworld-express:…``, ``scienceworld:…``, ``trl:…``, ``seed:…``): each family is an entry-point string, imported
only when a spec uses it."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from envkit.registry.loading import EnvSpecError
from envkit.util.install import install_command


@dataclass(frozen=True)
class AdapterFamily:
    """Envs from another library, named ``PREFIX:REST`` (e.g. ``reasoning-gym:leg_counting``)."""

    prefix: str
    loader: str
    """``module:function``: ``function(rest)`` returns the env class for the spec's ``REST``."""
    requires: str
    """The module the family needs (``importlib.util.find_spec`` tells whether it is installed)."""
    extra: str
    """The envkit extra that installs it (:func:`envkit.util.install.install_command` gives the command)."""
    example: str
    description: str

    def installed(self) -> bool:
        """Whether the family's package can be imported here."""
        return importlib.util.find_spec(self.requires) is not None


ADAPTER_FAMILIES: dict[str, AdapterFamily] = {
    family.prefix: family
    for family in (
        AdapterFamily(
            "openenv",
            "envkit.adapters.openenv:env_class",
            "openenv",
            "openenv",
            "openenv:ws://127.0.0.1:8000",
            "an OpenEnv env: a running server (ws:// or http:// URL) or an Environment class (package.module:Class)",
        ),
        AdapterFamily(
            "mcp",
            "envkit.adapters.mcp:env_class",
            "mcp",
            "mcp",
            "mcp:stdio:python server.py",
            "an MCP tool server (stdio:COMMAND or an http:// URL); its task from task='module:Class' or tasks=[...]",
        ),
        AdapterFamily(
            "reasoning-gym",
            "envkit.adapters.reasoning_gym:env_class",
            "reasoning_gym",
            "reasoning-gym",
            "reasoning-gym:leg_counting",
            "a reasoning-gym dataset: one item per task seed, scored by the dataset's own scorer",
        ),
        AdapterFamily(
            "textarena",
            "envkit.adapters.textarena:env_class",
            "textarena",
            "textarena",
            "textarena:TicTacToe-v0",
            "a TextArena game that runs offline",
        ),
        AdapterFamily(
            "textworld-express",
            "envkit.adapters.textworld_express:env_class",
            "textworld_express",
            "textworld-express",
            "textworld-express:coin",
            "a TextWorldExpress game (needs Java): one game per task seed in its train/dev/test fold",
        ),
        AdapterFamily(
            "scienceworld",
            "envkit.adapters.scienceworld:env_class",
            "scienceworld",
            "scienceworld",
            "scienceworld:boil",
            "a ScienceWorld task (needs Java): one variation per task seed in its train/dev/test split, score / 100",
        ),
        AdapterFamily(
            "trl",
            "envkit.adapters.trl.env_classes:env_class",
            "trl",
            "",
            "trl:package.module:Class",
            "a class written for TRL's environment_factory, unchanged: its public methods are the tools",
        ),
        AdapterFamily(
            "seed",
            "envkit.adapters.trl.env_classes:seed_style_env_class",
            "envkit",
            "",
            "seed:package.module:Class",
            "a seed-style class (build_dataset, score_episode, get_tools): one dataset row per task seed",
        ),
    )
}
"""Adapter families recognised by :func:`resolve` (and listed by ``envkit list``)."""


_ADAPTER_CLASSES: dict[str, type] = {}


def resolve_adapter(family: AdapterFamily, spec: str, rest: str) -> type:
    """The env class of an adapter spec (built once per spec and process)."""
    if not family.installed():
        install = install_command(family.extra) if family.extra else f"pip install {family.requires}"
        raise EnvSpecError(f"{spec!r} needs the {family.requires!r} package, which is not installed: {install}")
    if not rest:
        raise EnvSpecError(f"{spec!r}: say which env after '{family.prefix}:', e.g. {family.example}")
    if spec in _ADAPTER_CLASSES:
        return _ADAPTER_CLASSES[spec]
    module_name, _, function = family.loader.partition(":")
    cls = getattr(importlib.import_module(module_name), function)(rest)
    _ADAPTER_CLASSES[spec] = cls
    return cls
