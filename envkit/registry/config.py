"""An env's constructor arguments as every command reads them: ``--env-config`` / ``--rl-env-config`` (JSON on the
command line or a mapping in a YAML ``--config`` file)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from envkit.registry.loading import EnvSpecError
from envkit.util.options import ENV_CONFIG_NAMES


def parse_config(text: str | None, flag: str) -> dict[str, Any]:
    """A JSON object of constructor arguments given on the command line (``--config``, ``--rl-env-config``)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise EnvSpecError(f"{flag} is not valid JSON ({error.msg} at position {error.pos}): {text}") from None
    if not isinstance(value, dict):
        raise EnvSpecError(f"{flag} must be a JSON object of constructor arguments, got {type(value).__name__}")
    return value


def merge_env_config(
    command_line: Mapping[str, Any] | None = None, config_file: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The env's constructor arguments from ``--env-config`` / ``--rl-env-config``, as every command reads them.

    Args:
        command_line: ``{"env_config": ..., "rl_env_config": ...}`` as typed on the command line (JSON text, a mapping
            or None each).
        config_file: The same two keys from a YAML ``--config`` file (a mapping, or JSON text).

    The two names are one option: using both, wherever each is given, raises :class:`EnvSpecError`. The file's
    mapping and the command line's are merged key by key, the command line winning. A value that is not a JSON object
    (or a mapping) raises :class:`EnvSpecError` too, in one line.
    """
    sources = [config_file or {}, command_line or {}]
    if sum(any(source.get(name) is not None for source in sources) for name in ENV_CONFIG_NAMES) > 1:
        raise EnvSpecError("--env-config and --rl-env-config are the same option; give one")
    merged: dict[str, Any] = {}
    for source in sources:
        for name in ENV_CONFIG_NAMES:
            value = source.get(name)
            if value is None:
                continue
            flag = "--" + name.replace("_", "-")
            if not isinstance(value, (Mapping, str)):
                raise EnvSpecError(f"{flag} must be a mapping of constructor arguments, got {value!r:.80}")
            merged.update(value if isinstance(value, Mapping) else parse_config(value, flag))
    return merged
