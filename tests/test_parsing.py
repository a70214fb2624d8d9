"""parse_assistant: raw model text → assistant message with tool_calls; malformed calls never raise."""

from __future__ import annotations

import copy
import functools
import json

import jinja2
import pytest
from helpers import tool_call

from envkit import parse_assistant
from envkit.chat.parsing import tool_call_format
from envkit.chat.render import bundled_template
from envkit.testing import load_shared_tokenizer


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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool_call>\n{"name": "lookup", "parameters": {"q": "x"}}\n</tool_call>', [tool_call("lookup", q="x")]),
        ('<tool_call>\n{"name": "lookup", "arguments": {"q": "x"}}\n', "is not closed"),  # a turn cut mid-call
    ],
)
def test_a_call_means_the_same_with_a_response_template_as_without(qwen25_tokenizer, text, expected):
    """transformers' response template reads only ``arguments`` (the call ran with none) and takes an unclosed
    ``<tool_call>`` as a call; the Hermes JSON format is read exactly, whichever the tokenizer carries."""
    from trl.chat_template_utils import add_response_schema

    tokenizer = add_response_schema(copy.deepcopy(qwen25_tokenizer))
    for parsed in (parse_assistant(text, tokenizer), parse_assistant(text, qwen25_tokenizer)):
        if isinstance(expected, list):
            assert parsed["tool_calls"] == expected
        else:
            assert "tool_calls" not in parsed and expected in parsed["malformed_tool_calls"][0]


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


# --- Each family's own tool-call format, through the real tokenizer and its real chat template -------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "The query."}}},
        },
    }
]
END_OF_TURN = {
    "qwen2.5-instruct": "<|im_end|>",
    "qwen3": "<|im_end|>",
    "llama-3.2-instruct": "<|eot_id|>",
    "deepseek-v3": "<｜end▁of▁sentence｜>",
    "gemma-3-it": "<end_of_turn>",
    "smollm2-135m-instruct": "<|im_end|>",
}
TEMPLATE_KWARGS = {"llama-3.2-instruct": {"date_string": "26 Jul 2024"}}
"""Llama 3 templates print today's date unless given one."""
CALL = tool_call("lookup", q='Zürich "old town"', limit=3, filters={"stars": [4, 5], "open": True, "near": None})


SHARED_MISSING = "../shared/tokenizers not present (a clone outside the envkit workspace): real-tokenizer test skipped"


@functools.cache
def _load(family: str):
    return load_shared_tokenizer(family)


def family_tokenizer(family: str):
    tokenizer = _load(family)
    if tokenizer is None:
        pytest.skip(SHARED_MISSING)
    return tokenizer


def render(tokenizer, family: str, messages: list[dict], **kwargs) -> str:
    kwargs = {**TEMPLATE_KWARGS.get(family, {}), **kwargs}
    return tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, **kwargs)


def generated_text(tokenizer, family: str, conversation: list[dict], index: int) -> str:
    """The model's text for ``conversation[index]``: after the generation prompt, up to the end-of-turn token."""
    prompt = render(tokenizer, family, conversation[:index], add_generation_prompt=True)
    full = render(tokenizer, family, conversation)
    assert full.startswith(prompt)
    turn = full[len(prompt) :]
    return turn[: turn.index(END_OF_TURN[family])]


def decoded(tokenizer, text: str) -> str:
    """The text as the rollout engine sees it: the model's token ids, decoded."""
    return tokenizer.decode(tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=False)


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("qwen2.5-instruct", "hermes"),
        ("qwen3", "hermes"),
        ("llama-3.2-instruct", "llama3_json"),
        ("deepseek-v3", "deepseek_v3"),
        ("gemma-3-it", "hermes"),  # renders no tool calls: the default
        ("smollm2-135m-instruct", "hermes"),
    ],
)
def test_the_format_is_read_off_the_chat_template(family, expected):
    assert tool_call_format(family_tokenizer(family)) == expected


def test_the_format_follows_the_template_not_the_tokenizer(qwen25_tokenizer):
    llama_template = family_tokenizer("llama-3.2-instruct").chat_template
    assert tool_call_format(qwen25_tokenizer, llama_template) == "llama3_json"
    assert tool_call_format(family_tokenizer("llama-3.2-instruct"), bundled_template()) == "hermes"
    assert tool_call_format(None) == "hermes"
    text = '{"name": "lookup", "parameters": {"q": "x"}}'
    assert parse_assistant(text, qwen25_tokenizer, chat_template=llama_template)["tool_calls"] == [
        tool_call("lookup", q="x")
    ]


ROUND_TRIPS = [
    ("qwen2.5-instruct", "", [CALL]),
    ("qwen2.5-instruct", "", [tool_call("get_total"), CALL]),
    ("qwen2.5-instruct", "Let me look that up.", [CALL]),
    ("qwen3", "", [CALL]),
    ("qwen3", "", [tool_call("get_total"), CALL]),
    ("qwen3", "Let me look that up.", [CALL]),
    ("llama-3.2-instruct", "", [CALL]),  # one call per turn: the template raises on more
]


@pytest.mark.parametrize(("family", "content", "calls"), ROUND_TRIPS)
def test_a_rendered_call_parses_back_and_renders_identically(family, content, calls):
    tokenizer = family_tokenizer(family)
    conversation = [
        {"role": "user", "content": "Find hotels in Zürich."},
        {"role": "assistant", "content": content, "tool_calls": calls},
        *({"role": "tool", "name": call["function"]["name"], "content": "2 hotels"} for call in calls),
        {"role": "assistant", "content": "There are two."},
    ]
    text = generated_text(tokenizer, family, conversation, 1)
    message = parse_assistant(decoded(tokenizer, text + END_OF_TURN[family]), tokenizer)
    assert message == {"role": "assistant", "content": content, "tool_calls": calls}
    assert parse_assistant(text, tokenizer) == message  # the rollout engine parses the turn without its end token
    replaced = [conversation[0], message, *conversation[2:]]
    assert render(tokenizer, family, replaced) == render(tokenizer, family, conversation)


def test_llama_text_before_a_call_is_content_which_its_template_drops():
    tokenizer = family_tokenizer("llama-3.2-instruct")
    message = parse_assistant('Let me look.\n{"name": "lookup", "parameters": {"q": "x"}}<|eot_id|>', tokenizer)
    assert message == {"role": "assistant", "content": "Let me look.", "tool_calls": [tool_call("lookup", q="x")]}
    rendered = render(tokenizer, "llama-3.2-instruct", [{"role": "user", "content": "hi"}, message])
    assert rendered.endswith('<|end_header_id|>\n\n{"name": "lookup", "parameters": {"q": "x"}}<|eot_id|>')


def test_llama_calls_parse_where_the_transformers_parser_does_not():
    from trl.chat_template_utils import add_response_schema

    tokenizer = add_response_schema(copy.deepcopy(family_tokenizer("llama-3.2-instruct")))
    prefix = "<|start_header_id|>assistant<|end_header_id|>\n\n"
    with pytest.raises(ValueError, match="could not parse region as JSON"):
        tokenizer.parse_response('{"name": "lookup", "parameters": {"q": "x"}}', prefix=prefix)  # no <|eot_id|>
    for text in [
        '{"name": "lookup", "parameters": {"q": "x"}}',
        '<|python_tag|>{"name": "lookup", "parameters": {"q": "x"}}',
    ]:
        assert parse_assistant(text, tokenizer) == {
            "role": "assistant",
            "content": "",
            "tool_calls": [tool_call("lookup", q="x")],
        }


def deepseek_render(tokenizer, messages: list[dict], **kwargs) -> str:
    """DeepSeek-V3's template rendered as written: ``apply_chat_template`` drops ``content=None``, which it needs."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        [messages], chat_template=tokenizer.chat_template, **tokenizer.special_tokens_map, **kwargs
    )
    return rendered[0]


def deepseek_call(name: str, **arguments) -> dict:
    """A call as DeepSeek-V3's template needs it: it joins ``arguments`` into the text, so they must be a string."""
    return {"type": "function", "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}


def test_deepseek_template_cannot_render_a_call_message_through_apply_chat_template():
    tokenizer = family_tokenizer("deepseek-v3")
    message = {"role": "assistant", "content": None, "tool_calls": [deepseek_call("lookup", q="x")]}
    with pytest.raises(jinja2.exceptions.UndefinedError, match="has no attribute 'content'"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, message], tokenize=False)
    assert "<｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n```json\n" in deepseek_render(
        tokenizer, [{"role": "user", "content": "hi"}, message]
    )


def test_deepseek_calls_parse_back_and_render_identically():
    tokenizer = family_tokenizer("deepseek-v3")
    arguments = CALL["function"]["arguments"]
    conversation = [
        {"role": "user", "content": "Find hotels in Zürich."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [deepseek_call("lookup", **arguments), deepseek_call("get_total")],
        },
        {"role": "tool", "content": "2 hotels"},
        {"role": "tool", "content": "0"},
        {"role": "assistant", "content": "There are two."},
    ]
    prompt = deepseek_render(tokenizer, conversation[:1], add_generation_prompt=True)
    full = deepseek_render(tokenizer, conversation)
    text = full[len(prompt) : full.index("<｜end▁of▁sentence｜>", len(prompt))]
    assert text.startswith("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>") and text.endswith("<｜tool▁calls▁end｜>")
    message = parse_assistant(decoded(tokenizer, text + "<｜end▁of▁sentence｜>"), tokenizer)
    assert message == {"role": "assistant", "content": text, "tool_calls": [CALL, tool_call("get_total")]}
    replaced = [conversation[0], message, *conversation[2:]]
    assert tokenizer.apply_chat_template(replaced, tokenize=False) == full


def test_a_deepseek_episode_renders_back_exactly_what_the_model_generated():
    tokenizer = family_tokenizer("deepseek-v3")
    one_call = (  # how the model closes a turn; the template itself never closes a one-call turn
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n```json\n"
        '{"q": "x"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
    )
    with_text = (
        "Now the total.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_total\n```json\n"
        "{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
    )
    turns = [
        (one_call, "", [tool_call("lookup", q="x")]),
        (with_text, "2 hotels", [tool_call("get_total")]),
        ("Two hotels, total 0.<｜end▁of▁sentence｜>", "0", None),
    ]
    history: list[dict] = [{"role": "user", "content": "Find x."}]
    for text, result, calls in turns:
        if result:
            history.append({"role": "tool", "content": result})
        prompt = tokenizer.apply_chat_template(history, tokenize=False, add_generation_prompt=True)
        message = parse_assistant(text, tokenizer)
        assert message.get("tool_calls") == calls
        history.append(message)
        assert tokenizer.apply_chat_template(history, tokenize=False) == prompt + text


LLAMA_MALFORMED = [
    ('{"name": "lookup", "parameters": {"q": "x"', "is not closed"),
    ('{"name": "lookup", "parameters": {q: "x"}}', "invalid JSON"),
    ('{"parameters": {"q": "x"}}', 'missing "name"'),
    ('{"name": 7, "parameters": {}}', 'missing "name"'),
    ('{"name": "lookup", "parameters": [1, 2]}', "arguments must be an object"),
    ('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}', "takes one per turn"),
    ('{"name": "a", "parameters": {}}, {"name": "b", "parameters": {}}', "takes one per turn"),
    ('[{"name": "lookup", "parameters": {"q": "x"}}]', "takes one per turn"),
    ('{"name": "lookup", "parameters": {"q": "x"}}\nI will wait for the result.', "text after the tool call"),
    ('{"type": "function", "function": {"name": "lookup", "parameters": {"q": "x"}}}', "expected the reply to be {"),
]
DS_CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{arguments}\n```<｜tool▁call▁end｜>"
DEEPSEEK_MALFORMED = [
    ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n```json\n{", "is not closed"),
    (
        "<｜tool▁calls▁begin｜>" + DS_CALL.format(name="lookup", arguments='{"q": }') + "<｜tool▁calls▁end｜>",
        "invalid JSON",
    ),
    (
        "<｜tool▁calls▁begin｜>" + DS_CALL.format(name="", arguments="{}") + "<｜tool▁calls▁end｜>",
        "missing function name",
    ),
    (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>lookup {}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "expected function",
    ),
    (
        "<｜tool▁calls▁begin｜>" + DS_CALL.format(name="lookup", arguments="[1]") + "<｜tool▁calls▁end｜>",
        "must be an object",
    ),
    ("<｜tool▁calls▁begin｜>lookup(q='x')<｜tool▁calls▁end｜>", "holds no"),
]


@pytest.mark.parametrize(
    ("family", "text", "reason"),
    [pytest.param("llama-3.2-instruct", *case, id=f"llama-{case[1]}") for case in LLAMA_MALFORMED]
    + [pytest.param("deepseek-v3", *case, id=f"deepseek-{case[1]}") for case in DEEPSEEK_MALFORMED],
)
def test_malformed_calls_in_each_format_keep_the_text_and_say_why(family, text, reason):
    message = parse_assistant(text + END_OF_TURN[family], family_tokenizer(family))
    assert "tool_calls" not in message
    assert message["content"] == text
    assert len(message["malformed_tool_calls"]) == 1 and reason in message["malformed_tool_calls"][0]


def test_a_good_deepseek_call_next_to_an_unclosed_one_is_kept():
    good = DS_CALL.format(name="lookup", arguments='{"q": "x"}')
    text = f"<｜tool▁calls▁begin｜>{good}\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_total\n<｜tool▁calls▁end｜>"
    message = parse_assistant(text, family_tokenizer("deepseek-v3"))
    assert message["tool_calls"] == [tool_call("lookup", q="x")]
    assert "is not closed" in message["malformed_tool_calls"][0]


@pytest.mark.parametrize(
    ("family", "text", "content"),
    [
        ("llama-3.2-instruct", "Hello there.<|eot_id|>", "Hello there."),
        ("llama-3.2-instruct", '{"name": "Ada", "born": 1815}<|eot_id|>', '{"name": "Ada", "born": 1815}'),
        (
            "llama-3.2-instruct",
            'Write {"name": "lookup", "parameters": {}} to call it.',
            'Write {"name": "lookup", "parameters": {}} to call it.',
        ),
        (
            "llama-3.2-instruct",
            "<|python_tag|>brave_search.call(query='x')<|eom_id|>",
            "<|python_tag|>brave_search.call(query='x')",
        ),
        ("deepseek-v3", " Hello,\nthere. <｜end▁of▁sentence｜>", " Hello,\nthere. "),  # rendered as is: kept as is
        ("gemma-3-it", "Hello there.<end_of_turn>", "Hello there."),
        ("smollm2-135m-instruct", "Hello there.<|im_end|>", "Hello there."),
    ],
)
def test_plain_text_stays_plain_content_in_each_family(family, text, content):
    assert parse_assistant(text, family_tokenizer(family)) == {"role": "assistant", "content": content}


@pytest.mark.parametrize("end", ["<|eot_id|>", "<｜end▁of▁sentence｜>", "<end_of_turn>", "<|im_end|>"])
def test_each_family_end_of_turn_token_is_removed_without_a_tokenizer(end):
    assert parse_assistant("Hi." + end) == {"role": "assistant", "content": "Hi."}


@pytest.mark.parametrize("family", ["llama-3.2-instruct", "deepseek-v3"])
def test_never_raises_on_garbage_in_other_formats(family):
    tokenizer = family_tokenizer(family)
    garbage = ["", "{", '{"name"', '{"parameters": ', "<|python_tag|>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁end｜>"]
    garbage += ["<｜tool▁call▁begin｜><｜tool▁sep｜>", "\x00\udcff", "{" * 1000, "<｜tool▁call▁begin｜>" * 50]
    for text in garbage:
        assert parse_assistant(text, tokenizer)["role"] == "assistant"
