"""benchmarks/learning_rl's synthetic copying-and-recall pretraining: what its sequences teach (the loss falls only on
what the context determines), that it teaches it, and that a warm-start attempt records it."""

from __future__ import annotations

import pytest

from benchmarks.learning_rl import cli, experiments
from benchmarks.learning_rl.pretraining import (
    IGNORE,
    SEQUENCE_TOKENS,
    CopyAndRecall,
    pretrain_copy_and_recall,
    target_accuracy,
)
from envkit.testing import build_tiny_model, build_tokenizer

pytest.importorskip("trl")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_recall_labels_are_the_values_of_the_keys_asked_again(tokenizer):
    data = CopyAndRecall(tokenizer, seed=3)
    for _ in range(20):
        example = data.recall()
        assert len(example.labels) == len(example.input_ids)
        # "k = v; ... q = a;": the labelled tokens are the answers a, in order, and each query q was given a before.
        segments = [s.strip().split(" = ") for s in tokenizer.decode(example.input_ids).split(";") if s.strip()]
        labelled = tokenizer.decode([label for label in example.labels if label != IGNORE])
        answers = [a.strip() for a in labelled.split(";") if a.strip()]
        stated, asked = segments[: -len(answers)], segments[-len(answers) :]
        assert answers == [a for _, a in asked]
        assert all((key, answer) in [tuple(s) for s in stated] for key, answer in asked)


def test_copying_labels_the_repeated_span_after_its_first_token(tokenizer):
    example = CopyAndRecall(tokenizer, seed=4).copying()
    labelled = [i for i, label in enumerate(example.labels) if label != IGNORE]
    span = [example.input_ids[i] for i in labelled]
    first = labelled[0]
    # The labelled tokens continue a span that already appeared earlier, token for token.
    assert example.input_ids[first - 1 : first + len(span)] == example.input_ids[: len(span) + 1]


def test_sequences_are_packed_to_an_episodes_length_and_deterministic(tokenizer):
    one, two = CopyAndRecall(tokenizer, seed=5).sequence(), CopyAndRecall(tokenizer, seed=5).sequence()
    assert one == two and len(one.input_ids) == len(one.labels) == SEQUENCE_TOKENS
    assert one != CopyAndRecall(tokenizer, seed=6).sequence()
    special = set(tokenizer.all_special_ids) | set(tokenizer.added_tokens_decoder)
    assert not special & set(one.input_ids)


def test_pretraining_raises_the_exact_match_on_held_out_targets(tokenizer):
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, seed=0)
    result = pretrain_copy_and_recall(model, tokenizer, 40, seed=0, batch_size=4, probe_sequences=8)
    assert result["steps"] == 40 and result["accuracy_after"] > result["accuracy_before"] + 0.05
    probe = CopyAndRecall(tokenizer, 1_000_003)  # the held-out sequences: seed + 1,000,003
    held_out = [probe.sequence() for _ in range(8)]
    assert target_accuracy(model, held_out) == pytest.approx(result["accuracy_after"])
    assert not model.training


def test_a_warm_start_attempt_is_pretrained_first_and_records_it(tmp_path):
    from benchmarks.learning_rl import seed as seed_module

    args = cli.parser().parse_args(["--quick", "--pretrain-steps", "3"])
    for key, value in cli.QUICK.items():
        setattr(args, key, value)
    args.probe_threshold, args.gate, args.warm_attempts = 0.0, 0.0, 1
    warm = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path).warm_start()
    (attempt,) = warm["attempts"]
    assert attempt["pretraining"]["steps"] == 3
    assert 0.0 <= attempt["pretraining"]["accuracy_before"] <= 1.0
    assert "pretraining: 3 steps of copying and recall" in (tmp_path / "B" / "seed-0" / "log.txt").read_text()
