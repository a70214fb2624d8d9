"""scripts/test.sh (what CI runs) held against pyproject's pytest settings: every marker the default run leaves out
has a stage of its own that selects its tests by that marker over all of tests/, so a marked test in any file runs
without a list of files to keep up to date (two such lists had left four marked tests unrun)."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent


def excluded_markers(addopts: str) -> set[str]:
    """The markers pytest's ``addopts`` deselect by default (``-m 'not a and not b'``)."""
    words = shlex.split(addopts)
    expression = words[words.index("-m") + 1]
    return set(re.findall(r"\bnot\s+(\w+)", expression))


def pytest_stages(script: str) -> list[tuple[set[str], list[str]]]:
    """Each ``pytest … -m EXPR … PATHS…`` command of a shell script: the markers EXPR names and the paths it runs."""
    stages = []
    for command in script.replace("\\\n", " ").splitlines():
        if "pytest" not in command or " -m " not in command or command.lstrip().startswith("#"):
            continue
        words = shlex.split(command, comments=True)
        options = words[words.index("pytest") + 1 :]
        if "-m" not in options:
            continue  # the default run: pyproject's addopts choose
        expression = options[options.index("-m") + 1]
        markers = set(re.findall(r"\w+", expression)) - {"and", "or", "not"}
        paths = [w for w in words if w == "tests" or w.startswith("tests/")]
        stages.append((markers, paths))
    return stages


def unstaged(script: str, addopts: str) -> list[str]:
    """What is wrong with ``script``'s stages: a marker ``addopts`` deselects that no stage runs, or that its stage
    runs from a list of files (a marked test outside the list would never run)."""
    problems = []
    stages = pytest_stages(script)
    for marker in sorted(excluded_markers(addopts)):
        paths = [p for markers, p in stages if marker in markers]
        if not paths:
            problems.append(f"no stage runs -m {marker}")
        elif paths[0] != ["tests"]:
            problems.append(f"-m {marker} runs {paths[0]}, not all of tests/")
    return problems


def _settings() -> tuple[str, str]:
    script = (ROOT / "scripts" / "test.sh").read_text()
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    return script, addopts


def test_every_marker_the_default_run_leaves_out_has_a_stage_over_all_of_tests():
    script, addopts = _settings()
    assert excluded_markers(addopts) >= {"vllm", "realmodel", "tau2", "bfcl", "registry"}
    assert unstaged(script, addopts) == []


def test_a_stage_missing_or_listing_files_is_caught():
    script, addopts = _settings()
    assert unstaged(script, addopts.replace("not registry", "not registry and not gpu")) == ["no stage runs -m gpu"]
    listed = script.replace('-m "realmodel or bfcl or registry" tests', '-m "realmodel or bfcl or registry" tests/x.py')
    assert unstaged(listed, addopts) == [
        f"-m {m} runs ['tests/x.py'], not all of tests/" for m in ("bfcl", "realmodel", "registry")
    ]
