"""TransformersBackend groups a batch's prompts by length on CPU: one long prompt no longer widens every row of a
left-padded batch (the second-turn batch of the instant-tools benchmark: most prompts 358-360 tokens, one 443-451)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from envkit.backends import SamplingParams, TransformersBackend
from envkit.backends.transformers import length_groups


def covers_each_index_once(groups: list[list[int]], n: int) -> bool:
    return sorted(i for group in groups for i in group) == list(range(n))


def test_equal_lengths_stay_one_batch_and_an_outlier_goes_apart():
    assert length_groups([358] * 100, 256, 0.1) == [list(range(100))]
    lengths = [358] * 105 + [451]
    groups = length_groups(lengths, 256, 0.1)
    assert groups == [[105], list(range(105))]  # the long prompt alone, the rest together
    # Within the tolerance, a little spread stays together: 358-360 pads by 0.6 %.
    assert len(length_groups([358, 359, 360] * 40, 256, 0.1)) == 1


def test_every_group_keeps_to_the_tolerance_and_the_batch_size():
    lengths = [(i * 37) % 301 + 50 for i in range(500)]  # 50-350 tokens, spread
    for tolerance in (0.0, 0.1, 0.5):
        groups = length_groups(lengths, 64, tolerance)
        assert covers_each_index_once(groups, len(lengths))
        for group in groups:
            widths = [lengths[i] for i in group]
            assert len(group) <= 64
            assert len(group) * max(widths) <= (1 + tolerance) * sum(widths) + 1e-9
    assert len(length_groups(lengths, 64, 0.5)) < len(length_groups(lengths, 64, 0.1))


def test_an_infinite_tolerance_keeps_the_old_consecutive_batches():
    assert length_groups([5, 500, 7, 9, 300], 2, math.inf) == [[0, 1], [2, 3], [4]]
    assert length_groups([], 2, math.inf) == [] == length_groups([], 2, 0.1)
    with pytest.raises(ValueError, match="max_batch_size"):
        length_groups([1], 0, 0.1)
    with pytest.raises(ValueError, match="pad_tolerance must be a fraction"):
        length_groups([1], 4, -0.5)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()


def counting(model) -> list[int]:
    """Wrap ``model.generate`` to record each call's batch width (rows)."""
    calls: list[int] = []
    generate = model.generate

    def wrapped(*args, **kwargs):
        calls.append(int(kwargs["input_ids"].shape[0]))
        return generate(*args, **kwargs)

    model.generate = wrapped
    return calls


def test_cpu_backend_runs_a_long_prompt_apart_with_the_same_tokens(model, local_tokenizer):
    """Six 12-token prompts and one of 60: on CPU two model.generate calls (6 rows, then 1), results in the caller's
    order, each the tokens and logprobs its prompt gets alone with its seed; with ``pad_tolerance=inf`` one call."""
    prompts = [[(7 * i + j) % 300 + 20 for j in range(12)] for i in range(6)]
    prompts.insert(2, [(3 * j) % 300 + 20 for j in range(60)])
    seeds = list(range(100, 107))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6)
    calls = counting(model)
    try:
        grouped = TransformersBackend(model, local_tokenizer).generate(prompts, sampling, seeds=seeds)
        assert calls == [1, 6]  # the 60-token prompt first, alone
        calls.clear()
        one = TransformersBackend(model, local_tokenizer, pad_tolerance=math.inf).generate(
            prompts, sampling, seeds=seeds
        )
        assert calls == [7]
        alone = [
            TransformersBackend(model, local_tokenizer).generate([p], sampling, seeds=[s])[0]
            for p, s in zip(prompts, seeds, strict=True)
        ]
    finally:
        del model.generate  # back to the class's method
    for got, padded, single in zip(grouped, one, alone, strict=True):
        assert got.token_ids == single.token_ids == padded.token_ids
        assert got.logprobs == pytest.approx(single.logprobs, abs=1e-5)
