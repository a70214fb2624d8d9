"""The installed package holds every module of the source tree (an explicit `packages` list forgets new ones)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
ROOT = Path(__file__).resolve().parents[1]


def test_every_source_package_is_listed_for_installation():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    sources = {name: ROOT / path for name, path in setuptools["package-dir"].items()}
    found = set()
    for name, path in sources.items():
        for init in path.rglob("__init__.py"):
            parts = init.parent.relative_to(path).parts
            if "__pycache__" not in parts:
                found.add(".".join((name, *parts)))
    assert found <= listed, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(found - listed)}"


RUNTIME_SOURCES = [ROOT / "envkit", ROOT / "adapters", ROOT / "envs"]
TEST_HELPERS = {"envkit.testing", "tests", "conftest"}


def _imported_modules(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def test_runtime_code_never_imports_test_helpers_nor_reads_shared():
    """What envkit does at run time cannot depend on the test helpers or on where it runs (no ``../shared``)."""
    offenders = []
    for source in RUNTIME_SOURCES:
        for path in source.rglob("*.py"):
            if path == ROOT / "envkit" / "testing.py":  # the test helpers themselves
                continue
            text = path.read_text()
            tree = ast.parse(text)
            imported = _imported_modules(tree)
            helpers = {m for m in imported if m in TEST_HELPERS or m.split(".")[0] == "tests"}
            helpers |= {m for m in imported if m.startswith("envkit.testing")}
            if helpers:
                offenders.append(f"{path.relative_to(ROOT)} imports {sorted(helpers)}")
            strings = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
            if any("../shared" in s or "shared/tokenizers" in s for s in strings):
                offenders.append(f"{path.relative_to(ROOT)} names ../shared")
    assert not offenders, offenders
