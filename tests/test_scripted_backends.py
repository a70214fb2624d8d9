"""The test backends of envkit.backends.scripted: scripted replies cut like a model's output, a recorder that keeps
every call, faults on demand — and wrappers that take exactly the keywords of what they wrap, so the engine batches
for them as for the backend inside."""

from __future__ import annotations

import asyncio
import math
import threading
import time
import types

import pytest
from helpers import RELEASE_CAP_S, CounterEnv, backend_is_free, wait_until

from envkit.backends import (
    AsyncBackend,
    Backend,
    BackendError,
    FaultyBackend,
    Generation,
    HasContextLength,
    RecordingBackend,
    SamplingParams,
    ScriptedBackend,
    TransformersBackend,
)
from envkit.rollout import RolloutEngine
from envkit.rollout.batching import GenerationTimeout, MicroBatcher

SAMPLING = SamplingParams(max_new_tokens=8)


def together(batcher: MicroBatcher, prompts: list[list[int]], budgets: list[int] | None = None) -> list:
    """One request per prompt, all waiting together (so they may share a call); exceptions returned."""
    budgets = budgets or [SAMPLING.max_new_tokens] * len(prompts)

    async def main():
        requests = (batcher(p, SamplingParams(max_new_tokens=n)) for p, n in zip(prompts, budgets, strict=True))
        return await asyncio.gather(*requests, return_exceptions=True)

    return asyncio.run(main())


# ---- ScriptedBackend -------------------------------------------------------------------------------------------------
def test_a_text_reply_is_encoded_once_and_cut_like_a_models_output(local_tokenizer):
    im_end = local_tokenizer.convert_tokens_to_ids("<|im_end|>")
    done = local_tokenizer.encode("Done.<|im_end|>", add_special_tokens=False)
    backend = ScriptedBackend("Done.<|im_end|> and on", tokenizer=local_tokenizer, logprob=-0.25)
    stopped = SamplingParams(max_new_tokens=64, stop_token_ids=[im_end])
    [first, second] = backend.generate([[1, 2], [3]], stopped)
    assert first == second == Generation(done, [-0.25] * len(done), "stop")  # just after the stop token
    [cut] = backend.generate([[1]], SamplingParams(max_new_tokens=2, stop_token_ids=[im_end]))
    assert cut == Generation(done[:2], [-0.25, -0.25], "length")  # the budget ends it before the stop token
    [whole] = backend.generate([[1]], SamplingParams(max_new_tokens=64))  # no stop token asked for: all of it
    assert whole.token_ids == local_tokenizer.encode("Done.<|im_end|> and on", add_special_tokens=False)
    assert whole.finish_reason == "stop" and backend.calls == 3


def test_per_prompt_budgets_cut_each_prompt_at_its_own():
    backend = ScriptedBackend([7] * 10)
    got = backend.generate([[1], [2], [3]], SamplingParams(max_new_tokens=10), max_new_tokens=[2, 10, 5])
    assert [(len(g.token_ids), g.finish_reason) for g in got] == [(2, "length"), (10, "stop"), (5, "length")]
    with pytest.raises(ValueError, match="2 token budgets for 3 prompts"):
        backend.generate([[1], [2], [3]], SAMPLING, max_new_tokens=[1, 2])


def test_a_generation_reply_comes_back_exactly_as_given():
    """What no well-behaved backend returns (past the budget, past a stop token) still reaches the engine."""
    given = Generation([5, 6, 7, 8], [-1.0, -2.0, -3.0, -4.0], "length")
    [got] = ScriptedBackend(given).generate([[1]], SamplingParams(max_new_tokens=2, stop_token_ids=[6]))
    assert got == given and got.token_ids is not given.token_ids  # a copy: the engine may extend it


def test_a_reply_function_sees_each_request(local_tokenizer):
    seen = []

    def reply(request):
        seen.append((request.ids, request.seed, request.max_new_tokens, request.index, request.call))
        return list(request.ids[-1:]) if "<|im_start|>" in request.text else [0]

    backend = ScriptedBackend(reply, tokenizer=local_tokenizer)
    prompt = local_tokenizer.encode("<|im_start|>user\nhi", add_special_tokens=False)
    got = backend.generate([prompt, [5]], SAMPLING, seeds=[11, 12], max_new_tokens=[3, 4])
    assert [g.token_ids for g in got] == [prompt[-1:], [0]]
    assert seen == [(prompt, 11, 3, 0, 1), ([5], 12, 4, 1, 1)]
    seen.clear()
    backend.generate([[5]], SamplingParams(seed=3))  # seeds derived from sampling.seed, as model backends do
    assert seen[0][1] is not None and seen[0][4] == 2


def test_a_reply_that_cannot_be_used_says_so_at_once():
    with pytest.raises(ValueError, match="text reply needs a tokenizer"):
        ScriptedBackend("Done.")
    with pytest.raises(TypeError, match="text, token ids or a Generation, got dict"):
        ScriptedBackend({"content": "Done."})
    backend = ScriptedBackend(lambda request: request.text)
    with pytest.raises(ValueError, match="needs a tokenizer"):
        backend.generate([[1]], SAMPLING)
    with pytest.raises(TypeError, match="got float"):
        ScriptedBackend(lambda request: 1.5).generate([[1]], SAMPLING)


def test_a_scripted_policy_plays_an_episode_through_the_engine(local_tokenizer):
    def policy(request):
        if "<tool_response>" in request.text:
            return "Done.<|im_end|>"
        target = CounterEnv()
        target.reset(seed=0)
        return f'<tool_call>{{"name": "add", "arguments": {{"amount": {target.target}}}}}</tool_call><|im_end|>'

    backend = ScriptedBackend(policy, tokenizer=local_tokenizer)
    [episode] = RolloutEngine(CounterEnv, backend, local_tokenizer, max_turns=3).run([0], 1, SamplingParams())
    assert episode.error is None and episode.num_tool_calls == 1 and episode.turns == 3
    assert "total is now" in episode.messages[3]["content"]


# ---- RecordingBackend ------------------------------------------------------------------------------------------------
def test_the_recorder_keeps_every_call_and_what_came_of_it():
    inner = FaultyBackend(ScriptedBackend([4, 5]), fail_if=lambda r: RuntimeError("no") if 9 in r.ids else None)
    recorder = RecordingBackend(inner)
    recorder.generate([[1], [2]], SAMPLING, seeds=[3, 4])
    with pytest.raises(RuntimeError, match="no"):
        recorder.generate([[9]], SAMPLING)
    first, second = recorder.calls
    assert (first.prompts, first.seeds, first.max_new_tokens, first.error) == ([[1], [2]], [3, 4], None, None)
    assert [g.token_ids for g in first.generations] == [[4, 5], [4, 5]]
    assert second.generations is None and str(second.error) == "no"
    assert recorder.prompts == [[1], [2], [9]] and recorder.batch_sizes == [2, 1] and recorder.seeds == [3, 4, None]
    assert recorder.tokens == 4 and recorder.seconds >= 0
    recorder.reset()
    assert recorder.calls == [] and recorder.prompts == []


def test_wrappers_are_backends_that_show_their_inner_context_length():
    class Sized(ScriptedBackend):
        max_model_len = 99

    for wrapper in (RecordingBackend, FaultyBackend):
        assert isinstance(wrapper(ScriptedBackend([1])), Backend)
        assert isinstance(wrapper(Sized([1])), HasContextLength) and wrapper(Sized([1])).max_model_len == 99
        assert wrapper(ScriptedBackend([1])).max_model_len is None
        assert not isinstance(wrapper(ScriptedBackend([1])), AsyncBackend)  # the engine batches for a wrapper


def test_the_recorder_counts_calls_running_at_once():
    faulty = FaultyBackend(ScriptedBackend([1]), hang_calls=3)  # all three stay inside until released
    recorder = RecordingBackend(faulty)
    threads = [threading.Thread(target=recorder.generate, args=([[n]], SAMPLING)) for n in range(3)]
    try:
        for thread in threads:
            thread.start()
        wait_until(lambda: faulty.calls == 3, "three calls inside")
        assert recorder.inside == 3
    finally:
        faulty.release()
    assert recorder.wait_idle(RELEASE_CAP_S)
    assert recorder.max_inside == 3 and recorder.inside == 0


def test_the_recorder_passes_seeds_and_budgets_on_to_a_real_backend(tiny_model_dir, local_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    real = TransformersBackend(model, local_tokenizer)
    recorder = RecordingBackend(real)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6)
    got = recorder.generate([[5, 6, 7], [8, 9]], sampling, seeds=[1, 2], max_new_tokens=[2, 6])
    want = real.generate([[5, 6, 7], [8, 9]], sampling, seeds=[1, 2], max_new_tokens=[2, 6])
    assert [g.token_ids for g in got] == [g.token_ids for g in want] and len(got[0].token_ids) <= 2
    assert recorder.calls[0].max_new_tokens == [2, 6] and recorder.calls[0].seeds == [1, 2]


# ---- FaultyBackend ---------------------------------------------------------------------------------------------------
def test_a_prompt_that_breaks_its_batch_fails_only_its_request(local_tokenizer):
    bad = local_tokenizer.encode("poison", add_special_tokens=False)
    faulty = FaultyBackend(
        ScriptedBackend(lambda r: r.ids[-1:]),
        fail_if=lambda r: RuntimeError("device-side assert") if "poison" in r.text else None,
        tokenizer=local_tokenizer,
    )
    results = together(MicroBatcher(faulty), [[1], [2, *bad], [3]])
    assert [r.token_ids for r in (results[0], results[2])] == [[1], [3]]
    assert isinstance(results[1], RuntimeError) and "device-side assert" in str(results[1])
    assert faulty.calls > 1  # the batch failed, then the engine bisected it


def test_failing_calls_then_a_working_backend():
    faulty = FaultyBackend(ScriptedBackend([1]), fail_calls=2, error=ConnectionError("server restarting"))
    for _ in range(2):
        with pytest.raises(ConnectionError, match="server restarting"):
            faulty.generate([[1]], SAMPLING)
    assert faulty.generate([[1]], SAMPLING)[0].token_ids == [1] and faulty.calls == 3
    dead = FaultyBackend(ScriptedBackend([1]), fail_calls=math.inf)
    for _ in range(3):
        with pytest.raises(BackendError, match="fails as scripted"):
            dead.generate([[1]], SAMPLING)
    with pytest.raises(ValueError, match=r"whole number of calls or math\.inf"):
        FaultyBackend(ScriptedBackend([1]), fail_calls=1.5)


def test_slow_calls(monkeypatch):
    import envkit.backends.scripted as scripted

    faulty = FaultyBackend(ScriptedBackend([1]), delay_s=0.05, first_delay_s=0.3)
    times = []
    for _ in range(2):
        start = time.perf_counter()
        faulty.generate([[1]], SAMPLING)
        times.append(time.perf_counter() - start)
    assert times[0] >= 0.3 and times[1] >= 0.05  # a sleep is never shorter; how much longer is the machine's load
    slept: list[float] = []  # which delay each call asked for, exactly
    monkeypatch.setattr(scripted, "time", types.SimpleNamespace(sleep=slept.append))
    again = FaultyBackend(ScriptedBackend([1]), delay_s=0.05, first_delay_s=0.3)
    for _ in range(3):
        again.generate([[1]], SAMPLING)
    assert slept == [0.3, 0.05, 0.05]


def test_a_hung_call_meets_the_engines_deadline_and_goes_on_when_released():
    faulty = FaultyBackend(ScriptedBackend(lambda r: r.ids[-1:]), hang_calls=1)
    recorder = RecordingBackend(faulty)
    batcher = MicroBatcher(recorder, timeout_s=2.0)  # only the hung call may reach it
    try:
        [hung] = together(batcher, [[1]])
        assert isinstance(hung, GenerationTimeout) and "took longer than 2s" in str(hung)
    finally:
        faulty.release()
    wait_until(lambda: backend_is_free(recorder), "the released call returned")  # the backend serves again
    [served] = together(batcher, [[2]])
    assert served.token_ids == [2] and faulty.calls == 2
