"""The one registry of checks drives everything that lists checks: the runner, --json, the report, the progress bar
and the README's tables."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from envkit.cli.app import main
from envkit.validate import ENV, REGISTRY, SEED_STYLE, checks, progress_total, validate_env
from envkit.validate.registry import by_id

ROOT = Path(__file__).resolve().parents[1]
RFC008_LEVELS = ("static", "runtime", "semantic", "statistical", "hub")
SEED_ARGS = ["--rl-env-module", "seed_style_arithmetic", "--rl-env-class", "SeedArithmetic", "--rl-env-config", "{}"]


@pytest.mark.parametrize("kind", [ENV, SEED_STYLE])
def test_each_kind_numbers_its_checks_once_from_one_with_distinct_titles_and_documented_functions(kind):
    specs = checks(kind)
    assert sorted(s.id for s in specs) == list(range(1, len(specs) + 1))
    assert len({s.title for s in specs}) == len(specs)
    assert all(s.run.__doc__ for s in specs)
    assert {s.kind for s in REGISTRY} == {ENV, SEED_STYLE}


def test_rfc008_ids_are_openenv_check_ids_and_each_implemented_by_one_env_check():
    ids = [s.rfc008 for s in checks(ENV) if s.rfc008]
    assert all(re.fullmatch(r"[a-z]+\.[a-z0-9_]+", i) and i.split(".")[0] in RFC008_LEVELS for i in ids)
    assert len(ids) == len(set(ids))
    named = {s.title: s.rfc008 for s in checks(ENV)}
    assert named["verifier determinism"] == "semantic.verifier_determinism"
    assert named["canaries stay at the no-op floor"] == "semantic.canary_floor"
    assert named["oracle reaches 1.0"] == "semantic.oracle_max"


def test_json_reports_every_registered_check_with_both_ids(capsys):
    assert main(["validate", "guess-number", "--episodes", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(c["id"], c["rfc008"], c["name"]) for c in data["checks"]] == [
        (s.id, s.rfc008, s.title) for s in by_id(ENV)
    ]
    assert all({"id", "rfc008"} <= set(c) for c in data["checks"])
    assert main(["validate", *SEED_ARGS, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(c["id"], c["rfc008"], c["name"]) for c in data["checks"]] == [
        (s.id, s.rfc008, s.title) for s in by_id(SEED_STYLE)
    ]


def test_the_human_report_names_each_check_and_its_rfc008_id(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping inside the table's cells
    assert main(["validate", "arithmetic", "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    for spec in checks(ENV):
        assert spec.title in out and (spec.rfc008 is None or spec.rfc008 in out), spec


@pytest.mark.parametrize(("argv", "kind"), [(["guess-number", "--episodes", "2"], ENV), (SEED_ARGS, SEED_STYLE)])
def test_the_cli_progress_total_is_the_registry_s_and_is_reached(monkeypatch, capsys, argv, kind):
    from rich.progress import Progress

    seen = {"total": None, "advanced": 0}
    add_task, update = Progress.add_task, Progress.update

    def recording_add_task(self, description, *args, total=None, **kwargs):
        seen["total"] = total
        return add_task(self, description, *args, total=total, **kwargs)

    def recording_update(self, task_id, *args, advance=None, **kwargs):
        seen["advanced"] += advance or 0
        return update(self, task_id, *args, advance=advance, **kwargs)

    monkeypatch.setattr(Progress, "add_task", recording_add_task)
    monkeypatch.setattr(Progress, "update", recording_update)
    assert main(["validate", *argv]) == 0, capsys.readouterr()
    assert seen == {"total": progress_total(kind), "advanced": progress_total(kind)}


def test_validate_env_ticks_once_per_registered_check_and_scripted_policy():
    from broken_envs import GoodText

    ticks = []
    validate_env(GoodText, target="good", episodes=2, progress=ticks.append)
    assert len(ticks) == progress_total(ENV)
    assert {s.title for s in checks(ENV)} <= set(ticks)


def readme_table(kind: str) -> list[tuple[int, str, str | None]]:
    """The (id, title, RFC-008 id) rows of the table in docs/how-to/validate.md of ``kind``'s checks."""
    section = (ROOT / "docs" / "how-to" / "validate.md").read_text()
    tables = re.findall(r"\| # \| check \| RFC-008 id \| fails when \|\n\| --- .*\n((?:\|.*\n)+)", section)
    assert len(tables) == 2, "docs/how-to/validate.md has one table of env checks and one of seed-style checks"
    rows = []
    for line in tables[0 if kind == ENV else 1].splitlines():
        number, title, rfc008 = (cell.strip() for cell in line.strip("|").split("|")[:3])
        rows.append((int(number), title, None if rfc008 == "—" else rfc008.strip("`")))
    return rows


@pytest.mark.parametrize("kind", [ENV, SEED_STYLE])
def test_the_readme_tables_list_exactly_the_registered_checks(kind):
    assert readme_table(kind) == [(s.id, s.title, s.rfc008) for s in by_id(kind)]
