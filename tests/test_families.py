"""Every model family we can get, through the real tokenizer and its real chat template (../shared/tokenizers).

For each family the rollout engine must produce trajectories where prompt + completion equal the template's own
rendering of the final conversation and the model spans are exactly the generated tokens; a family whose template
cannot serve an env is refused in one line that names the fix. The README's "Supported model families" table states
what these tests check.
"""

from __future__ import annotations

import pytest
from helpers import CheckedOracleBackend, CounterEnv

import envkit
from envkit.chat.render import ChatRenderer, TemplateError, bundled_template
from envkit.rollout import RolloutEngine, SamplingParams
from envkit.testing import load_shared_tokenizer

TOOL_FAMILIES = ["qwen2.5-instruct", "qwen3", "llama-3.2-instruct"]
"""Templates that render tool definitions, tool calls and tool results."""
TEXT_ONLY_FAMILIES = ["deepseek-v3", "gemma-3-it", "smollm2-135m-instruct"]
"""Templates that do not render tool definitions: text envs only, tool envs refused."""


def family_tokenizer(name: str):
    tokenizer = load_shared_tokenizer(name)
    if tokenizer is None:
        pytest.skip("../shared/tokenizers not present (a clone outside the envkit workspace): family test skipped")
    return tokenizer


def model_spans(episode) -> list[list[int]]:
    spans, current = [], []
    for token, mask in zip(episode.completion_ids, episode.env_mask, strict=True):
        if mask:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return [*spans, current] if current else spans


def assert_token_exact(episodes, backend, renderer: ChatRenderer) -> None:
    """prompt + completion == the template's rendering of the final conversation; model spans == generated tokens."""
    tokenizer = renderer.tokenizer
    for episode in episodes:
        assert episode.error is None and episode.score == 1.0, episode.error
        assert model_spans(episode) == backend.spans[episode.task_seed]
        rendered = renderer.render(episode.messages)
        if episode.messages[-1]["role"] == "assistant":  # ends on the model's turn: at its end-of-turn token
            rendered = rendered[: rendered.rfind(renderer.end_of_turn) + len(renderer.end_of_turn)]
        assert episode.prompt_ids + episode.completion_ids == renderer.encode(rendered)
        assert tokenizer.decode(episode.prompt_ids + episode.completion_ids) == rendered


@pytest.mark.parametrize("family", TOOL_FAMILIES)
@pytest.mark.parametrize("env_name", ["counter", "arithmetic"])
def test_multi_turn_tool_episodes_are_token_exact(family, env_name):
    tokenizer = family_tokenizer(family)
    factory = CounterEnv if env_name == "counter" else (lambda: envkit.make("arithmetic"))
    seeds = [0, 1, 2]
    backend = CheckedOracleBackend(factory, tokenizer, seeds)
    episodes = RolloutEngine(factory, backend, tokenizer).run(seeds, 2, SamplingParams())
    renderer = ChatRenderer(tokenizer, factory().tools)
    assert_token_exact(episodes, backend, renderer)
    assert sum(e.num_tool_calls for e in episodes) >= len(episodes)  # the family's own call format was parsed
    assert all(e.tool_errors == 0 for e in episodes)


@pytest.mark.parametrize("family", TOOL_FAMILIES + TEXT_ONLY_FAMILIES)
def test_text_episodes_are_token_exact(family):
    tokenizer = family_tokenizer(family)
    factory = lambda: envkit.make("guess-number")  # noqa: E731
    seeds = [0, 3]
    backend = CheckedOracleBackend(factory, tokenizer, seeds)
    episodes = RolloutEngine(factory, backend, tokenizer).run(seeds, 1, SamplingParams())
    assert all(e.turns >= 2 for e in episodes)
    assert_token_exact(episodes, backend, ChatRenderer(tokenizer))


@pytest.mark.parametrize("family", TEXT_ONLY_FAMILIES)
def test_a_tool_env_on_a_template_without_tools_fails_at_start_up_naming_the_fix(family):
    tokenizer = family_tokenizer(family)
    engine = RolloutEngine(
        lambda: envkit.make("arithmetic"), CheckedOracleBackend(CounterEnv, tokenizer, []), tokenizer
    )
    with pytest.raises(TemplateError, match=r"does not render tool definitions.*Fix: pass chat_template="):
        engine.run([0], 1, SamplingParams())


def test_smollm2_with_the_bundled_chatml_tool_template_is_token_exact():
    """The fix the refusal names: SmolLM2 speaks ChatML, so envkit's ChatML tool template works with its tokens."""
    tokenizer = family_tokenizer("smollm2-135m-instruct")
    seeds = [0, 1]
    backend = CheckedOracleBackend(CounterEnv, tokenizer, seeds, chat_template=bundled_template())
    episodes = RolloutEngine(CounterEnv, backend, tokenizer, chat_template=bundled_template()).run(
        seeds, 2, SamplingParams()
    )
    assert_token_exact(episodes, backend, ChatRenderer(tokenizer, CounterEnv().tools, chat_template=bundled_template()))
