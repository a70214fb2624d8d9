"""Recall of ``envkit validate`` on issue 38's corpus of planted env bugs (``tests/validate_corpus``).

Validates every clean env of the corpus and every planted bug with the built-in checks alone (8 seeds), and writes
``benchmarks/validate_recall.md``: per bug class, how many planted bugs the check they name caught (its FAIL, and no
other FAIL), and each clean env's FAILs (there must be none). The table depends only on the corpus and the checks,
never on the machine, so ``tests/test_validate_corpus.py`` holds the file to what this script computes.

Usage::

    .venv/bin/python benchmarks/validate_recall.py          # writes benchmarks/validate_recall.md
    .venv/bin/python benchmarks/validate_recall.py --print  # prints it instead
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "benchmarks" / "validate_recall.md"
EPISODES = 8
"""Seeds each env is validated over (``envkit validate``'s default)."""

sys.path.insert(0, str(ROOT / "tests"))  # the corpus is a package of the test suite

from validate_corpus import BUG_CLASSES, BUGS, CLEAN_ENVS, PlantedBug  # noqa: E402

from envkit.validate import FAIL, validate_env  # noqa: E402


@dataclass(frozen=True)
class Verdict:
    """What ``envkit validate`` said of one env of the corpus.

    Args:
        name: The clean env's shape, or the planted bug's id.
        failed: The titles of the checks that FAILed, in id order.
        reasons: Each FAIL's one-line reason, by title.
    """

    name: str
    failed: tuple[str, ...]
    reasons: dict[str, str]


def verdict(name: str, factory: object) -> Verdict:
    """Validate one env of the corpus.

    Args:
        name: Its name in the table.
        factory: Builds the env.

    Returns:
        The checks that failed, with their reasons.
    """
    report = validate_env(factory, target=name, episodes=EPISODES)  # type: ignore[arg-type]
    failed = [c for c in report.checks if c.status == FAIL]
    return Verdict(name, tuple(c.name for c in failed), {c.name: c.reason for c in failed})


def caught(bug: PlantedBug, found: Verdict) -> bool:
    """Whether a planted bug was caught as it should be: the check it names FAILs, and no other."""
    return found.failed == (bug.expected,)


def run_corpus() -> tuple[dict[str, Verdict], dict[str, Verdict]]:
    """Validate the whole corpus: the clean envs' verdicts by shape, and the planted bugs' by id."""
    clean = {shape: verdict(shape, env) for shape, env in CLEAN_ENVS.items()}
    bugs = {bug.id: verdict(bug.id, bug.factory) for bug in BUGS}
    return clean, bugs


def table(clean: dict[str, Verdict], bugs: dict[str, Verdict]) -> str:
    """The recall table as Markdown: per class caught/planted, the clean envs' FAILs, and every bug's verdict."""
    lines = [
        "# `envkit validate` recall on the planted-bug corpus",
        "",
        "Written by `benchmarks/validate_recall.py` (do not edit; `tests/test_validate_corpus.py` holds it current).",
        f"Each env is validated with the built-in checks alone over {EPISODES} seeds, no canaries. A planted bug is",
        "caught when the check it names FAILs and no other check does (one bug, one FAIL).",
        "",
        "| class | bugs of the class | caught / planted |",
        "| ---: | --- | ---: |",
    ]
    total_caught = total = 0
    for number, what in BUG_CLASSES.items():
        planted = [b for b in BUGS if b.bug_class == number]
        if not planted:
            continue
        hits = sum(caught(b, bugs[b.id]) for b in planted)
        total_caught, total = total_caught + hits, total + len(planted)
        lines.append(f"| {number} | {what} | {hits} / {len(planted)} |")
    lines += [f"| all | | {total_caught} / {total} |", "", "## Clean envs", ""]
    lines += ["| shape | FAILs |", "| --- | --- |"]
    lines += [f"| {shape} | {', '.join(v.failed) or 'none'} |" for shape, v in clean.items()]
    lines += [
        "",
        "## Planted bugs",
        "",
        "| bug | class | shape | expected FAIL | verdict |",
        "| --- | ---: | --- | --- | --- |",
    ]
    for bug in BUGS:
        found = bugs[bug.id]
        said = "caught" if caught(bug, found) else f"missed (FAILs: {', '.join(found.failed) or 'none'})"
        lines.append(f"| `{bug.id}`: {bug.description} | {bug.bug_class} | {bug.shape} | {bug.expected} | {said} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Compute the table; write it (or print it with ``--print``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--print", action="store_true", help="print the table instead of writing the file")
    args = parser.parse_args(argv)
    text = table(*run_corpus())
    if args.print:
        print(text, end="")
    else:
        OUTPUT.write_text(text)
        print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
