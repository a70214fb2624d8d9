"""parse_assistant: raw model text → assistant message with tool_calls; malformed calls never raise."""

from __future__ import annotations

import copy

import pytest
from helpers import tool_call

from envkit import parse_assistant


def test_plain_text():
    assert parse_assistant("Hello there.<|im_end|>") == {"role": "assistant", "content": "Hello there."}


def test_one_well_formed_call():
    text = '<tool_call>\n{"name": "add", "arguments": {"amount": 3}}\n</tool_call><|im_end|>'
    assert parse_assistant(text) == {"role": "assistant", "content": "", "tool_calls": [tool_call("add", amount=3)]}


def test_several_calls_and_text_around_them():
    text = (
        "Let me check both.\n"
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {"x": [1, "two"]}}\n</tool_call>\nOne moment.'
    )
    message = parse_assistant(text)
    assert message["tool_calls"] == [tool_call("a"), tool_call("b", x=[1, "two"])]
    assert message["content"] == "Let me check both.\n\n\nOne moment."


def test_arguments_given_as_a_json_string():
    text = '<tool_call>{"name": "add", "arguments": "{\\"amount\\": 2}"}</tool_call>'
    assert parse_assistant(text)["tool_calls"] == [tool_call("add", amount=2)]


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('<tool_call>{"name": "add", "arguments": {"amount": 1}</tool_call>', "invalid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'expected {"name": ..., "arguments": {...}}'),
        ('<tool_call>["add"]</tool_call>', 'expected {"name": ..., "arguments": {...}}'),
        ('<tool_call>{"name": "add", "arguments": 5}</tool_call>', "arguments must be an object"),
        ('<tool_call>{"name": "add", "arguments": "nope"}</tool_call>', "arguments are a string that is not JSON"),
        ('I will call it <tool_call>{"name": "add", "arg', "<tool_call> is not closed"),
    ],
)
def test_malformed_calls_keep_the_text_and_say_why(text, reason):
    message = parse_assistant(text)
    assert "tool_calls" not in message
    assert message["content"] == text
    assert len(message["malformed_tool_calls"]) == 1 and reason in message["malformed_tool_calls"][0]


def test_a_good_call_next_to_a_bad_one_is_kept():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{bad}</tool_call>'
    message = parse_assistant(text)
    assert message["tool_calls"] == [tool_call("a")]
    assert len(message["malformed_tool_calls"]) == 1


def test_reasoning_block_is_split_off():
    message = parse_assistant("<think>\nadd three\n</think>\n\nSure.")
    assert message == {"role": "assistant", "content": "Sure.", "reasoning_content": "add three"}


def test_decoded_real_tokens_parse(qwen25_tokenizer):
    text = '<tool_call>\n{"name": "search_hotels", "arguments": {"city": "Zürich", "max_price": 150}}\n</tool_call>'
    ids = qwen25_tokenizer.encode(text + "<|im_end|>", add_special_tokens=False)
    message = parse_assistant(qwen25_tokenizer.decode(ids), qwen25_tokenizer)
    assert message["tool_calls"] == [tool_call("search_hotels", city="Zürich", max_price=150)]


def test_transformers_response_parsing_is_used_when_the_tokenizer_has_a_template(qwen25_tokenizer):
    from trl.chat_template_utils import add_response_schema

    tokenizer = add_response_schema(copy.deepcopy(qwen25_tokenizer))
    assert tokenizer.response_template is not None
    text = (
        '<tool_call>\n{"name": "add", "arguments": {"amount": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call><|im_end|>'
    )
    message = parse_assistant(text, tokenizer)
    assert message["tool_calls"] == [tool_call("add", amount=3), tool_call("b")]
    # transformers' parser rejects broken JSON; the built-in parser then reports it instead of raising
    broken = parse_assistant('<tool_call>\n{"name": "add", "arguments": {\n</tool_call>', tokenizer)
    assert "tool_calls" not in broken and "invalid JSON" in broken["malformed_tool_calls"][0]


def test_never_raises_on_garbage(qwen25_tokenizer):
    for text in ["", "<tool_call>", "</tool_call>", "<tool_call></tool_call>", "\x00\udcff", "<think>", "{" * 1000]:
        for tokenizer in (None, qwen25_tokenizer):
            assert parse_assistant(text, tokenizer)["role"] == "assistant"


def test_transformers_parser_output_is_normalised(qwen25_tokenizer):
    from trl.chat_template_utils import add_response_schema

    tokenizer = add_response_schema(copy.deepcopy(qwen25_tokenizer))
    message = parse_assistant('<tool_call>\n{"name": "get_total"}\n</tool_call><|im_end|>', tokenizer)
    assert message["tool_calls"] == [tool_call("get_total")]
    rendered = qwen25_tokenizer.apply_chat_template([{"role": "user", "content": "x"}, message], tokenize=False)
    assert '{"name": "get_total", "arguments": {}}' in rendered
