"""The package layout of ARCHITECTURE.md, held against the code: no import circle and no package importing from a
layer above its own.

The design card's top level: the core in ``envkit/``, the bridges to outside systems in ``adapters/`` (installed as
``envkit.adapters``), the built-in envs in ``envs/`` (installed as ``envkit.envs``). Every import counts, those inside
functions too (a lazy import is still a dependency); ``if TYPE_CHECKING:`` blocks do not. A failure names the
importing file, line and module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"envkit": ROOT / "envkit", "envkit.adapters": ROOT / "adapters", "envkit.envs": ROOT / "envs"}
"""Installed package name → its folder in the clone (setup.py maps them)."""

LAYERS: list[tuple[str, ...]] = [
    ("util", "core"),
    ("chat", "registry"),
    ("models", "validate"),
    ("backends", "workers"),
    ("rollout", "envs"),
    ("demos", "serving"),
    ("adapters",),
    ("",),
    ("cli", "testing"),
]
"""Bottom to top: a package imports only from lower layers (and from itself). ``""`` is ``envkit/__init__``, the
facade of the public names, which the command line may use. ``adapters`` is one layer: its subpackages (one per
outside system) may use each other, and the circle test keeps that acyclic."""

RANK = {package: rank for rank, packages in enumerate(LAYERS) for package in packages}
OPTIONAL = {"envkit.adapters.textarena", "envkit.adapters.reasoning_gym", "envkit.adapters.mcp"}
"""Adapters whose outside library is an extra: not imported where it may be missing."""


def _modules() -> dict[str, Path]:
    modules = {}
    for prefix, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [*prefix.split("."), *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for every envkit module ``name`` imports (a ``from X import y`` of a submodule names it)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for node in ast.walk(branch)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([base] if base else [])])
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names if f"{base}.{a.name}" in MODULES]
    # A module's own ancestors are imported before it anyway (``from envkit.envs.tau2 import scoring`` inside
    # envkit.envs.tau2.env): not an edge.
    ancestors = {".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1)}  # not the root: see LAYERS
    return [
        (line, module)
        for line, module in found
        if (module == "envkit" or module.startswith("envkit.")) and module not in ancestors
    ]


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def test_every_package_has_a_layer() -> None:
    assert {_package(name) for name in MODULES} <= set(RANK), "add the new package to LAYERS and ARCHITECTURE.md"


def test_no_package_imports_from_a_layer_above_its_own() -> None:
    upward = [
        f"{MODULES[name].relative_to(ROOT)}:{line} imports {module}"
        f" ({_package(name) or 'envkit'} is layer {RANK[_package(name)]}, {_package(module) or 'envkit'} is layer"
        f" {RANK[_package(module)]})"
        for name, imports in GRAPH.items()
        for line, module in imports
        if module in MODULES and _package(module) != _package(name) and RANK[_package(module)] >= RANK[_package(name)]
    ]
    assert not upward, "\n".join(upward)


def test_no_import_circle() -> None:
    edges = {name: sorted({m for _, m in imports if m in MODULES and m != name}) for name, imports in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> list[str] | None:
        state[name] = 1
        stack.append(name)
        for other in edges[name]:
            if state.get(other) == 1:
                return [*stack[stack.index(other) :], other]
            if other not in state and (circle := visit(other)):
                return circle
        state[name] = 2
        stack.pop()
        return None

    for name in edges:
        if name not in state and (circle := visit(name)):
            pytest.fail("import circle: " + " -> ".join(circle))


def test_the_layer_test_catches_an_upward_import(tmp_path: Path) -> None:
    source = tmp_path / "probe.py"
    source.write_text("def f():\n    from envkit.rollout import RolloutEngine\n")
    assert "envkit.rollout" in {module for _, module in _imports("envkit.core.probe", source)}
    assert RANK[_package("envkit.rollout")] > RANK[_package("envkit.core.probe")]


def test_every_module_imports_in_a_fresh_interpreter() -> None:
    """Every module imports in an interpreter where the test suite has not imported anything yet."""
    names = [name for name in MODULES if name not in OPTIONAL and not name.endswith("__main__")]
    script = f"import importlib, sys\nfor name in {names!r}:\n    importlib.import_module(name)\nprint('ok')\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]


def _private_imports(name: str, path: Path) -> list[tuple[int, str]]:
    """``(line, "module.name")`` for every ``_private`` name ``name`` imports from another envkit module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "envkit":
            if node.module == name:
                continue
            found += [
                (node.lineno, f"{node.module}.{alias.name}")
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return found


def test_no_module_imports_another_modules_private_name():
    """A ``_name`` is its module's own: what another module needs is public (named without ``_``, documented)."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {what}"
        for name, path in MODULES.items()
        for line, what in _private_imports(name, path)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_private_import_check_catches_one(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("from envkit.registry.loading import load_file, _secret\n")
    assert _private_imports("envkit.cli.probe", probe) == [(1, "envkit.registry.loading._secret")]


def test_every_package_that_re_exports_declares_its_public_names():
    """A package ``__init__`` that imports names for its users (names its own code does not use) lists them in
    ``__all__``: no private name, each one importable from the package."""
    import importlib

    problems = []
    for name, path in MODULES.items():
        if path.name != "__init__.py" or name in OPTIONAL:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {
            alias.asname or alias.name
            for n in tree.body
            if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("envkit"))
            for alias in n.names
        }
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        re_exports = imported - used  # imported for the package's users, not for its own code
        declared = next(
            (
                [e.value for e in n.value.elts]
                for n in tree.body
                if isinstance(n, (ast.Assign, ast.AnnAssign))
                and "__all__" in ast.unparse(n.targets[0] if isinstance(n, ast.Assign) else n.target)
            ),
            None,
        )
        if re_exports and declared is None:
            problems.append(f"{name}: re-exports names but has no __all__")
            continue
        module = importlib.import_module(name) if declared else None
        for public in declared or []:
            if public.startswith("_"):
                problems.append(f"{name}.__all__ lists the private {public}")
            elif not hasattr(module, public):
                problems.append(f"{name}.__all__ lists {public}, which it does not have")
    assert not problems, "\n".join(problems)
