"""Issue 38's measure of ``envkit validate``: on a corpus of planted env bugs (``tests/validate_corpus``), every bug is
caught by the check it names with no other FAIL, the clean twins pass with no FAIL, and the recall table in
``benchmarks/validate_recall.md`` is what ``benchmarks/validate_recall.py`` computes from them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from validate_corpus import BUG_CLASSES, BUGS, CLEAN_ENVS, SHAPES

from envkit.validate import ENV, checks

ROOT = Path(__file__).resolve().parents[1]
BENCHMARK = ROOT / "benchmarks" / "validate_recall.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("benchmark_validate_recall", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return load_benchmark()


@pytest.fixture(scope="module")
def corpus(bench):
    """Every env of the corpus validated once: (clean verdicts by shape, bug verdicts by id)."""
    return bench.run_corpus()


def test_the_corpus_has_every_shape_and_enough_bugs_each_naming_a_registered_check():
    titles = {spec.title for spec in checks(ENV)}
    assert set(CLEAN_ENVS) == set(SHAPES)
    assert len(BUGS) >= 24 and len({b.id for b in BUGS}) == len(BUGS)
    assert {b.shape for b in BUGS} == set(SHAPES)
    assert all(b.expected in titles for b in BUGS), [b.expected for b in BUGS if b.expected not in titles]
    for number in (1, 2, 3):
        assert sum(b.bug_class == number for b in BUGS) >= 4, BUG_CLASSES[number]


def test_each_planted_bug_is_one_edit_of_its_clean_twin():
    for bug in BUGS:
        assert issubclass(bug.factory, CLEAN_ENVS[bug.shape]), bug.id
        assert bug.description, bug.id


@pytest.mark.parametrize("shape", list(CLEAN_ENVS))
def test_a_clean_env_passes_with_no_fail(corpus, shape):
    clean, _ = corpus
    assert clean[shape].failed == (), clean[shape].reasons


@pytest.mark.parametrize("bug", BUGS, ids=[b.id for b in BUGS])
def test_a_planted_bug_fails_exactly_the_check_it_names(corpus, bug):
    _, found = corpus
    assert found[bug.id].failed == (bug.expected,), found[bug.id].reasons


def test_the_reasons_name_the_evidence(corpus):
    _, found = corpus
    reason = found["text-answer-in-system-prompt"].reasons["answer hidden until the work is done"]
    assert "is in the system message" in reason and "expected answer:" in reason
    reason = found["refund-right-one-among-others"].reasons["answers padded with distractors"]
    assert "sent among" in reason and "issue_refund(order_id='ORD-" in reason
    reason = found["sql-gold-compared-with-itself"].reasons["score depends on a tool-call answer"]
    assert "submit_answer(answer='qqq-000') (garbage arguments)" in reason
    reason = found["sql-compared-as-sets"].reasons["answers padded with distractors"]
    assert "submit_answer(answer='" in reason and "scores 1.0 like the oracle's" in reason


def test_the_recall_table_is_current(bench, corpus):
    written = BENCHMARK.with_suffix(".md").read_text()
    assert written == bench.table(*corpus), "run .venv/bin/python benchmarks/validate_recall.py and commit the table"
