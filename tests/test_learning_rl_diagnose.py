"""benchmarks/learning_rl/diagnose.py: what a model gets wrong, call by call — counted on oracle episodes (all right)
and on copies with one call changed (that call wrong), and through its command on a saved tiny model."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest

from benchmarks.learning_rl import diagnose, experiments
from envkit.demos import oracle_episodes
from envkit.testing import build_tiny_model, build_tokenizer

pytest.importorskip("trl")

A, B = experiments.EXPERIMENTS["A"], experiments.EXPERIMENTS["B"]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _changed(episode, role, index, edit):
    """``episode`` as plain data with the ``index``-th message of ``role`` passed through ``edit``."""
    messages = copy.deepcopy(episode.messages)
    edit([m for m in messages if m["role"] == role][index])
    return SimpleNamespace(messages=messages, task_seed=episode.task_seed, score=0.0)


@pytest.mark.parametrize("announce_next", [False, True])
def test_chain_calls_counts_every_step_of_the_oracle_right_and_a_miscopied_operand_wrong(tokenizer, announce_next):
    factory = B.factory({"depths": [3], "numbered": True, "announce_next": announce_next})
    (episode,) = oracle_episodes(factory, tokenizer, [7])
    counts = diagnose.chain_calls([episode], factory)
    assert counts == {
        **{f"step {i}": {"previous": [1, 0], "operator": [1, 0], "operand": [1, 0]} for i in (1, 2, 3)},
        "submission": {"copied": [1, 0]},
    }

    def miscopy_operand(message):
        arguments = message["tool_calls"][0]["function"]["arguments"]
        left, operator, right = arguments["expression"].split()
        arguments["expression"] = f"{left} {operator} {int(right) + 1}"

    wrong = diagnose.chain_calls([_changed(episode, "assistant", 1, miscopy_operand)], factory)
    assert wrong["step 2"] == {"previous": [1, 0], "operator": [1, 0], "operand": [0, 1]}
    assert wrong["step 1"] == wrong["step 3"] == counts["step 1"]


def test_retries_tells_the_printed_expression_again_from_another(tokenizer):
    factory = A.factory({"fail_p": 0.5})
    failed = [
        e
        for e in oracle_episodes(factory, tokenizer, list(range(20)))
        if any(A.failure_marker in str(m.get("content")) for m in e.messages)
    ]
    assert failed, "at p = 0.5 some of 20 oracle episodes meet a failure"
    assert set(diagnose.retries(failed, A.failure_marker)) == {"same expression"}  # the oracle calls again

    # An episode with one failure: its retry, changed, is the only call that is not the printed expression again.
    episode = next(e for e in failed if sum(A.failure_marker in str(m.get("content")) for m in e.messages) == 1)
    assistant = [m for m in episode.messages if m["role"] == "assistant"]
    first_failure = next(i for i, m in enumerate(episode.messages) if A.failure_marker in str(m.get("content")))
    after = next(m for m in episode.messages[first_failure:] if m["role"] == "assistant")
    retry = next(k for k, m in enumerate(assistant) if m is after)  # not .index: the retry equals the failed call

    def another(message):
        message["tool_calls"][0]["function"]["arguments"] = {"expression": "1 + 1"}

    changed = diagnose.retries([_changed(episode, "assistant", retry, another)], A.failure_marker)
    assert changed == {"other expression": 1}


def test_the_command_samples_a_saved_model_and_prints_its_counts(tmp_path, tokenizer, capsys):
    build_tiny_model(tokenizer, tmp_path / "model", seed=0)
    result = diagnose.main([str(tmp_path / "model"), "--experiment", "B", "--tasks", "2", "--samples", "1"])
    printed = json.loads(capsys.readouterr().out)
    assert printed == result and result["episodes"] == 2 and result["condition"] == "k=3"
    assert "chain calls, [right, wrong]" in result
    with pytest.raises(SystemExit, match="no saved model there"):
        diagnose.main([str(tmp_path), "--experiment", "A"])
    with pytest.raises(SystemExit, match=r"experiment A has p=0, p=0\.3, p=0\.5"):
        diagnose.main([str(tmp_path / "model"), "--experiment", "A", "--condition", "k=3"])
