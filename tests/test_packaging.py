"""How envkit installs: the design card's three folders (``envkit/``, ``adapters/`` as ``envkit.adapters``, ``envs/``
as ``envkit.envs``) as one package, from an editable install, a wheel, and with Python started in the clone's root or
in its parent (where a folder named ``envkit`` could shadow the installed package); and runtime code that never
depends on the test helpers."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"envkit": ROOT / "envkit", "envkit.adapters": ROOT / "adapters", "envkit.envs": ROOT / "envs"}
PROBE = (
    "import envkit, envkit.adapters.trl, envkit.envs.tau2, envkit.adapters.vllm.servers;"
    "print(envkit.__file__); print(envkit.adapters.trl.__file__); print(envkit.envs.tau2.__file__);"
    "print(envkit.make('arithmetic').__class__.__name__)"
)


def _source_modules() -> set[str]:
    """Every module of the three folders by its path in a wheel (``adapters/x.py`` is ``envkit/adapters/x.py``)."""
    found = set()
    for name, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            if "__pycache__" not in path.parts:
                found.add("/".join([*name.split("."), *path.relative_to(folder).parts]))
    return found


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """envkit built as a wheel by pip, as a release would be. It builds from a copy of the sources: a build in the
    clone leaves ``envkit_rl.egg-info`` in its root, which then shadows the installed metadata for every Python
    started there."""
    source = tmp_path_factory.mktemp("source")
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for folder in FOLDERS.values():
        shutil.copytree(folder, source / folder.name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(source), "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=out,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    return next(out.glob("envkit_rl-*.whl"))


@pytest.fixture(scope="module")
def wheel_site(wheel, tmp_path_factory) -> Path:
    """The wheel installed into a folder of its own (put first on ``PYTHONPATH``: it wins over the editable install)."""
    site = tmp_path_factory.mktemp("site")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    return site


def _probe(cwd: Path, pythonpath: Path | None = None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.split()


def test_the_wheel_holds_every_module_under_its_installed_name(wheel):
    names = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
    missing = _source_modules() - names
    assert not missing, f"not in the wheel: {sorted(missing)[:10]}"
    assert {n for n in names if n.split("/")[0] != "envkit"} == set(), "the wheel installs only the envkit package"


def test_a_wheel_install_imports_the_three_folders_as_one_package(wheel_site, tmp_path):
    core, trl, tau2, made = _probe(tmp_path, wheel_site)
    assert Path(core).parent == wheel_site / "envkit"
    assert Path(trl) == wheel_site / "envkit" / "adapters" / "trl" / "__init__.py"
    assert Path(tau2) == wheel_site / "envkit" / "envs" / "tau2" / "__init__.py"
    assert made == "ArithmeticEnv"


def _require_editable_install(cwd: Path) -> None:
    editable = subprocess.run(
        [
            sys.executable,
            "-c",
            "import importlib.metadata as m; print(m.distribution('envkit-rl').read_text('direct_url.json'))",
        ],
        capture_output=True,
        text=True,
        cwd=cwd,
    ).stdout
    if '"editable": true' not in editable:
        pytest.skip("envkit is not installed editable in this interpreter (the wheel tests cover the install)")


def test_an_editable_install_maps_the_three_folders(tmp_path):
    _require_editable_install(tmp_path)
    core, trl, tau2, _ = _probe(tmp_path)
    assert (Path(core).parent, Path(trl).parent, Path(tau2).parent) == (
        ROOT / "envkit",
        ROOT / "adapters" / "trl",
        ROOT / "envs" / "tau2",
    )


def test_python_started_in_the_clone_root_uses_the_clone_whole(wheel_site):
    """The clone's ``envkit/`` shadows the installed package there: its ``envkit.adapters`` and ``envkit.envs`` must
    then be the clone's too (``envkit/__init__`` adds the clone root to the package path), never a mix or a miss."""
    core, trl, tau2, made = _probe(ROOT, wheel_site)
    assert (Path(core).parent, Path(trl).parent, Path(tau2).parent) == (
        ROOT / "envkit",
        ROOT / "adapters" / "trl",
        ROOT / "envs" / "tau2",
    )
    assert made == "ArithmeticEnv"


def test_python_started_in_the_parent_of_a_clone_named_envkit_uses_the_install(wheel_site, tmp_path):
    """``git clone …/envkit`` then ``python`` one folder up: the clone is a folder named ``envkit`` on ``sys.path``
    without an ``__init__.py`` (a namespace portion), and the installed regular package wins over it."""
    (tmp_path / "envkit").symlink_to(ROOT, target_is_directory=True)
    core, trl, _, made = _probe(tmp_path, wheel_site)
    assert Path(core).parent == wheel_site / "envkit" and Path(trl).parent == wheel_site / "envkit" / "adapters" / "trl"
    assert made == "ArithmeticEnv"


RUNTIME_SOURCES = list(FOLDERS.values())


def _package_of(path: Path) -> list[str]:
    """The package a runtime source file belongs to (``adapters/trl/x.py`` is in ``envkit.adapters.trl``)."""
    for name, folder in FOLDERS.items():
        if path.is_relative_to(folder):
            return [*name.split("."), *path.relative_to(folder).parts[:-1]]
    return list(path.relative_to(ROOT).parts[:-1])


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
            if path == ROOT / "envkit" / "testing.py":  # the test helpers themselves
                continue
            offenders += [f"{path.relative_to(ROOT)} {why}" for why in runtime_offences(path)]
    assert not offenders, offenders


@pytest.mark.parametrize(
    ("where", "source"),
    [
        ("envkit/backends", "from envkit.testing import build_tokenizer"),
        ("envkit", "from . import testing"),
        ("envkit", "from .testing import build_tiny_model"),
        ("envkit/backends", "from .. import testing"),
        ("envkit/backends", "import envkit.testing"),
        ("adapters", "import importlib\nimportlib.import_module('envkit.testing')"),
        ("envs", "from tests.helpers import call"),
        ("envkit", "from pathlib import Path\nROOT = Path(__file__).parents[3] / 'shared' / 'tokenizers'"),
        ("envkit", "TOKENIZERS = '../shared/tokenizers'"),
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
    module = tmp_path / "envkit" / "probe.py"
    module.parent.mkdir(parents=True)
    module.write_text("from . import chat\nfrom .rollout import RolloutEngine\nimport json\n")
    assert runtime_offences(module) == []


def test_python_started_in_the_parent_of_a_clone_named_envkit_uses_the_editable_install(tmp_path):
    """The same trap with an editable install: setuptools' default import hook answers only after Python's own path
    search, which found the clone as an empty namespace package (``envkit.Env`` missing, pypa/setuptools#3557); the
    clone's root on ``sys.path`` (setup.py's default editable mode) makes its ``envkit/`` the regular package that
    wins."""
    _require_editable_install(tmp_path)
    (tmp_path / "envkit").symlink_to(ROOT, target_is_directory=True)
    core, trl, tau2, made = _probe(tmp_path)
    assert (Path(core).parent, Path(trl).parent, Path(tau2).parent) == (
        ROOT / "envkit",
        ROOT / "adapters" / "trl",
        ROOT / "envs" / "tau2",
    )
    assert made == "ArithmeticEnv"
