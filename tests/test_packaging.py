"""The installed package holds every module of the source tree (an explicit `packages` list forgets new ones)."""

from __future__ import annotations

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
