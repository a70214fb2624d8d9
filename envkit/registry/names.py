"""Registered short names (``"hotel-booking"``, with their Gymnasium ids) and the way from any spec to an env:
:func:`resolve` (spec → class), :func:`resolve_target` (a command line's env) and :func:`make` (spec → env)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from envkit.core.env import Env
from envkit.registry.families import ADAPTER_FAMILIES, resolve_adapter
from envkit.registry.loading import (
    EnvSpecError,
    check_env_class,
    import_entry_point,
    is_user_env_class,
    load_file,
    only_env_class,
)

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


def resolve(spec: str | type[Env], *, allow_seed_style: bool = False) -> type[Env]:
    """The env class named by ``spec`` (a short name, ``module:Class``, ``file.py:Class``, an adapter spec such as
    ``reasoning-gym:leg_counting`` (see :data:`ADAPTER_FAMILIES`), or a class).

    With ``allow_seed_style``, classes with ``build_dataset`` and ``score_episode`` are accepted too.
    """
    if isinstance(spec, type):
        return check_env_class(spec, spec.__name__, allow_seed_style)
    if not isinstance(spec, str) or not spec:
        raise EnvSpecError(f"an env spec must be a name or 'module:Class', got {spec!r}")
    if spec in _REGISTRY:
        return resolve(_REGISTRY[spec], allow_seed_style=allow_seed_style)
    prefix, _, rest = spec.partition(":")
    if prefix in ADAPTER_FAMILIES:
        return resolve_adapter(ADAPTER_FAMILIES[prefix], spec, rest)
    if ":" not in spec and spec.endswith(".py"):  # a file with one env class needs no ':Class'
        return check_env_class(only_env_class(load_file(spec), spec), spec, allow_seed_style)
    if ":" not in spec:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise EnvSpecError(
            f"unknown env {spec!r}. Registered envs: {known}. Or give 'package.module:Class' or 'path/to/file.py:Class'"
        )
    target, _, class_name = spec.rpartition(":")
    module = load_file(target) if target.endswith(".py") or "/" in target else import_entry_point(target)
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(n for n, v in vars(module).items() if is_user_env_class(v))
        raise EnvSpecError(f"{target} has no class {class_name!r}; env classes there: {', '.join(found) or 'none'}")
    return check_env_class(cls, spec, allow_seed_style)


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


def make(spec: str | type[Env], **config: Any) -> Env:
    """Build an env from a registered short name (``"hotel-booking"``), ``"package.module:Class"`` or
    ``"path/to/file.py:Class"``; ``config`` goes to the constructor."""
    cls = resolve(spec)
    try:
        return cls(**config)
    except (TypeError, ValueError) as error:
        raise EnvSpecError(f"cannot build {cls.__name__} with config {config}: {error}") from error
