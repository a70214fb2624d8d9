"""Sampling faithful to the policy: backends sample from exactly the distribution SamplingParams describe, record its
logprobs, inherit nothing from the model's generation_config, and give every request its own seed."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
from transformers import GenerationConfig

import envkit
from envkit.backends import SamplingParams, TransformersBackend, request_seed
from envkit.rollout import RolloutEngine
from envkit.testing import build_tiny_model


def reference_logprobs(model, prompt: list[int], tokens: list[int], sampling: SamplingParams) -> list[float]:
    """The logprob of each generated token under the processed distribution, computed independently of envkit:
    one teacher-forced forward pass, then repetition penalty (over prompt + tokens so far), temperature, top-k, top-p,
    min-p, log-softmax."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].double()
    values = []
    for step, token in enumerate(tokens):
        scores = logits[step].clone()
        if sampling.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(prompt + tokens[:step])))
            picked = scores[seen]
            scores[seen] = torch.where(
                picked < 0, picked * sampling.repetition_penalty, picked / sampling.repetition_penalty
            )
        scores = scores / sampling.temperature
        if sampling.top_k:
            kth = torch.topk(scores, sampling.top_k).values[-1]
            scores[scores < kth] = -math.inf
        if sampling.top_p < 1.0:
            order = torch.argsort(scores, descending=True)
            mass_before = torch.cumsum(scores[order].softmax(-1), 0) - scores[order].softmax(-1)
            scores[order[mass_before >= sampling.top_p]] = -math.inf
        if sampling.min_p > 0.0:
            probs = scores.softmax(-1)
            scores[probs < sampling.min_p * probs.max()] = -math.inf
        values.append(float(scores.log_softmax(-1)[token]))
    return values


@pytest.fixture(scope="module")
def penalised_model(local_tokenizer):
    """A tiny model whose generation_config carries every sampling setting a shipped model might: all must be
    ignored, because the trainer's loss models none of them."""
    model = build_tiny_model(local_tokenizer, seed=3)
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=0.2,
        top_k=3,
        top_p=0.5,
        min_p=0.4,
        repetition_penalty=1.8,
        no_repeat_ngram_size=2,
        suppress_tokens=list(range(40, 60)),
    )
    return model


PROMPTS = [[5, 17, 23, 99, 31], [8, 8, 8], [200, 201, 202, 203, 204, 205, 206]]


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(temperature=0.7, top_k=20),
        SamplingParams(temperature=1.3, top_p=0.8),
        SamplingParams(temperature=0.9, min_p=0.05),
        SamplingParams(temperature=0.8, top_k=50, repetition_penalty=1.3),
        SamplingParams(temperature=1.0),
    ],
    ids=["T0.7-topk20", "T1.3-topp0.8", "T0.9-minp", "T0.8-topk-penalty", "T1"],
)
def test_transformers_backend_records_the_processed_logprobs_and_ignores_the_generation_config(
    penalised_model, local_tokenizer, sampling
):
    sampling = dataclasses.replace(sampling, max_new_tokens=24, seed=5)
    backend = TransformersBackend(penalised_model, local_tokenizer)
    generations = backend.generate(PROMPTS, sampling)
    checked = 0
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        assert len(generation.token_ids) == len(generation.logprobs) > 0
        expected = reference_logprobs(penalised_model, prompt, generation.token_ids, sampling)
        assert generation.logprobs == pytest.approx(expected, abs=2e-4)
        checked += len(expected)
    assert checked >= 3


def test_members_of_a_group_get_different_samples_and_seeds_reproduce_them(penalised_model, local_tokenizer):
    backend = TransformersBackend(penalised_model, local_tokenizer)
    engine = RolloutEngine(lambda: envkit.make("guess-number"), backend, local_tokenizer, max_turns=1)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=11)
    rng_before = torch.get_rng_state()
    first = engine.run([0, 1], 4, sampling)
    assert torch.equal(torch.get_rng_state(), rng_before), "sampling touched torch's global RNG"
    for seed in (0, 1):
        group = [tuple(e.completion_ids) for e in first if e.task_seed == seed]
        assert len(set(group)) == len(group), "members of a group shared a sample"
    again = engine.run([0, 1], 4, sampling)
    assert [e.completion_ids for e in again] == [e.completion_ids for e in first]
    other = engine.run([0, 1], 4, dataclasses.replace(sampling, seed=12))
    assert [e.completion_ids for e in other] != [e.completion_ids for e in first]


def test_a_requests_sample_does_not_depend_on_the_rest_of_its_batch(penalised_model, local_tokenizer):
    """Continuous batching puts a request beside whatever else is waiting: its tokens must be the same alone, at
    another position, and beside other prompts of other lengths (left padding)."""
    backend = TransformersBackend(penalised_model, local_tokenizer)
    sampling = SamplingParams(temperature=1.0, top_k=30, max_new_tokens=12)
    alone = backend.generate([PROMPTS[0]], sampling, seeds=[77])[0]
    crowded = backend.generate([PROMPTS[2], PROMPTS[1], PROMPTS[0]], sampling, seeds=[5, 6, 77])[2]
    assert crowded.token_ids == alone.token_ids
    assert crowded.logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_row_sampling_draws_from_exactly_the_given_distribution():
    """sample_rows with row_uniforms (one counter-based uniform per row) against known probabilities, a zero-probability
    token included: 200,000 rows, each frequency within 0.005 (about 4 standard errors) of its probability."""
    from envkit.backends.transformers import row_uniforms, sample_rows

    probs = torch.tensor([0.5, 0.2, 0.0, 0.15, 0.1, 0.05], dtype=torch.float64)
    rows = 200_000
    for step in (0, 7):
        chosen = sample_rows(probs.log().expand(rows, -1).float(), row_uniforms(torch.arange(rows), step))
        frequencies = torch.bincount(chosen, minlength=len(probs)).double() / rows
        assert frequencies[2] == 0.0
        assert torch.allclose(frequencies, probs, atol=0.005), frequencies


def test_request_seeds_differ_by_each_coordinate():
    seeds = {request_seed(7, task, member, turn) for task in range(5) for member in range(4) for turn in range(3)}
    assert len(seeds) == 60 and all(0 <= s < 2**63 for s in seeds)
    assert request_seed(7, 1, 2) == request_seed(7, 1, 2) != request_seed(8, 1, 2)


def test_a_stop_string_ends_the_turn_with_no_padding_and_finish_reason_stop(penalised_model, local_tokenizer):
    backend = TransformersBackend(penalised_model, local_tokenizer)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=20, seed=3)
    prompt = PROMPTS[2]
    full = backend.generate([prompt], sampling)[0]
    assert full.finish_reason == "length" and len(full.token_ids) == 20
    stop = local_tokenizer.decode(full.token_ids[4:6])  # the same seed replays the same draws: reached by token 6
    cut = backend.generate([prompt, PROMPTS[1]], dataclasses.replace(sampling, stop=[stop]))[0]
    assert cut.finish_reason == "stop"
    # transformers matches stop strings on the whole sequence, so the text that ends with it includes the prompt
    assert local_tokenizer.decode(prompt + cut.token_ids).endswith(stop)
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)] and len(cut.token_ids) <= 6
    assert cut.logprobs == pytest.approx(full.logprobs[: len(cut.token_ids)], abs=1e-5)


def test_the_template_end_of_turn_token_always_stops_generation(local_tokenizer):
    """A model whose own eos is another token still stops at the chat template's end-of-turn token."""
    model = build_tiny_model(local_tokenizer, seed=1)
    im_end = local_tokenizer.convert_tokens_to_ids("<|im_end|>")
    backend = TransformersBackend(model, local_tokenizer, stop_token_ids=[local_tokenizer.convert_tokens_to_ids("a")])
    with torch.no_grad():  # make <|im_end|> the greedy choice at every position
        model.lm_head.weight[im_end] += 50 * model.model.embed_tokens.weight.abs().max()
    generation = backend.generate([PROMPTS[0]], SamplingParams(temperature=0.0, stop_token_ids=[im_end]))[0]
    assert generation.token_ids == [im_end] and generation.finish_reason == "stop"


def test_seeded_vllm_batches_are_cut_to_the_prefill_budget():
    from envkit.backends.vllm import _token_budget_slices

    assert _token_budget_slices([300] * 8, None) == [(0, 8)]  # no budget (a GPU): one call
    assert _token_budget_slices([300] * 8, 4096) == [(0, 8)]  # it all fits
    assert _token_budget_slices([300] * 8, 1000) == [(0, 3), (3, 6), (6, 8)]
    assert _token_budget_slices([1200, 10, 10], 1000) == [(0, 1), (1, 3)]  # a longer prompt goes alone
    assert _token_budget_slices([], 1000) == []


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("temperature", -0.5, "temperature must be 0 (greedy) or more, got -0.5"),
        ("temperature", math.nan, "temperature must be 0 (greedy) or more, got nan"),
        ("top_p", 2.0, "top_p must be above 0 and at most 1 (1 = off), got 2"),
        ("top_p", 0.0, "top_p must be above 0 and at most 1"),
        ("top_k", -1, "top_k must be 0 (off) or more, got -1"),
        ("min_p", 1.5, "min_p must be between 0 (off) and 1, got 1.5"),
        ("repetition_penalty", 0.0, "repetition_penalty must be above 0 (1 = off), got 0"),
        ("max_new_tokens", -1, "max_new_tokens must be 0 or more, got -1"),
    ],
)
def test_a_sampling_setting_out_of_range_is_refused_when_built(field, value, says):
    """A negative temperature would decode greedily and a top-p of 2 would sample with top-p off, without a word:
    SamplingParams refuses them, naming the field, so every caller (eval, rft, play, train, serve) refuses them too."""
    from envkit.backends import SamplingRangeError

    with pytest.raises(SamplingRangeError, match=re.escape(says)) as caught:
        SamplingParams(**{field: value})
    assert caught.value.field == field and caught.value.flag == field.replace("_", "-")
    with pytest.raises(SamplingRangeError):  # replace() builds a new one: it is checked too
        dataclasses.replace(SamplingParams(), **{field: value})


def test_every_numeric_sampling_setting_has_a_range():
    """A numeric field added to SamplingParams without a range would go unchecked: this fails until it has one."""
    from envkit.backends import SAMPLING_RANGES

    numeric = {f.name for f in dataclasses.fields(SamplingParams) if any(t in str(f.type) for t in ("int", "float"))}
    assert numeric - {"seed", "stop_token_ids"} == set(SAMPLING_RANGES)
    for name in SAMPLING_RANGES:  # the defaults, and the knobs' "off" values, are in range
        SamplingParams(**{name: getattr(SamplingParams(), name)})
    SamplingParams(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0, max_new_tokens=0)


def test_a_bare_string_as_stop_is_refused_naming_the_list_it_should_be():
    """``stop="\\n"`` would be read as its characters, each a stop string: refused, with the list it means."""
    with pytest.raises(TypeError, match=r"stop must be a list of strings, got 'END' \(one stop string: \['END'\]\)"):
        SamplingParams(stop="END")
    assert SamplingParams(stop=["END"]).stop == ["END"]
