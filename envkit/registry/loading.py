"""Loading env classes from modules and files: ``package.module:Class``, ``path/to/file.py[:Class]`` (a file may
import the modules beside it, as a script does) and the checks that what was found is an env class."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym

from envkit.core.env import Env


class EnvSpecError(ValueError):
    """An environment spec that names nothing loadable; the message says what exists."""


def is_user_env_class(value: Any) -> bool:
    """An env class that is not one of envkit's own bases (``Env``, ``ToolEnv``, …)."""
    if not (isinstance(value, type) and issubclass(value, Env)):
        return False
    module = value.__module__
    return module.partition(".")[0] != "envkit" or module.startswith("envkit.envs.")


def only_env_class(module: Any, spec: str) -> type:
    """The one env class of a file given without ``:Class``: the one defined there, else the one imported there."""
    classes = [v for v in vars(module).values() if is_user_env_class(v)]
    defined = [cls for cls in classes if cls.__module__ == module.__name__]
    candidates = defined or classes
    if len(candidates) == 1:
        return candidates[0]
    names = sorted({cls.__name__ for cls in candidates})
    if not names:
        raise EnvSpecError(f"{spec} defines no env class (a subclass of envkit.Env or envkit.ToolEnv)")
    raise EnvSpecError(f"{spec} has {len(names)} env classes ({', '.join(names)}): name one, e.g. {spec}:{names[0]}")


def import_entry_point(module_name: str) -> Any:
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


def load_file(path_text: str) -> Any:
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


def check_env_class(cls: Any, spec: str, allow_seed_style: bool = False) -> type[Env]:
    if allow_seed_style and isinstance(cls, type) and hasattr(cls, "build_dataset") and hasattr(cls, "score_episode"):
        return cls
    if not (isinstance(cls, type) and issubclass(cls, gym.Env)):
        raise EnvSpecError(f"{spec} is not an env class (got {cls!r}); subclass envkit.Env or envkit.ToolEnv")
    return cls
