"""Find and build environments: registered short names, ``package.module:Class``, ``path/to/file.py:Class``, and
adapter specs for envs of other libraries (``openenv:…``, ``reasoning-gym:…``, ``textarena:…``, ``trl:…``)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from envkit.core import Env


class EnvSpecError(ValueError):
    """An environment spec that names nothing loadable; the message says what exists."""


_REGISTRY: dict[str, str] = {}
"""Short name → ``module:Class`` entry point."""


def register(name: str, entry_point: str, *, gym_id: str | None = None, **gym_kwargs: Any) -> None:
    """Register an environment under a short name (for :func:`make`) and, optionally, a Gymnasium id.

    Args:
        name: Short name, e.g. ``"hotel-booking"``.
        entry_point: ``"package.module:Class"``.
        gym_id: Gymnasium id, e.g. ``"envkit/HotelBooking-v0"``; ``gymnasium.make(gym_id)`` then builds the env
            (its ``.unwrapped`` is the envkit env).
        gym_kwargs: Passed on to ``gymnasium.register`` (e.g. ``kwargs={...}`` defaults).
    """
    _REGISTRY[name] = entry_point
    if gym_id is not None and gym_id not in gym.registry:
        gym.register(id=gym_id, entry_point=entry_point, **gym_kwargs)


def registered() -> dict[str, str]:
    """All registered short names and their entry points."""
    return dict(_REGISTRY)


@dataclass(frozen=True)
class AdapterFamily:
    """Envs from another library, named ``PREFIX:REST`` (e.g. ``reasoning-gym:leg_counting``)."""

    prefix: str
    loader: str
    """``module:function``: ``function(rest)`` returns the env class for the spec's ``REST``."""
    requires: str
    """The module the family needs (``importlib.util.find_spec`` tells whether it is installed)."""
    extra: str
    """The pip extra that installs it: ``pip install 'envkit[EXTRA]'``."""
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
            "trl",
            "envkit.adapters.trl_env:env_class",
            "trl",
            "",
            "trl:package.module:Class",
            "a class written for TRL's environment_factory, unchanged: its public methods are the tools",
        ),
    )
}
"""Adapter families recognised by :func:`resolve` (and listed by ``envkit list``)."""

_ADAPTER_CLASSES: dict[str, type] = {}


def _resolve_adapter(family: AdapterFamily, spec: str, rest: str) -> type:
    """The env class of an adapter spec (built once per spec and process)."""
    if not family.installed():
        install = f"pip install 'envkit[{family.extra}]'" if family.extra else f"pip install {family.requires}"
        raise EnvSpecError(f"{spec!r} needs the {family.requires!r} package, which is not installed: {install}")
    if not rest:
        raise EnvSpecError(f"{spec!r}: say which env after '{family.prefix}:', e.g. {family.example}")
    if spec in _ADAPTER_CLASSES:
        return _ADAPTER_CLASSES[spec]
    module_name, _, function = family.loader.partition(":")
    cls = getattr(importlib.import_module(module_name), function)(rest)
    _ADAPTER_CLASSES[spec] = cls
    return cls


def resolve(spec: str | type[Env], *, allow_seed_style: bool = False) -> type[Env]:
    """The env class named by ``spec`` (a short name, ``module:Class``, ``file.py:Class``, an adapter spec such as
    ``reasoning-gym:leg_counting`` (see :data:`ADAPTER_FAMILIES`), or a class).

    With ``allow_seed_style``, classes with ``build_dataset`` and ``score_episode`` are accepted too.
    """
    if isinstance(spec, type):
        return _check_env_class(spec, spec.__name__, allow_seed_style)
    if not isinstance(spec, str) or not spec:
        raise EnvSpecError(f"an env spec must be a name or 'module:Class', got {spec!r}")
    if spec in _REGISTRY:
        return resolve(_REGISTRY[spec], allow_seed_style=allow_seed_style)
    prefix, _, rest = spec.partition(":")
    if prefix in ADAPTER_FAMILIES:
        return _resolve_adapter(ADAPTER_FAMILIES[prefix], spec, rest)
    if ":" not in spec:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise EnvSpecError(
            f"unknown env {spec!r}. Registered envs: {known}. Or give 'package.module:Class' or 'path/to/file.py:Class'"
        )
    target, _, class_name = spec.rpartition(":")
    module = _load_file(target) if target.endswith(".py") or "/" in target else _import(target)
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(
            n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, Env) and v is not Env
        )
        raise EnvSpecError(f"{target} has no class {class_name!r}; env classes there: {', '.join(found) or 'none'}")
    return _check_env_class(cls, spec, allow_seed_style)


def resolve_target(env: str | None, module: str | None = None, class_name: str | None = None) -> tuple[type, str]:
    """The class named on a command line, by ENV or by the seed-style ``--rl-env-module M --rl-env-class C``.

    Seed-style classes (``build_dataset`` / ``score_episode``) are accepted. Returns the class and its spec.
    """
    if module or class_name:
        if not (module and class_name):
            raise EnvSpecError("--rl-env-module and --rl-env-class go together")
        if env:
            raise EnvSpecError("give either the env or --rl-env-module/--rl-env-class, not both")
        spec = f"{module}:{class_name}"
    elif env:
        spec = env
    else:
        raise EnvSpecError(
            "name the env: a registered name, module:Class or file.py:Class, or --rl-env-module M --rl-env-class C"
        )
    return resolve(spec, allow_seed_style=True), spec


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


ENV_CONFIG_NAMES = ("env_config", "rl_env_config")
"""``--env-config`` and its seed-style alias ``--rl-env-config``: one option under two names."""


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


def make(spec: str | type[Env], **config: Any) -> Env:
    """Build an env from a registered short name (``"hotel-booking"``), ``"package.module:Class"`` or
    ``"path/to/file.py:Class"``; ``config`` goes to the constructor."""
    cls = resolve(spec)
    try:
        return cls(**config)
    except (TypeError, ValueError) as error:
        raise EnvSpecError(f"cannot build {cls.__name__} with config {config}: {error}") from error


def _import(module_name: str) -> Any:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise EnvSpecError(f"cannot import module {module_name!r}: {error}") from error
    except Exception as error:
        raise EnvSpecError(f"importing {module_name} failed: {type(error).__name__}: {error}") from error


def _load_file(path_text: str) -> Any:
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise EnvSpecError(f"no such file: {path_text}")
    # A stable module name per file, registered in sys.modules so that instances pickle and process pools work.
    name = f"envkit_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise EnvSpecError(f"cannot load {path_text} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        raise EnvSpecError(f"importing {path_text} failed: {type(error).__name__}: {error}") from error
    return module


def _check_env_class(cls: Any, spec: str, allow_seed_style: bool = False) -> type[Env]:
    if allow_seed_style and isinstance(cls, type) and hasattr(cls, "build_dataset") and hasattr(cls, "score_episode"):
        return cls
    if not (isinstance(cls, type) and issubclass(cls, gym.Env)):
        raise EnvSpecError(f"{spec} is not an env class (got {cls!r}); subclass envkit.Env or envkit.ToolEnv")
    return cls
