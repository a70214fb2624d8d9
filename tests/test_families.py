"""Every model family we can get, through the real tokenizer and its real chat template (../shared/tokenizers).

For each family the rollout engine must produce trajectories where prompt + completion equal the template's own
rendering of the final conversation and the model spans are exactly the generated tokens; a family whose template
cannot serve an env is refused in one line that names the fix. The README's "Supported model families" table states
what these tests check.
"""

from __future__ import annotations

import copy
from pathlib import Path

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
CALL_FORMATS_OF_THEIR_OWN = ["lfm2_v2.jinja", "qwen3_8.jinja"]
"""TRL's templates of families whose tool calls envkit's own parsers do not read: LFM2's
``<|tool_call_start|>[name(arg=…)]`` and Qwen3.5+'s XML ``<function=…><parameter=…>`` inside ``<tool_call>``."""
READ_BY_TRLS_RESPONSE_TEMPLATE = ["lfm2_v2.jinja"]
"""Those TRL's response template reads back whole. Qwen3.5+'s XML writes values as bare text, and transformers'
response parsing (which has no tool schema) reads ``<parameter=n>3`` as ``"3"``: still refused with it."""


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


def trl_template(name: str) -> str:
    import trl

    return (Path(trl.__file__).parent / "chat_templates" / name).read_text()


@pytest.mark.parametrize("name", CALL_FORMATS_OF_THEIR_OWN)
def test_a_template_whose_tool_calls_envkit_cannot_read_back_is_refused_at_start_up(name):
    """The template renders tools, calls and results, so it passed every other check; but envkit's parser would read
    each call the model makes as text (LFM2) or as malformed (Qwen3.5+): episodes scoring 0 with no error. The
    renderer renders one call and reads it back, and refuses the template in one line naming the fix."""
    tokenizer = family_tokenizer("qwen2.5-instruct")
    with pytest.raises(TemplateError, match=r"cannot read back the tool calls.*Fix: give the tokenizer a response_t"):
        ChatRenderer(tokenizer, CounterEnv().tools, chat_template=trl_template(name))
    with pytest.raises(TemplateError) as refused:
        ChatRenderer(tokenizer, CounterEnv().tools, chat_template=trl_template(name))
    assert "\n" not in str(refused.value)
    ChatRenderer(tokenizer, chat_template=trl_template(name))  # a text env never parses a call: not refused


@pytest.mark.parametrize("name", READ_BY_TRLS_RESPONSE_TEMPLATE)
def test_with_the_fix_it_names_the_calls_are_read_and_episodes_are_token_exact(name):
    """The fix the refusal names: TRL's response template for the family (transformers' response parsing) reads the
    calls; multi-turn tool episodes then run with every call executed, token-exact."""
    from trl.chat_template_utils import add_response_schema

    tokenizer = copy.deepcopy(family_tokenizer("qwen2.5-instruct"))
    tokenizer.chat_template = trl_template(name)
    add_response_schema(tokenizer)
    seeds = [0, 1]
    backend = CheckedOracleBackend(CounterEnv, tokenizer, seeds)
    episodes = RolloutEngine(CounterEnv, backend, tokenizer).run(seeds, 2, SamplingParams())
    assert_token_exact(episodes, backend, ChatRenderer(tokenizer, CounterEnv().tools))
    assert sum(e.num_tool_calls for e in episodes) >= len(episodes) and all(e.tool_errors == 0 for e in episodes)


def test_a_response_template_that_reads_numbers_back_as_text_is_refused_too():
    from trl.chat_template_utils import add_response_schema

    tokenizer = copy.deepcopy(family_tokenizer("qwen2.5-instruct"))
    tokenizer.chat_template = trl_template("qwen3_8.jinja")
    add_response_schema(tokenizer)
    read_as_text = r"envkit reads lookup\(\{'q': 'x y', 'n': '3'\}\) \(with the tokenizer's response_template\)"
    with pytest.raises(TemplateError, match=read_as_text):
        ChatRenderer(tokenizer, CounterEnv().tools)


def test_smollm2_with_the_bundled_chatml_tool_template_is_token_exact():
    """The fix the refusal names: SmolLM2 speaks ChatML, so envkit's ChatML tool template works with its tokens."""
    tokenizer = family_tokenizer("smollm2-135m-instruct")
    seeds = [0, 1]
    backend = CheckedOracleBackend(CounterEnv, tokenizer, seeds, chat_template=bundled_template())
    episodes = RolloutEngine(CounterEnv, backend, tokenizer, chat_template=bundled_template()).run(
        seeds, 2, SamplingParams()
    )
    assert_token_exact(episodes, backend, ChatRenderer(tokenizer, CounterEnv().tools, chat_template=bundled_template()))
