"""Find and build environments: registered short names, ``package.module:Class``, ``path/to/file.py:Class``, and
adapter specs for envs of other libraries (``openenv:…``, ``reasoning-gym:…``, ``textarena:…``, ``trl:…``)."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym

from envkit.core.env import Env
from envkit.util.options import ENV_CONFIG_NAMES


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
            "envkit.integrations.openenv:env_class",
            "openenv",
            "openenv",
            "openenv:ws://127.0.0.1:8000",
            "an OpenEnv env: a running server (ws:// or http:// URL) or an Environment class (package.module:Class)",
        ),
        AdapterFamily(
            "mcp",
            "envkit.integrations.mcp:env_class",
            "mcp",
            "mcp",
            "mcp:stdio:python server.py",
            "an MCP tool server (stdio:COMMAND or an http:// URL); its task from task='module:Class' or tasks=[...]",
        ),
        AdapterFamily(
            "reasoning-gym",
            "envkit.integrations.reasoning_gym:env_class",
            "reasoning_gym",
            "reasoning-gym",
            "reasoning-gym:leg_counting",
            "a reasoning-gym dataset: one item per task seed, scored by the dataset's own scorer",
        ),
        AdapterFamily(
            "textarena",
            "envkit.integrations.textarena:env_class",
            "textarena",
            "textarena",
            "textarena:TicTacToe-v0",
            "a TextArena game that runs offline",
        ),
        AdapterFamily(
            "trl",
            "envkit.integrations.trl_env:env_class",
            "trl",
            "",
            "trl:package.module:Class",
            "a class written for TRL's environment_factory, unchanged: its public methods are the tools",
        ),
        AdapterFamily(
            "seed",
            "envkit.integrations.trl_env:seed_style_env_class",
            "envkit",
            "",
            "seed:package.module:Class",
            "a seed-style class (build_dataset, score_episode, get_tools): one dataset row per task seed",
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
    if ":" not in spec and spec.endswith(".py"):  # a file with one env class needs no ':Class'
        return _check_env_class(_only_env_class(_load_file(spec), spec), spec, allow_seed_style)
    if ":" not in spec:
        known = ", ".join(sorted(_REGISTRY)) or "(none)"
        raise EnvSpecError(
            f"unknown env {spec!r}. Registered envs: {known}. Or give 'package.module:Class' or 'path/to/file.py:Class'"
        )
    target, _, class_name = spec.rpartition(":")
    module = _load_file(target) if target.endswith(".py") or "/" in target else _import(target)
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(n for n, v in vars(module).items() if _is_user_env_class(v))
        raise EnvSpecError(f"{target} has no class {class_name!r}; env classes there: {', '.join(found) or 'none'}")
    return _check_env_class(cls, spec, allow_seed_style)


def _is_user_env_class(value: Any) -> bool:
    """An env class that is not one of envkit's own bases (``Env``, ``ToolEnv``, …)."""
    if not (isinstance(value, type) and issubclass(value, Env)):
        return False
    module = value.__module__
    return module.partition(".")[0] != "envkit" or module.startswith("envkit.envs.")


def _only_env_class(module: Any, spec: str) -> type:
    """The one env class of a file given without ``:Class``: the one defined there, else the one imported there."""
    classes = [v for v in vars(module).values() if _is_user_env_class(v)]
    defined = [cls for cls in classes if cls.__module__ == module.__name__]
    candidates = defined or classes
    if len(candidates) == 1:
        return candidates[0]
    names = sorted({cls.__name__ for cls in candidates})
    if not names:
        raise EnvSpecError(f"{spec} defines no env class (a subclass of envkit.Env or envkit.ToolEnv)")
    raise EnvSpecError(f"{spec} has {len(names)} env classes ({', '.join(names)}): name one, e.g. {spec}:{names[0]}")


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
        try:
            return importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            # The ``envkit`` console script's sys.path has no current directory (``python -m`` and scripts do):
            # 'module:Class' names a module here as it would for ``python -c 'import module'``.
            missing = error.name or ""
            if not (module_name == missing or module_name.startswith(missing + ".")) or not _add_cwd_to_path():
                raise
            return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise EnvSpecError(f"cannot import module {module_name!r}: {error}") from error
    except Exception as error:
        raise EnvSpecError(f"importing {module_name} failed: {type(error).__name__}: {error}") from error


def _add_cwd_to_path() -> bool:
    """Append the current directory to ``sys.path`` (after installed packages) unless it is there; whether it was
    added. Process and Ray workers get the parent's ``sys.path``, so they import the same module."""
    cwd = os.getcwd()
    if "" in sys.path or cwd in sys.path or str(Path(cwd).resolve()) in sys.path:
        return False
    sys.path.append(cwd)
    importlib.invalidate_caches()
    return True


def _load_file(path_text: str) -> Any:
    """The module of a ``.py`` file, which may import the modules beside it as a script does.

    A file in a package (its folder has ``__init__.py``, like envkit's own ``envs/hotel_booking``) is loaded as a
    module of that package, so relative imports (``from .world import World``) work. An import of a sibling by name
    (``import world`` finding ``world.py`` or ``world/`` beside the file), or of the file's own package by name
    (``from my_env.world import World``), puts the folder that holds it on ``sys.path`` (as ``python path/to/file.py``
    puts the script's folder there) and loads the file again; a file that imports no sibling leaves ``sys.path`` alone.
    """
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise EnvSpecError(f"no such file: {path_text}")
    folder = path.parent
    # Stable module names per file, registered in sys.modules, so that instances pickle and process pools work.
    package = None
    if (folder / "__init__.py").is_file() and path.name != "__init__.py" and path.stem.isidentifier():
        package = f"envkit_user_{_identifier(folder.name)}_{hashlib.sha1(str(folder).encode()).hexdigest()[:8]}"
        name = f"{package}.{path.stem}"
    else:
        name = f"envkit_user_{_identifier(path.stem)}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    for attempt in range(2):
        try:
            return _exec_file(name, package, path, folder)
        except EnvSpecError:
            raise
        except Exception as error:
            for loaded in [n for n in sys.modules if n == name or (package and n.partition(".")[0] == package)]:
                del sys.modules[loaded]
            root = _sibling_root(error, folder, package is not None) if attempt == 0 else None
            if root is None:
                raise EnvSpecError(f"importing {path_text} failed: {type(error).__name__}: {error}") from error
            sys.path.insert(0, root)
            importlib.invalidate_caches()
    raise AssertionError("unreachable")


def _exec_file(name: str, package: str | None, path: Path, folder: Path) -> Any:
    if package is not None:
        _load_package(package, folder)
        return importlib.import_module(name)
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise EnvSpecError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    return module


def _sibling_root(error: Exception, folder: Path, in_package: bool) -> str | None:
    """The folder to put on ``sys.path`` when ``error`` is a failed import of a module beside the file (or of the
    file's own package by name) and that folder is not there yet; else None."""
    if not isinstance(error, ModuleNotFoundError) or not error.name:
        return None
    top = error.name.partition(".")[0]
    if (folder / f"{top}.py").is_file() or (folder / top).is_dir():
        root = folder
    elif in_package and top == folder.name:
        root = folder.parent
    else:
        return None
    return None if str(root) in sys.path else str(root)


def _load_package(name: str, folder: Path) -> None:
    """Register ``folder`` (which has an ``__init__.py``) as the package ``name`` and run its ``__init__``."""
    if name in sys.modules:
        return
    package_spec = importlib.util.spec_from_file_location(
        name, folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    if package_spec is None or package_spec.loader is None:
        raise EnvSpecError(f"cannot load {folder} as a Python package")
    module = importlib.util.module_from_spec(package_spec)
    sys.modules[name] = module
    package_spec.loader.exec_module(module)


def _identifier(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def _check_env_class(cls: Any, spec: str, allow_seed_style: bool = False) -> type[Env]:
    if allow_seed_style and isinstance(cls, type) and hasattr(cls, "build_dataset") and hasattr(cls, "score_episode"):
        return cls
    if not (isinstance(cls, type) and issubclass(cls, gym.Env)):
        raise EnvSpecError(f"{spec} is not an env class (got {cls!r}); subclass envkit.Env or envkit.ToolEnv")
    return cls
