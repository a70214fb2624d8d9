"""Env names and specs: :func:`register` / :func:`make` (with Gymnasium ids), specs such as ``"hotel-booking"``,
``"pkg.module:Class"``, ``"path/to/env.py:Class"`` and adapter families (``"openenv:…"``, ``"mcp:…"``), and env
config parsing. Adapter families are named by entry-point strings, so this package imports no integration.

Modules: :mod:`~envkit.registry.names` (short names, ``resolve``, ``make``), :mod:`~envkit.registry.loading` (classes
from modules and files), :mod:`~envkit.registry.families` (other libraries' envs), :mod:`~envkit.registry.config`
(constructor arguments from the command line and config files)."""

from envkit.registry.config import merge_env_config, parse_config
from envkit.registry.families import ADAPTER_FAMILIES, AdapterFamily
from envkit.registry.loading import EnvSpecError
from envkit.registry.names import make, register, registered, resolve, resolve_target
from envkit.util.options import ENV_CONFIG_NAMES

__all__ = [
    "ADAPTER_FAMILIES",
    "ENV_CONFIG_NAMES",
    "AdapterFamily",
    "EnvSpecError",
    "make",
    "merge_env_config",
    "parse_config",
    "register",
    "registered",
    "resolve",
    "resolve_target",
]
