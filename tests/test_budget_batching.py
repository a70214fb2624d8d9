"""Requests that differ only in their token budget share one backend call (issue 22 item 7): near the episode token
budget every episode asks for its own remaining room, which split one batch into a backend call per episode."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

import envkit
from envkit.backends import Generation, RecordingBackend, SamplingParams, ScriptedBackend, TransformersBackend
from envkit.rollout import RolloutEngine
from envkit.rollout.batching import MicroBatcher


def sevens() -> RecordingBackend:
    """A recorded backend whose every prompt gets its budget's worth of token 7 (``finish_reason="length"``)."""
    return RecordingBackend(ScriptedBackend([7] * 100))


def ask(backend, budgets: list[int]) -> list[Generation]:
    """One request per budget, all waiting together."""
    batcher = MicroBatcher(backend)

    async def main():
        return await asyncio.gather(
            *(batcher([1, i], SamplingParams(max_new_tokens=n), seed=i) for i, n in enumerate(budgets))
        )

    return asyncio.run(main())


def test_requests_with_different_budgets_share_one_call():
    budgets = list(range(5, 21))
    backend = sevens()
    results = ask(backend, budgets)
    calls = [(len(c.prompts), c.sampling.max_new_tokens, c.max_new_tokens) for c in backend.calls]
    assert calls == [(16, 20, budgets)]  # one call, run to the largest budget, each prompt with its own
    assert [len(r.token_ids) for r in results] == budgets


@pytest.fixture(scope="module")
def tiny_backend(tiny_model_dir, local_tokenizer) -> TransformersBackend:
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    return TransformersBackend(model, local_tokenizer)


def test_transformers_rows_stop_at_their_own_budget_with_the_tokens_of_the_longest_run(tiny_backend):
    """A batch runs to its largest budget; each row keeps exactly the first tokens it gets when run that long."""
    prompts = [[5, 17, 23, 99, 31], [8, 8, 8], [200, 201, 202, 203, 204, 205, 206], [40, 41]]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    budgets = [3, 12, 1, 7]
    got = tiny_backend.generate(prompts, sampling, seeds=[1, 2, 3, 4], max_new_tokens=budgets)
    full = tiny_backend.generate(prompts, sampling, seeds=[1, 2, 3, 4])
    for generation, longest, budget in zip(got, full, budgets, strict=True):
        assert generation.token_ids == longest.token_ids[:budget]
        assert generation.logprobs == pytest.approx(longest.logprobs[:budget], abs=1e-6)
        assert generation.finish_reason == ("length" if len(generation.token_ids) == budget else "stop")
    with pytest.raises(ValueError, match="2 token budgets for 4 prompts"):
        tiny_backend.generate(prompts, sampling, max_new_tokens=[1, 2])
    with pytest.raises(ValueError, match="at least 1"):
        tiny_backend.generate(prompts, sampling, max_new_tokens=[1, 0, 1, 1])


class Wordy(envkit.Env):
    """One turn; task ``s`` opens with ``s`` more words, so near the token budget every episode has its own room."""

    max_turns = 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "word " * int(seed or 0) + "go"}], {}

    def step(self, action):
        return [], 0.0, True, False, {}

    def score(self) -> float:
        return 0.0


def rows(recorder: RecordingBackend) -> dict[tuple[int, ...], tuple[int, int]]:
    """Every row the recorded backend was asked for: prompt -> (seed, budget)."""
    found = {}
    for call in recorder.calls:
        budgets = call.max_new_tokens or [call.sampling.max_new_tokens] * len(call.prompts)
        for prompt, seed, budget in zip(call.prompts, call.seeds, budgets, strict=True):
            found[tuple(prompt)] = (seed, budget)
    return found


def test_episodes_near_the_token_budget_share_a_batch_and_each_keeps_to_its_own_room(tiny_backend, local_tokenizer):
    """16 episodes whose remaining room differs (4 to 19 tokens under max_episode_tokens) made one backend call each;
    now they share few, and each episode's tokens are the ones its prompt gets alone with its own budget."""
    backend = RecordingBackend(tiny_backend)
    probe = RolloutEngine(Wordy, backend, local_tokenizer)
    renderer = probe.renderer_for(None)
    lengths = {s: len(renderer.prompt_ids([{"role": "user", "content": "word " * s + "go"}])) for s in range(16)}
    limit = max(lengths.values()) + 4
    rooms = {s: limit - n for s, n in lengths.items()}
    assert len(set(rooms.values())) > 8  # the episodes really ask for different budgets
    engine = RolloutEngine(Wordy, backend, local_tokenizer, max_episode_tokens=limit, gather_s=1.0)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=64, seed=5)
    episodes = engine.run(list(range(16)), 1, sampling)
    assert len(backend.calls) <= 4  # one per distinct budget before
    asked = rows(backend)
    turn = dataclasses.replace(sampling, stop_token_ids=[renderer.end_of_turn_id])
    for episode in episodes:
        assert episode.error is None
        assert len(episode.prompt_ids) + len(episode.completion_ids) <= limit
        generated = [t for t, m in zip(episode.completion_ids, episode.env_mask, strict=True) if m]
        recorded = [lp for lp, m in zip(episode.logprobs, episode.env_mask, strict=True) if m]
        room = rooms[episode.task_seed]
        assert 1 <= len(generated) <= room
        seed, budget = asked[tuple(episode.prompt_ids)]
        assert budget == room
        own = dataclasses.replace(turn, max_new_tokens=room)
        [alone] = tiny_backend.generate([episode.prompt_ids], own, seeds=[seed])
        # The engine drops a trailing control token other than the template's end of turn.
        assert generated == alone.token_ids[: len(generated)] and len(alone.token_ids) - len(generated) <= 1
        assert recorded == pytest.approx(alone.logprobs[: len(generated)], abs=1e-5)
