"""The ``mcp`` extra holds mcp below 2 on its own (mcp 2.x renamed ``McpError`` and removed ``mcp.server.fastmcp``,
which envkit's MCP client and its test servers use; ``openenv`` caps mcp below 2 too, so only an install of the
extra without ``openenv`` resolved 2.x).

What each test proves: the first reads the requirement envkit declares and checks that it admits no mcp 2.x and
that the mcp installed here satisfies it and has the names the client imports; it cannot see what a resolver picks.
The second (``-m registry``, outside the default suite) asks pip to resolve the extra's requirements alone, ignoring
what is installed, against the package index, as ``pip install -e '.[mcp]'`` in a fresh venv would.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def mcp_extra() -> list[Requirement]:
    """The requirements of envkit's ``mcp`` extra, as pyproject.toml declares them."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    return [Requirement(line) for line in extras["mcp"]]


def test_the_mcp_extra_admits_no_mcp_2_and_the_installed_mcp_fits_it():
    [mcp] = [r for r in mcp_extra() if r.name == "mcp"]
    assert not [v for v in ("2.0.0", "2.0.1", "2.3.0", "2.99", "3.0") if mcp.specifier.contains(v, prereleases=True)]
    assert mcp.specifier.contains("1.20.0") and mcp.specifier.contains("1.30.0")
    installed = importlib.metadata.version("mcp")
    assert mcp.specifier.contains(installed) and Version(installed) < Version("2")
    from mcp.shared.exceptions import McpError  # what envkit's MCP client catches

    assert issubclass(McpError, Exception)


@pytest.mark.registry
def test_the_mcp_extra_alone_resolves_an_mcp_below_2(tmp_path):
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
    command += ["--report", str(report), *(str(r) for r in mcp_extra())]
    env = {**os.environ, "PIP_CONSTRAINT": ""}  # a machine-wide constraints file must not do the extra's job
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    resolved = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert Version(resolved["mcp"]) < Version("2"), resolved["mcp"]
