"""Env names and specs: :func:`register` / :func:`make` (with Gymnasium ids), specs such as ``"hotel-booking"``,
``"pkg.module:Class"``, ``"path/to/env.py:Class"`` and adapter families (``"openenv:…"``, ``"mcp:…"``), and env
config parsing. Adapter families are named by entry-point strings, so this package imports no integration."""

from envkit.registry.specs import (
    ADAPTER_FAMILIES,
    ENV_CONFIG_NAMES,
    AdapterFamily,
    EnvSpecError,
    make,
    merge_env_config,
    parse_config,
    register,
    registered,
    resolve,
    resolve_target,
)

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
