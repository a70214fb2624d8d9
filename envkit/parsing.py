"""Turn a model's raw output text into an assistant message with ``tool_calls``.

Two parsers, in this order:

1. transformers' response parsing (``tokenizer.parse_response``), when the tokenizer carries a ``response_template``
   (set by the model's files, or by ``trl.chat_template_utils.add_response_schema`` for the templates TRL knows:
   Qwen2.5/3/3.5, Llama 3.x, GLM-4-MoE, GPT-OSS, Gemma 4, …).
2. The built-in Hermes parser for ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks — the format
   of Qwen2/2.5/3, Hermes 2/3 and most ChatML tool templates — with optional ``<think>…</think>`` reasoning.

Malformed tool calls never raise: the text stays in ``content`` and the message carries
``"malformed_tool_calls": [reason, ...]``, which :class:`envkit.ToolEnv` answers with an error tool message.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any

from envkit.messages import Message

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)


def parse_assistant(text: str, tokenizer: Any = None, *, prefix: str | None = None) -> Message:
    """Parse the model's raw text into ``{"role": "assistant", "content": str, "tool_calls": [...]}``.

    Args:
        text: The generated text of one assistant turn (special tokens may be included; a trailing end-of-turn token
            is removed).
        tokenizer: The model's tokenizer. When it has a ``response_template``, transformers' ``parse_response`` is
            used; otherwise (or with ``None``) the built-in Hermes/Qwen ``<tool_call>`` parser.
        prefix: The prompt text before generation, for ``parse_response``. Defaults to the template's generation
            prompt (e.g. ``"<|im_start|>assistant\\n"``).

    Returns:
        An assistant message. ``tool_calls`` is present only when the text has well-formed calls;
        ``malformed_tool_calls`` lists why a call could not be parsed.
    """
    text = _strip_end_of_turn(text, tokenizer)
    if tokenizer is not None and getattr(tokenizer, "response_template", None) is not None:
        message = _parse_with_transformers(text, tokenizer, prefix)
        if message is not None:
            return message
    return parse_hermes(text)


def parse_hermes(text: str) -> Message:
    """The built-in parser for ``<tool_call>{json}</tool_call>`` blocks (Hermes / Qwen format)."""
    message: Message = {"role": "assistant"}
    body = text
    think = _THINK.match(body)
    if think:
        message["reasoning_content"] = think.group(1).strip()
        body = body[think.end() :]
    calls, malformed = [], []
    for match in _TOOL_CALL.finditer(body):
        call, problem = _parse_call_json(match.group(1), closed=match.group(0).endswith("</tool_call>"))
        if call is not None:
            calls.append(call)
        else:
            malformed.append(problem)
    if malformed:
        message["content"] = body.strip()  # keep the whole text: the model sees what it wrote
        message["malformed_tool_calls"] = malformed
        if calls:
            message["tool_calls"] = calls
    else:
        message["content"] = _TOOL_CALL.sub("", body).strip()
        if calls:
            message["tool_calls"] = calls
    return message


def _parse_call_json(raw: str, closed: bool) -> tuple[dict[str, Any] | None, str]:
    snippet = raw.strip()
    shown = snippet if len(snippet) <= 200 else snippet[:200] + "…"
    if not closed:
        return None, f"<tool_call> is not closed with </tool_call>: {shown}"
    try:
        data = json.loads(snippet)
    except json.JSONDecodeError as error:
        return None, f"invalid JSON ({error.msg} at position {error.pos}): {shown}"
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None, f'expected {{"name": ..., "arguments": {{...}}}}, got: {shown}'
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None, f"arguments are a string that is not JSON: {shown}"
    if not isinstance(arguments, dict):
        return None, f"arguments must be an object, got {type(arguments).__name__}: {shown}"
    return {"type": "function", "function": {"name": data["name"], "arguments": arguments}}, ""


def _parse_with_transformers(text: str, tokenizer: Any, prefix: str | None) -> Message | None:
    """transformers' parser; ``None`` when it fails, so the built-in parser can report what is malformed."""
    if prefix is None:
        prefix = generation_prompt(tokenizer)
    try:
        parsed = tokenizer.parse_response(text, prefix=prefix)
    except Exception:
        return None
    if not isinstance(parsed, dict):
        return None
    message: Message = {"role": "assistant", "content": parsed.get("content") or ""}
    if parsed.get("reasoning_content"):
        message["reasoning_content"] = parsed["reasoning_content"]
    calls = []
    for call in parsed.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            return None
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError:
                return None
        if not isinstance(arguments, dict):
            return None
        calls.append({"type": "function", "function": {"name": function["name"], "arguments": arguments}})
    if calls:
        message["tool_calls"] = calls
    return message


def _strip_end_of_turn(text: str, tokenizer: Any) -> str:
    eos = getattr(tokenizer, "eos_token", None) if tokenizer is not None else None
    for marker in filter(None, (eos, "<|im_end|>", "<|endoftext|>")):
        if text.endswith(marker):
            return text[: -len(marker)]
    return text


def generation_prompt(tokenizer: Any) -> str:
    """The text the chat template adds for ``add_generation_prompt=True`` (e.g. ``"<|im_start|>assistant\\n"``)."""
    return _generation_prompt(tokenizer, tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else None)


@lru_cache(maxsize=32)
def _generation_prompt(tokenizer: Any, _template: str | None) -> str:
    probe = [{"role": "user", "content": "x"}]
    without = tokenizer.apply_chat_template(probe, tokenize=False)
    with_prompt = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
    return with_prompt[len(without) :] if with_prompt.startswith(without) else ""
