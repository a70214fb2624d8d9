"""Module paths from before the package layout (0.1) that stay importable: ``import envkit.parsing`` gives
:mod:`envkit.chat.parsing` itself (the same module object, so classes, monkeypatching and pickles agree), with a
:class:`DeprecationWarning` naming the new path. ``envkit/__init__`` installs the finder; nothing in envkit imports an
old path (``tests/test_layout.py`` checks that)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from collections.abc import Sequence

MOVED: dict[str, str] = {
    "envkit._sync": "envkit.util.background",
    "envkit.cli_commands": "envkit.cli.commands",
    "envkit.cli_config": "envkit.util.options",
    "envkit.demos": "envkit.training.demos",
    "envkit.loading": "envkit.models.loading",
    "envkit.messages": "envkit.core.messages",
    "envkit.model_command": "envkit.cli.model",
    "envkit.parsing": "envkit.chat.parsing",
    "envkit.process_workers": "envkit.workers.processes",
    "envkit.ray_workers": "envkit.workers.ray_actors",
    "envkit.realmodel": "envkit.models.smollm2",
    "envkit.scaffold": "envkit.cli.scaffold",
    "envkit.server": "envkit.serving.openai",
    "envkit.sft": "envkit.training.sft",
    "envkit.tiny_model": "envkit.models.tiny",
    "envkit.tools": "envkit.core.tools",
    "envkit.train": "envkit.training.train",
    "envkit.train_config": "envkit.training.config",
    "envkit.train_progress": "envkit.training.progress",
    "envkit.view": "envkit.cli.view",
    "envkit.vllm_support": "envkit.backends.vllm_support",
    "envkit.adapters._adapted": "envkit.integrations._adapted",
    "envkit.adapters.mcp": "envkit.integrations.mcp",
    "envkit.adapters.openenv": "envkit.integrations.openenv",
    "envkit.adapters.openenv_server": "envkit.serving.openenv",
    "envkit.adapters.reasoning_gym": "envkit.integrations.reasoning_gym",
    "envkit.adapters.textarena": "envkit.integrations.textarena",
    "envkit.adapters.trl": "envkit.training.trl",
    "envkit.adapters.trl_env": "envkit.integrations.trl_env",
}
"""Old module path → where it lives now."""

OLD_PACKAGES = ("envkit.adapters",)
"""Old packages that now exist only to hold moved modules."""


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of :data:`MOVED` (first on ``sys.meta_path``, so an old path never loads a second copy of
    a module) and loads each as its new module."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        """A spec for an old path; ``None`` (not ours) for every other name."""
        if fullname in MOVED:
            return importlib.machinery.ModuleSpec(fullname, self)
        if fullname in OLD_PACKAGES:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        """The default module: :meth:`exec_module` swaps it for the real one."""
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        """Put the new module under the old name (the import system returns what ``sys.modules`` holds)."""
        name = module.__name__
        if name in OLD_PACKAGES:
            module.__path__ = []
            return
        warnings.warn(
            f"{name} moved to {MOVED[name]}: import it from there (the old path will be removed)",
            DeprecationWarning,
            stacklevel=2,
        )
        sys.modules[name] = importlib.import_module(MOVED[name])


def install() -> None:
    """Put :class:`MovedModuleFinder` first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
