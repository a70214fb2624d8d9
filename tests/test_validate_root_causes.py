"""envkit validate says a root cause once (issue 23 item 5): the check that finds it FAILs naming the real cause, the
checks that depend on it SKIP "see check N". The envs are issue 23's retail-refund env (3 tools, a score read off the
database, an oracle, a canary, 200 tasks) and the ways a new user broke it."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import broken_envs as broken
import pytest

from envkit.cli.app import main
from envkit.testing import shared_tokenizer_dir
from envkit.validate import ENV, FAIL, PASS, SKIP, Outcome, bundled_tokenizer, checks, validate_env
from envkit.validate.registry import ROOT_CAUSES, by_id
from envkit.validate.report import RESET_NONDETERMINISTIC, first_difference
from envkit.validate.runner import attribute_root_causes

ROOT = Path(__file__).resolve().parents[1]


def report_of(env_cls, episodes=4, **kwargs):
    report = validate_env(env_cls, target=env_cls.__name__, episodes=episodes, **kwargs)
    return {c.id: c for c in report.checks}


def failures(by_id):
    return {i: c.reason for i, c in by_id.items() if c.status == FAIL}


def test_the_retail_refund_env_passes_every_check():
    by_id = report_of(broken.RetailRefund, episodes=8)
    assert {c.status for c in by_id.values()} == {PASS}, failures(by_id)


@pytest.mark.parametrize("env_cls", [broken.RefundResetUnseeded, broken.Unseeded])
def test_a_nondeterministic_reset_fails_once_and_the_checks_comparing_episodes_skip(env_cls):
    by_id = report_of(env_cls)
    assert list(failures(by_id)) == [2], failures(by_id)  # before: 2, 5 and 6 failed, 6 blaming class state
    # Usually seed 0; a later seed when the random draws of seed 0 happen to agree (1 in 200 for the refund env).
    assert re.search(r"reset\(seed=\d+\) on two fresh instances gave different opening messages", by_id[2].reason)
    assert "self.np_random" in by_id[2].hint
    for dependent in (5, 6, 16):
        check = by_id[dependent]
        if dependent == 16 and check.status == PASS:
            continue  # the few replays whose random task happened to repeat were judged, and a PASS stands
        assert check.status == SKIP and check.reason.endswith("(see check 2)"), (dependent, check.reason)
        assert check.details["root_cause"] == RESET_NONDETERMINISTIC and check.details["see_check"] == 2
    assert "class" not in by_id[6].reason + by_id[6].hint
    assert by_id[6].details["finding"].startswith("FAIL: seeds 0 and 1 stepped interleaved")  # kept for --verbose


def test_a_nondeterministic_step_fails_replay_once_and_isolation_skips():
    by_id = report_of(broken.NondeterministicFeedback)
    assert list(failures(by_id)) == [5], failures(by_id)
    assert by_id[6].status == SKIP and by_id[6].reason.endswith("(see check 5)")
    assert "class" in by_id[5].hint  # state on the class also breaks a replay on a fresh env


def test_a_vacuous_score_is_blamed_on_the_score_not_on_task_generation():
    by_id = report_of(broken.RefundVacuousScore)
    assert list(failures(by_id)) == [4], failures(by_id)  # before: 4 and 11 failed
    check = by_id[4]
    assert "score() is already 1.0 right after reset(), before any action, on all 4 seeds" in check.reason
    assert "all([]) is True" in check.hint and "never generate" not in check.hint
    assert by_id[11].status == SKIP and by_id[11].reason.endswith("(see check 4)")


def test_the_replay_diff_is_cut_around_the_first_differing_character():
    reason = report_of(broken.NondeterministicLateInReply)[5].reason
    found = re.search(r"at message 2, character (\d+) \((.*) vs (.*)\)$", reason)
    assert found, reason
    at, left, right = int(found[1]), found[2], found[3]
    assert at > 60 and left != right  # before: both sides were the same 60-character prefix
    assert left.startswith("…") and "(attempt " in left and "(attempt " in right


def test_first_difference_shows_both_sides_of_a_difference_past_a_long_prefix():
    prefix = "x" * 200
    a = [{"role": "user", "content": prefix + "apple and more text after it"}]
    b = [{"role": "user", "content": prefix + "pear and more text after it"}]
    where = first_difference(a, b)
    assert where.startswith("message 0, character 213 (") and "xapple and" in where and "xpear and" in where
    assert first_difference(a, a + b) == "message 1 (lengths 1 vs 2)"


@pytest.mark.parametrize(
    ("env_cls", "returned"),
    [
        (broken.RefundResetReturnsBareList, "a list of 2 messages"),
        (broken.RefundResetReturnsOneMessage, "a list of 1 message"),
    ],
)
def test_a_reset_that_returns_a_bare_list_is_named_and_fails_once(env_cls, returned):
    by_id = report_of(env_cls)
    assert list(failures(by_id)) == [2], failures(by_id)  # before: 6 FAILs, or "reset() raised ValueError"
    assert by_id[2].reason == f"reset() [reset, seed 0] returned {returned}, expected (messages, info)"
    assert "return messages, {}" in by_id[2].hint
    assert by_id[3].status == SKIP and by_id[3].reason.endswith("(see check 2)")


def tool_less_tokenizer():
    """The bundled ChatML tokenizer with a template that renders messages but ignores tools=."""
    tokenizer = copy.deepcopy(bundled_tokenizer())
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tokenizer.name_or_path = "/models/tool-less-chatml"
    return tokenizer


def test_a_template_that_drops_tools_is_named_once():
    by_id = report_of(broken.RetailRefund, tokenizer=tool_less_tokenizer())
    assert list(failures(by_id)) == [10], failures(by_id)  # before: 10 blamed the schemas, and 14 failed too
    assert by_id[10].reason.startswith("the tool-less-chatml template drops the tool definitions")
    assert "list_orders, get_order, issue_refund" in by_id[10].reason and "chat_template" in by_id[10].hint
    assert by_id[14].status == SKIP and by_id[14].reason.endswith("(see check 10)")


def test_gemma_3_s_template_drops_tools_and_is_named(capsys):
    gemma = shared_tokenizer_dir("gemma-3-it")
    if gemma is None:
        pytest.skip("../shared/tokenizers/gemma-3-it not present (a clone outside the envkit workspace)")
    argv = ["validate", "broken_envs:RetailRefund", "--episodes", "2", "--tokenizer", str(gemma), "--json"]
    assert main(argv) == 1
    data = json.loads(capsys.readouterr().out)
    failed = [c for c in data["checks"] if c["status"] == FAIL]
    assert [c["id"] for c in failed] == [10]
    assert failed[0]["reason"].startswith("the gemma-3-it template drops the tool definitions")


def test_check_15_catches_a_refund_accepted_among_calls_with_a_wrong_amount():
    by_id = report_of(broken.RefundAnyCallForTheOrder, episodes=8)
    assert list(failures(by_id)) == [15], failures(by_id)  # before: every check passed
    check = by_id[15]
    assert "the oracle's final tool call is sent among calls with distractor arguments" in check.reason
    right = re.search(r"seed 0: (issue_refund\(order_id='(ORD-\d+)', amount=([\d.]+)\)) sent as", check.reason)
    assert right, check.reason
    # among the calls sent: the right order with another amount (one argument varied at a time)
    sent = check.details["calls_sent"]
    assert any(c.startswith(f"issue_refund(order_id='{right[2]}', amount=") and c != right[1] for c in sent)
    assert "right values" in check.hint


def test_a_refund_scored_exactly_passes_check_15():
    check = report_of(broken.RetailRefund, episodes=8)[15]
    assert check.status == PASS and max(check.details["scores"]) < 1.0


# ---- the dependency notion itself ----------------------------------------------------------------------------------
def test_every_dependency_names_a_root_cause_whose_owner_is_another_env_check():
    ids = {spec.id for spec in checks(ENV)}
    assert all(cause.owner in ids for cause in ROOT_CAUSES.values())
    for spec in checks(ENV):
        assert all(c in ROOT_CAUSES and ROOT_CAUSES[c].owner != spec.id for c in spec.depends_on), spec


def test_a_pass_stands_and_a_cause_its_owner_did_not_report_changes_nothing():
    specs = {spec.id: spec for spec in checks(ENV)}
    cause = RESET_NONDETERMINISTIC
    owner_fails = [
        (specs[2], Outcome(FAIL, "reset differs", cause=cause)),
        (specs[5], Outcome(PASS, "replays")),
        (specs[6], Outcome(FAIL, "interleaved differ")),
    ]
    attributed = {spec.id: outcome for spec, outcome in attribute_root_causes(owner_fails)}
    assert attributed[2].status == FAIL and attributed[5].status == PASS
    assert attributed[6].status == SKIP and attributed[6].reason.endswith("(see check 2)")
    owner_passes = [(specs[2], Outcome(PASS, "fine")), (specs[5], Outcome(FAIL, "diverged at message 0", cause=cause))]
    attributed = {spec.id: outcome for spec, outcome in attribute_root_causes(owner_passes)}
    assert attributed[5].status == FAIL  # nobody reported the root cause: the finding stands


def readme_root_causes() -> list[tuple[str, int, list[int]]]:
    """The (what, reported by, then SKIP) rows of the table in docs/how-to/validate.md of root causes."""
    section = (ROOT / "docs" / "how-to" / "validate.md").read_text()
    table = re.search(r"\| root cause \| reported by \| checks that then SKIP \|\n\| --- .*\n((?:\|.*\n)+)", section)
    assert table, "docs/how-to/validate.md has a table of root causes"
    rows = []
    for line in table[1].splitlines():
        what, owner, dependents = (cell.strip() for cell in line.strip("|").split("|"))
        rows.append((what, int(owner), [int(n) for n in dependents.split(", ")]))
    return rows


def test_the_readme_lists_the_root_causes_and_their_dependents_as_registered():
    expected = [
        (cause.what, cause.owner, [spec.id for spec in by_id(ENV) if cause.key in spec.depends_on])
        for cause in ROOT_CAUSES.values()
    ]
    assert readme_root_causes() == expected
