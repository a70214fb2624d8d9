"""The episodes of one GRPO group reset with the same seed and open with the same messages: within one run the engine
renders each distinct opening prompt once and hands every episode its own copy of the same token ids."""

from __future__ import annotations

import datetime

import pytest
from helpers import CounterEnv
from test_incremental_rendering import family_tokenizer

from envkit.backends import ScriptedBackend
from envkit.chat import ChatRenderer
from envkit.rollout import RolloutEngine, SamplingParams

# The families of ../shared/tokenizers whose templates render tool definitions (CounterEnv has tools; the others
# refuse them with a TemplateError, as they must).
SHARED_FAMILIES = ["qwen2.5-instruct", "qwen3", "llama-3.2-instruct"]


def _counting_renders(monkeypatch) -> list[str]:
    """Patch ``ChatRenderer.prompt_ids`` to record the last opening message of every render."""
    rendered: list[str] = []
    render = ChatRenderer.prompt_ids

    def counting(self, messages):
        rendered.append(messages[-1]["content"])
        return render(self, messages)

    monkeypatch.setattr(ChatRenderer, "prompt_ids", counting)
    return rendered


def test_a_group_renders_its_opening_prompt_once_and_every_episode_gets_the_same_ids(local_tokenizer, monkeypatch):
    engine = RolloutEngine(CounterEnv, ScriptedBackend("Done.<|im_end|>", tokenizer=local_tokenizer), local_tokenizer)
    full = ChatRenderer(local_tokenizer, CounterEnv().tools)  # a renderer of its own: no cache in between
    expected = {seed: full.prompt_ids(CounterEnv().reset(seed=seed)[0]) for seed in (1, 2)}
    rendered = _counting_renders(monkeypatch)

    episodes = engine.run([1, 2, 1], 4, SamplingParams())  # task 1 twice, as a repeating dataset does

    assert len(rendered) == 2, rendered  # two distinct openings, twelve episodes
    for episode in episodes:
        assert episode.error is None, episode.error
        assert episode.prompt_ids == expected[episode.task_seed]
    assert len({id(e.prompt_ids) for e in episodes}) == 12  # copies: one episode's list is nobody else's
    engine.run([1], 2, SamplingParams())
    assert len(rendered) == 3  # the cache lives for one run


class DatedOpening(CounterEnv):
    """An opening message that carries a field JSON cannot encode (the template does not render it)."""

    def reset(self, *, seed=None, options=None):
        opening, info = super().reset(seed=seed, options=options)
        opening[-1]["sent_at"] = datetime.datetime(2026, 1, 1)
        return opening, info


def test_openings_that_are_not_json_data_are_rendered_for_every_episode(local_tokenizer, monkeypatch):
    engine = RolloutEngine(DatedOpening, ScriptedBackend("Done.<|im_end|>", tokenizer=local_tokenizer), local_tokenizer)
    rendered = _counting_renders(monkeypatch)
    episodes = engine.run([1], 3, SamplingParams())
    assert len(rendered) == 3
    assert all(e.error is None for e in episodes), [e.error for e in episodes]
    assert episodes[0].prompt_ids == episodes[1].prompt_ids == episodes[2].prompt_ids


@pytest.mark.parametrize("family", SHARED_FAMILIES)
def test_a_group_shares_one_render_with_each_real_chat_template(family, monkeypatch):
    """Through the real tokenizers and chat templates of ../shared/tokenizers: the copied ids are the full render's."""
    tokenizer = family_tokenizer(family)
    tools = CounterEnv().tools
    full = ChatRenderer(tokenizer, tools)
    done = "Done." + tokenizer.decode([full.end_of_turn_id])
    engine = RolloutEngine(CounterEnv, ScriptedBackend(done, tokenizer=tokenizer), tokenizer, max_turns=1)
    expected = full.prompt_ids(CounterEnv().reset(seed=5)[0])
    rendered = _counting_renders(monkeypatch)
    episodes = engine.run([5], 4, SamplingParams())
    assert len(rendered) == 1
    assert all(e.error is None for e in episodes), [e.error for e in episodes]
    assert all(e.prompt_ids == expected for e in episodes)
