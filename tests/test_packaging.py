"""The installed package holds every module of the source tree (an explicit `packages` list forgets new ones)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
ROOT = Path(__file__).resolve().parents[1]


def test_every_source_folder_is_a_package_that_installs():
    """``packages.find`` (pyproject) installs folders with an ``__init__.py`` only: a folder of modules without one
    would be left out of the wheel."""
    from setuptools import find_packages

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["packages"]["find"]["where"] == ["src"]
    found = {
        ".".join(path.parent.relative_to(ROOT / "src").parts)
        for path in (ROOT / "src" / "envkit").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    missing = found - set(find_packages(str(ROOT / "src")))
    assert not missing, f"add an __init__.py to: {sorted(missing)}"


RUNTIME_SOURCES = [ROOT / "src" / "envkit"]


def _package_of(path: Path) -> list[str]:
    """The package a runtime source file belongs to (``envkit/chat/x.py`` is in ``envkit.chat``)."""
    return list(path.relative_to(ROOT / "src").parts[:-1])


def _imported_modules(tree: ast.AST, package: list[str]) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names |= {f"{module}.{alias.name}" for alias in node.names}
    return names


def runtime_offences(path: Path) -> list[str]:
    """Why ``path`` (a runtime module) depends on the test helpers or on ``../shared``; empty when it does not."""
    tree = ast.parse(path.read_text())
    imported = _imported_modules(tree, _package_of(path))
    helpers = {m for m in imported if m.split(".")[0] in {"tests", "conftest"} or m.startswith("envkit.testing")}
    strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    offences = [f"imports {sorted(helpers)}"] if helpers else []
    if any("envkit.testing" in s for s in strings):
        offences.append("names envkit.testing")
    if any(s == "shared" or "../shared" in s or "shared/tokenizers" in s for s in strings):
        offences.append("names ../shared")
    return offences


def test_runtime_code_never_imports_test_helpers_nor_reads_shared():
    """What envkit does at run time cannot depend on the test helpers or on where it runs (no ``../shared``)."""
    offenders = []
    for source in RUNTIME_SOURCES:
        for path in source.rglob("*.py"):
            if path == ROOT / "src" / "envkit" / "testing.py":  # the test helpers themselves
                continue
            offenders += [f"{path.relative_to(ROOT)} {why}" for why in runtime_offences(path)]
    assert not offenders, offenders


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("envkit/backends", "from envkit.testing import build_tokenizer"),
        ("src/envkit", "from . import testing"),
        ("src/envkit", "from .testing import build_tiny_model"),
        ("envkit/backends", "from .. import testing"),
        ("envkit/backends", "import envkit.testing"),
        ("envkit/integrations", "import importlib\nimportlib.import_module('envkit.testing')"),
        ("envkit/envs", "from tests.helpers import call"),
        ("src/envkit", "from pathlib import Path\nROOT = Path(__file__).parents[3] / 'shared' / 'tokenizers'"),
        ("src/envkit", "TOKENIZERS = '../shared/tokenizers'"),
    ],
)
def test_the_runtime_check_catches_each_way_in(where, source, tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    module = tmp_path / where / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text(source + "\n")
    assert runtime_offences(module)


def test_the_runtime_check_passes_ordinary_imports(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    module = tmp_path / "src" / "envkit" / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text("from . import chat\nfrom .rollout import RolloutEngine\nimport json\n")
    assert runtime_offences(module) == []
