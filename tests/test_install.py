"""envkit's distribution is ``envkit-rl`` (``envkit`` on PyPI is someone else's package): every message that asks for
an extra names the command that installs it into *this* envkit, derived from the installed metadata."""

from __future__ import annotations

import functools
import importlib.metadata
import re
from pathlib import Path

import pytest

import envkit
from envkit.util import install
from envkit.util.install import DISTRIBUTION, install_command

ROOT = Path(__file__).resolve().parents[1]


def test_the_distribution_is_envkit_rl_and_the_import_name_stays_envkit():
    metadata = importlib.metadata.distribution(DISTRIBUTION)
    assert DISTRIBUTION == metadata.metadata["Name"] == "envkit-rl"
    assert [(e.name, e.value) for e in metadata.entry_points] == [("envkit", "envkit.cli:console_main")]
    assert install.version() == metadata.version
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^name = "envkit-rl"$', pyproject, re.MULTILINE)


def test_an_editable_install_is_told_the_path_of_its_clone(monkeypatch, tmp_path):
    """Also from the clone's root, where the ``envkit_rl.egg-info`` an editable build leaves comes first on
    ``sys.path`` (here a copy of it in ``tmp_path``, put first)."""
    egg_info = tmp_path / "envkit_rl.egg-info"
    egg_info.mkdir()
    (egg_info / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: envkit-rl\nVersion: 0.1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    install._editable_source.cache_clear()
    monkeypatch.setattr(install, "_editable_source", functools.cache(install._editable_source.__wrapped__))
    clone = Path(envkit.__file__).resolve().parents[1]
    if not any(d.read_text("direct_url.json") for d in importlib.metadata.distributions(name=DISTRIBUTION)):
        pytest.skip("envkit is not installed editable here (a wheel install is covered below)")
    assert Path(install._editable_source()) == clone
    assert install_command("tau2") == f"pip install -e '{clone}[tau2]'"


def test_a_wheel_install_is_told_the_distribution(monkeypatch):
    monkeypatch.setattr(install, "_editable_source", lambda: None)
    assert install_command("ray") == "pip install 'envkit-rl[ray]'"


def test_no_message_or_docstring_names_the_other_envkit_on_pypi():
    # PyPI's `envkit` is an unrelated environment-variable parser: no install line may name it with an extra.
    wrong = re.compile(r"pip install '?envkit\[")
    offenders = [
        f"{path.relative_to(ROOT)}:{number}"
        for folder in ("envkit", "adapters", "envs", "tests", "scripts", "benchmarks", "examples")
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in {".py", ".sh", ".md", ".tmpl"} and ".egg-info" not in str(path)
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if wrong.search(line)
    ]
    offenders += [
        f"README.md:{n}"
        for n, line in enumerate((ROOT / "README.md").read_text().splitlines(), 1)
        if wrong.search(line)
    ]
    assert offenders == []
