"""Whether envkit reads back the tool calls a chat template writes: the check that a template's tool-call format is
one envkit parses, derived from the template itself instead of a list of known formats.

:func:`~envkit.chat.parsing.parse_assistant` picks its parser by looking for a format's marks in the template text and
falls back to the Hermes ``<tool_call>`` one. A template that writes calls in another format (LFM2's
``<|tool_call_start|>[name(arg=…)]``, Qwen3.5's XML ``<function=…><parameter=…>``) would then have every call the
model makes read as plain text or as malformed: episodes that score 0 without an error. So a renderer with tools
renders one call through the template, parses the assistant text back as the rollout would, and refuses the template
when the call does not come back (:func:`readback_problem`).
"""

from __future__ import annotations

from typing import Any

from envkit.chat.parsing import parse_assistant, tool_call_format
from envkit.chat.probes import PROBE_TOOLS
from envkit.util.text import one_line

PROBE_CALL = {"type": "function", "function": {"name": "lookup", "arguments": {"q": "x y", "n": 3}}}
"""The call rendered and read back: a string and a whole number, which must come back as a number (a format that
writes values as bare text, read without the tool's schema, gives ``"3"``, which a typed tool refuses)."""


def readback_problem(
    tokenizer: Any, chat_template: str, template_kwargs: dict[str, Any], end_of_turn: str
) -> str | None:
    """Why envkit cannot read back a tool call ``chat_template`` writes (``None``: it can).

    The template renders a user message, then an assistant message holding :data:`PROBE_CALL` (with an empty and with
    a ``None`` content: templates differ on which a call-only message carries); the text after the generation prompt,
    up to ``end_of_turn``, is parsed with the tokenizer as the rollout parses the model's text. A template that renders
    neither variant after its own generation prompt is left to the renderer's other probes.
    """
    opening = [{"role": "user", "content": "Hello."}]

    def render(messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        return tokenizer.apply_chat_template(
            messages,
            tools=PROBE_TOOLS,
            chat_template=chat_template,
            add_generation_prompt=generation_prompt,
            tokenize=False,
            **template_kwargs,
        )

    prefix = render(opening, True)
    wanted = [(PROBE_CALL["function"]["name"], PROBE_CALL["function"]["arguments"])]
    read: list[str] = []
    for content in ("", None):
        try:
            full = render([*opening, {"role": "assistant", "content": content, "tool_calls": [PROBE_CALL]}], False)
        except Exception:
            continue
        if not full.startswith(prefix):
            continue
        text = full[len(prefix) :]
        text = text[: text.find(end_of_turn)] if end_of_turn in text else text
        message = parse_assistant(text, tokenizer, chat_template=chat_template)
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
        if calls == wanted:
            return None
        what = ", ".join(f"{name}({arguments})" for name, arguments in calls) or "no call"
        if message.get("malformed_tool_calls"):
            what += f" and a malformed one ({one_line(message['malformed_tool_calls'][0], 80)})"
        read.append(f"it writes {text.strip()!r:.120} and envkit reads {what}")
    if not read:
        return None
    parser = (
        "the tokenizer's response_template"
        if getattr(tokenizer, "response_template", None) is not None
        else f"the {tool_call_format(tokenizer, chat_template)} parser"
    )
    return (
        f"envkit cannot read back the tool calls this chat template writes: asked for lookup(q='x y', n=3), {read[0]} "
        f"(with {parser}), so every call the model made would be read as text or as malformed. Fix: give the "
        "tokenizer a response_template that parses this format (transformers' response parsing; "
        "trl.chat_template_utils.add_response_schema sets it for the templates TRL knows), or pass chat_template= a "
        "template in a format envkit parses (Hermes <tool_call> JSON, Llama 3 JSON, DeepSeek-V3)"
    )
