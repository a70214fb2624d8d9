"""envkit init: the names it derives, the files it writes (which pass `envkit validate` and their own tests as
generated), and its refusal to overwrite anything."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envkit.cli.app import main
from envkit.cli.scaffold import env_names

ROOT = Path(__file__).resolve().parents[1]
RUFF = Path(sys.executable).parent / "ruff"


@pytest.mark.parametrize(
    ("name", "module", "class_name", "short"),
    [
        ("price-check", "price_check", "PriceCheckEnv", "price-check"),
        ("price_check", "price_check", "PriceCheckEnv", "price-check"),
        ("PriceCheck", "price_check", "PriceCheckEnv", "price-check"),
        ("my-env", "my_env", "MyEnv", "my-env"),
        ("HTTPFetch2", "http_fetch2", "HttpFetch2Env", "http-fetch2"),
        ("sudoku", "sudoku", "SudokuEnv", "sudoku"),
    ],
)
def test_names_derived_from_name(name, module, class_name, short):
    names = env_names(name)
    assert (names.module, names.class_name, names.name) == (module, class_name, short)
    assert names.module.isidentifier() and names.class_name.isidentifier()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("2fast", "must start with a letter"),
        ("my env", "must start with a letter"),
        ("my--env", "must start with a letter"),
        ("env.py", "must start with a letter"),
        ("json", "module 'json', which would shadow another module"),
        ("envkit", "module 'envkit', which would shadow another module"),
        ("Lambda", "module 'lambda', which would shadow another module"),
        ("datasets", "module 'datasets', which would shadow another module"),  # an installed package
        ("Tokenizers", "module 'tokenizers', which would shadow another module"),
    ],
)
def test_a_bad_name_is_one_line_and_exit_2(name, message, tmp_path, capsys):
    assert main(["init", name, "--dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: NAME") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def run_generated_tests(folder: Path, test_file: str) -> subprocess.CompletedProcess:
    """pytest on a generated test file, in its own process and folder (as a user would run it)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test_file],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize(
    ("argv", "module", "class_name", "base", "tests"),
    [
        (["price-check"], "price_check", "PriceCheckEnv", "envkit.ToolEnv", 16),
        (["SumGame", "--no-tools"], "sum_game", "SumGameEnv", "envkit.Env", 14),
    ],
)
def test_the_generated_env_passes_validate_and_its_own_tests(argv, module, class_name, base, tests, tmp_path, capsys):
    folder = tmp_path / "envs"
    assert main(["init", *argv, "--dir", str(folder)]) == 0
    out = capsys.readouterr().out
    files = [f"{module}.py", f"test_{module}.py", f"{module}_README.md"]
    assert sorted(p.name for p in folder.iterdir()) == sorted(files)
    assert f"created {class_name} ({base})" in out and f"envkit validate {folder / module}.py:{class_name}" in out
    source = (folder / f"{module}.py").read_text()
    assert f"class {class_name}({base}):" in source and '"""' in source
    assert ("@envkit.tool" in source) == (base == "envkit.ToolEnv")
    assert f"envkit validate {module}.py:{class_name}" in (folder / f"{module}_README.md").read_text()

    assert main(["validate", f"{folder / module}.py:{class_name}"]) == 0
    report = " ".join(capsys.readouterr().out.split())  # the table wraps long lines
    counts = re.search(r"validation passed \(([^)]*)\)", report)
    assert counts and "WARN" not in counts.group(1), report  # nothing fails, nothing even warns

    result = run_generated_tests(folder, f"test_{module}.py")
    assert result.returncode == 0 and f"{tests} passed" in result.stdout, result.stdout + result.stderr


@pytest.mark.skipif(not RUFF.exists(), reason="ruff is not installed in this environment (pip install -e '.[dev]')")
@pytest.mark.parametrize("argv", [["price-check"], ["sum-game", "--no-tools"]])
def test_the_generated_code_is_ruff_clean(argv, tmp_path):
    assert main(["init", *argv, "--dir", str(tmp_path)]) == 0
    options = ["--isolated", "--line-length", "120"]
    for arguments in (["check", *options, "--select", "E,F,W,I,UP,B,SIM,RUF"], ["format", *options, "--check"]):
        result = subprocess.run([str(RUFF), *arguments, "."], cwd=tmp_path, capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr


def test_it_never_overwrites_a_file(tmp_path, capsys):
    existing = tmp_path / "test_price_check.py"
    existing.write_text("# mine\n")
    assert main(["init", "price-check", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {existing} already exists; not overwriting it (pick another NAME or --dir)\n"
    assert existing.read_text() == "# mine\n" and sorted(p.name for p in tmp_path.iterdir()) == [existing.name]
    assert main(["init", "price-check", "--dir", str(existing)]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err


def test_the_default_folder_is_named_after_the_module(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "word-count", "--no-tools"]) == 0
    assert sorted(p.name for p in (tmp_path / "word_count").iterdir()) == [
        "test_word_count.py",
        "word_count.py",
        "word_count_README.md",
    ]
    assert main(["init", "word-count"]) == 2  # the second time, the files exist
    assert "word_count.py already exists" in capsys.readouterr().err


def test_the_templates_ship_inside_the_package():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from Python 3.11")
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["envkit.cli"]
    templates = sorted((ROOT / "envkit" / "cli" / "scaffold_templates").iterdir())
    assert templates
    for path in templates:
        relative = path.relative_to(ROOT / "envkit" / "cli").as_posix()
        assert any(fnmatch.fnmatch(relative, p) for p in patterns), f"{relative} is not in package-data"
