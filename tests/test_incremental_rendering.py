"""Incremental suffix rendering (issue 24): a step renders a bounded local context, not the whole history, and its
tokens equal the full rendering's for every family's real template (../shared/tokenizers) at turn 1, 50 and 200.

A template whose suffix depends on more than the local context is detected once by the renderer's probe and rendered
in full, with the reason in ``suffix_mode_reason``.
"""

from __future__ import annotations

import json

import pytest

import envkit
from envkit.chat.render import ChatRenderer
from envkit.rollout import engine as rollout_engine
from envkit.rollout import renderers
from envkit.testing import load_shared_tokenizer

TOOL_FAMILIES = ["qwen2.5-instruct", "qwen3", "llama-3.2-instruct"]
TEXT_ONLY_FAMILIES = ["deepseek-v3", "gemma-3-it", "smollm2-135m-instruct"]
"""Templates that render no tool definitions (envkit refuses tool envs for them): text-only conversations."""


def family_tokenizer(name: str):
    tokenizer = load_shared_tokenizer(name)
    if tokenizer is None:
        pytest.skip("../shared/tokenizers not present (a clone outside the envkit workspace): family test skipped")
    return tokenizer


def hotel_tools() -> list[dict]:
    return envkit.make("hotel-booking").tools


def conversation(turns: int, tools: list[dict] | None) -> tuple[list[dict], list[tuple[dict, list[dict]]]]:
    """An opening and ``turns`` (assistant message, env's new messages) steps: tool calls and results, now and then
    a text reply and a user message; text-only replies and user messages without tools."""
    opening = [
        {"role": "system", "content": "You are the booking assistant."},
        {"role": "user", "content": "Book me a room in Lisbon, guest G-1."},
    ]
    steps = []
    for turn in range(turns):
        if tools and turn % 7 != 6:
            name = tools[turn % len(tools)]["function"]["name"]
            call = {"type": "function", "function": {"name": name, "arguments": {"city": f"City {turn}"}}}
            said = {"role": "assistant", "content": "" if turn % 2 else f"Checking {turn}.", "tool_calls": [call]}
            result = {"role": "tool", "name": name, "content": json.dumps({"turn": turn, "hotels": ["A", "B"]})}
            new = [result, {"role": "user", "content": f"Also note {turn}."}] if turn % 5 == 4 else [result]
        else:
            said = {"role": "assistant", "content": f"Here is answer {turn}."}
            new = [{"role": "user", "content": f"Question {turn}? <|im_end|> stays text."}]
        steps.append((said, new))
    return opening, steps


def full_suffix_ids(renderer: ChatRenderer, history, new, add_generation_prompt: bool) -> list[int]:
    """The template-suffix rule from the whole history: render with and without ``new``, tokenize the difference."""
    masked, originals = renderer._mask_control_text(new)
    before = renderer.render(history)
    after = renderer.render([*history, *masked], add_generation_prompt=add_generation_prompt)
    assert after.startswith(before)
    cut = before.rfind(renderer.end_of_turn) + len(renderer.end_of_turn)
    return renderer._encode_masked(before[cut:] + after[len(before) :], originals)


def check_family(family: str, tools: list[dict] | None) -> None:
    renderer = ChatRenderer(family_tokenizer(family), tools)
    assert renderer.suffix_mode == "incremental", renderer.suffix_mode_reason
    rendered_lengths = []
    render = renderer.render

    def counting_render(messages, **kwargs):
        rendered_lengths.append(len(messages))
        return render(messages, **kwargs)

    for turns in (1, 50, 200):
        opening, steps = conversation(turns, tools)
        history = list(opening)
        checked = {0, 1, 2, turns - 1} | set(range(0, turns, 23 if turns > 50 else 7))
        for index, (said, new) in enumerate(steps):
            history.append(said)
            if index in checked:
                for prompt in (True, False):
                    rendered_lengths.clear()
                    renderer.render = counting_render
                    got = renderer.suffix_ids(history, new, add_generation_prompt=prompt)
                    del renderer.render
                    # a bounded local context: the opening, at most two earlier messages, the new ones
                    assert max(rendered_lengths) <= len(opening) + 2 + len(new), rendered_lengths
                    assert got == full_suffix_ids(renderer, history, new, prompt), (family, turns, index, prompt)
                if index == turns - 1:  # no new message: the suffix only closes the turn and opens the next one
                    assert renderer.suffix_ids(history, []) == full_suffix_ids(renderer, history, [], True)
            history += new


@pytest.mark.parametrize("family", TOOL_FAMILIES)
def test_incremental_suffix_equals_full_render_with_tools(family):
    check_family(family, hotel_tools())


@pytest.mark.parametrize("family", TOOL_FAMILIES + TEXT_ONLY_FAMILIES)
def test_incremental_suffix_equals_full_render_text_only(family):
    check_family(family, None)


def test_trajectory_of_incremental_suffixes_is_the_template_rendering():
    """prompt + (assistant tokens + suffix)* tokenizes to exactly the full rendering of the final conversation."""
    renderer = ChatRenderer(family_tokenizer("qwen2.5-instruct"), hotel_tools())
    opening, steps = conversation(50, renderer.tools)
    ids, history = renderer.prompt_ids(opening), list(opening)
    for said, new in steps:
        generated = renderer.render([*history, said])[len(renderer.render(history, add_generation_prompt=True)) :]
        ids += renderer.encode(generated[: generated.rfind(renderer.end_of_turn) + len(renderer.end_of_turn)])
        history.append(said)
        ids += renderer.suffix_ids(history, new)
        history += new
    assert renderer.suffix_mode == "incremental"
    masked, originals = renderer._mask_control_text(history)
    assert ids == renderer._encode_masked(renderer.render(masked, add_generation_prompt=True), originals)


POSITIONAL_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + ' ' + loop.index|string + '\\n' }}{%- endif %}"
    "{{- message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""Prefix-preserving, but every env message carries its position: only a full render knows it."""


def test_position_dependent_template_falls_back_to_full_render_and_says_why():
    tokenizer = family_tokenizer("smollm2-135m-instruct")
    renderer = ChatRenderer(tokenizer, chat_template=POSITIONAL_TEMPLATE)
    assert renderer.suffix_mode == "full"
    assert "position-dependent" in renderer.suffix_mode_reason and "probe step" in renderer.suffix_mode_reason
    opening, steps = conversation(20, None)
    history = list(opening)
    for said, new in steps:
        history.append(said)
        assert renderer.suffix_ids(history, new) == full_suffix_ids(renderer, history, new, True)
        history += new
    assert renderer.suffix_text(history[:-1], history[-1:]).startswith("\n<|im_start|>user 42\n")


def test_probes_run_once_per_template_not_per_tool_set(monkeypatch):
    tokenizer = family_tokenizer("qwen2.5-instruct")
    tools = hotel_tools()
    ChatRenderer(tokenizer, tools[:2], template_kwargs={"probe_once": 1})
    calls = []
    monkeypatch.setattr(ChatRenderer, "_local_suffix_problem", lambda self: calls.append("local"))
    monkeypatch.setattr(ChatRenderer, "prefix_problem", lambda self, template: calls.append("prefix"))
    other = ChatRenderer(tokenizer, tools[2:], template_kwargs={"probe_once": 1})
    assert calls == [] and other.suffix_mode == "incremental"
    assert "search_hotels" not in other.render([{"role": "user", "content": "Hi."}])  # its own tools, not the first's


def test_renderer_cache_is_bounded(monkeypatch):
    tokenizer = family_tokenizer("qwen2.5-instruct")
    engine = rollout_engine.RolloutEngine(lambda: envkit.make("hotel-booking"), None, tokenizer)
    monkeypatch.setattr(renderers, "_RENDERERS_MAX", 3)
    tools = hotel_tools()
    first = engine.renderer_for(tools[:1])
    for count in range(2, 7):
        engine.renderer_for(tools[:count])
        assert len(renderers._RENDERERS) <= 3
    assert engine.renderer_for(tools[:6]) is engine.renderer_for(tools[:6])
    assert engine.renderer_for(tools[:1]) is not first  # evicted, built again
