"""Importing envkit is cheap and changes nothing else in the interpreter.

``import envkit`` and ``envkit --help`` load no ML stack (transformers, torch, TRL: seconds each): they are imported by
the code that needs them, when it runs. And no module of envkit changes the interpreter for the rest of the process
when it is imported: no warning filters, import hooks, ``sys.path`` entries or environment variables set at module
level (a run may set what it needs while it runs, and undo it).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = [ROOT / "envkit", ROOT / "adapters", ROOT / "envs"]
HEAVY = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "vllm")

REPORT = (
    "import sys\n{body}\nprint('HEAVY:' + ' '.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r}))))"
)


def _heavy_modules_after(body: str) -> list[str]:
    script = REPORT.format(body=body, heavy=HEAVY)
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT.parent
    )
    assert result.returncode == 0, result.stderr[-2000:]
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("HEAVY:")]
    return line.removeprefix("HEAVY:").split()


def test_import_envkit_loads_no_ml_stack():
    assert _heavy_modules_after("import envkit") == []


def test_envkit_help_loads_no_ml_stack():
    body = (
        "from envkit.cli import console_main\nsys.argv = ['envkit', '--help']\n"
        "try:\n    console_main()\nexcept SystemExit:\n    pass"
    )
    assert _heavy_modules_after(body) == []


def test_a_tool_env_still_gets_its_schema_from_transformers():
    """The lazy import is still the one schema source: a tool's JSON schema comes from its docstring and hints."""
    import envkit

    class Probe(envkit.ToolEnv):
        @envkit.tool
        def add(self, a: int, b: int) -> str:
            """Add two numbers.

            Args:
                a: the first
                b: the second
            """
            return str(a + b)

        def reset(self, *, seed=None, options=None):
            return [], {}

        def score(self) -> float:
            return 0.0

    (schema,) = Probe().tools
    assert schema["function"]["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first"}


def _module_level_effects(tree: ast.Module) -> list[tuple[int, str]]:
    """Statements run at import time (module level, and inside module-level ``if``/``try``) that change the process."""
    found = []
    statements = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            statements += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            statements += [s for h in getattr(node, "handlers", []) for s in h.body]
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
            continue
        text = ast.unparse(node)
        for effect in (
            "warnings.filterwarnings",
            "warnings.simplefilter",
            "sys.meta_path",
            "sys.path_hooks",
            "sys.path.",
            "os.environ[",
            "os.environ.setdefault",
            "os.environ.update",
            "os.putenv",
            "logging.basicConfig",
            "signal.signal",
            "sys.excepthook",
            "sys.setrecursionlimit",
            "torch.set_num_threads",
        ):
            if effect in text:
                found.append((node.lineno, effect))
    return found


def test_no_module_changes_the_interpreter_when_imported():
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {effect} at import time"
        for folder in FOLDERS
        for path in sorted(folder.rglob("*.py"))
        for line, effect in _module_level_effects(ast.parse(path.read_text(encoding="utf-8")))
        # envkit/__init__ adds the clone root to its *own* package path (a clone run); that is not sys.path.
    ]
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize(
    "source",
    [
        "import warnings\nwarnings.filterwarnings('ignore')\n",
        "import sys\nif True:\n    sys.meta_path.insert(0, object())\n",
        "import os\ntry:\n    os.environ['X'] = '1'\nexcept Exception:\n    pass\n",
        "import sys\nsys.path.append('/tmp')\n",
    ],
)
def test_the_effect_check_catches_each_kind(source):
    assert _module_level_effects(ast.parse(source))


def test_asking_whether_an_env_is_seed_style_does_not_load_the_validator():
    """``envkit train`` asks ``is_seed_style``; that loads the seed-style module, not the checks or their runner."""
    script = (
        "import sys\nfrom envkit.validate import is_seed_style\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('envkit.validate.'))))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = set(result.stdout.split())
    assert "envkit.validate.seed_style" in loaded
    assert not loaded & {"envkit.validate.runner", "envkit.validate.registry", "envkit.validate.semantic_checks"}


def test_the_validators_public_names_each_resolve_to_the_module_that_defines_them():
    import envkit.validate as validate

    assert sorted(validate.__all__) == sorted(validate._HOMES)
    for name in validate.__all__:
        value = getattr(validate, name)
        home = f"envkit.validate.{validate._HOMES[name]}"
        assert getattr(sys.modules[home], name) is value
    with pytest.raises(AttributeError, match="no attribute 'CHECKS_BY_MAGIC'"):
        validate.CHECKS_BY_MAGIC  # noqa: B018


def test_the_validators_type_checking_imports_are_its_lazy_names():
    """What type checkers and IDEs see (the ``if TYPE_CHECKING:`` imports) is what ``__getattr__`` loads: a name
    added to one and not the other fails here."""
    import ast

    import envkit.validate as validate

    tree = ast.parse(Path(validate.__file__).read_text())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]
    declared = {
        alias.name: node.module.removeprefix("envkit.validate.")
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert declared == validate._HOMES
