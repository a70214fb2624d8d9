"""Turn a model's raw output text into an assistant message with ``tool_calls``.

The tool-call format follows the chat template the text was generated under (the tokenizer's own, or
``chat_template=``), never the model's name — :func:`tool_call_format` reads it off the template text:

* ``"hermes"`` — ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, any number per turn, text
  around them, an optional leading ``<think>…</think>``: Qwen2/2.5/3, Hermes 2/3 and most ChatML tool templates (the
  default for a template without tool calls, or no tokenizer). When the tokenizer carries a ``response_template`` (set
  by the model's files, or by ``trl.chat_template_utils.add_response_schema`` for the templates TRL knows) transformers'
  ``tokenizer.parse_response`` parses it; where that fails, or its calls differ from :func:`parse_hermes`'s on
  ``<tool_call>`` blocks holding JSON, :func:`parse_hermes` decides (and reports what is malformed).
* ``"llama3_json"`` — Llama 3.1/3.2: the reply *is* one JSON object ``{"name": ..., "parameters": {...}}`` (optionally
  after ``<|python_tag|>``); the template renders one call per turn and drops the content of a call message. Parsed
  by :func:`parse_llama3` even when the tokenizer has a ``response_template``: measured with transformers 5.23 and
  TRL 1.16's ``llama3_template``, ``parse_response`` raises on a call without the trailing ``<|eot_id|>`` (the text
  :func:`parse_assistant` and the rollout engine pass it) or with whitespace before it, keeps ``<|python_tag|>`` as
  content, and treats a call missing its name as plain content instead of a malformed call.
* ``"deepseek_v3"`` — DeepSeek-V3's own tokens:
  ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```<｜tool▁call▁end｜>``,
  several calls joined by ``\\n``, closed by ``<｜tool▁calls▁end｜>``. Parsed by :func:`parse_deepseek_v3`.
  Its template renders a call message only when ``content`` is ``None``, joins ``arguments`` as a *string*, and never
  closes a one-call turn; and transformers' ``apply_chat_template`` drops ``None``-valued keys, after which that
  template raises. So the parsed message keeps the model's whole text as ``content`` (call tokens included) beside the
  parsed ``tool_calls``: the template's plain-reply branch then renders exactly the tokens the model generated.

Malformed tool calls never raise: the text stays in ``content`` and the message carries
``"malformed_tool_calls": [reason, ...]``, which :class:`envkit.ToolEnv` answers with an error tool message.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Any, Literal

from envkit.core.messages import Message

ToolCallFormat = Literal["hermes", "llama3_json", "deepseek_v3"]

_TOOL_CALL = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)

_END_OF_TURN = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>", "<｜end▁of▁sentence｜>", "<end_of_turn>")
"""End-of-turn tokens of the families we know: ChatML, Llama 3 (``<|eom_id|>`` after a built-in tool call), DeepSeek,
Gemma. One of them (or the tokenizer's ``eos_token``) ending the text is not part of the reply."""

_PYTHON_TAG = "<|python_tag|>"
_LLAMA_CALL = re.compile(r'\{\s*"(?:name|parameters)"\s*:')

_DS_CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
_DS_CALLS_END = "<｜tool▁calls▁end｜>"
_DS_CALL_BEGIN = "<｜tool▁call▁begin｜>"
_DS_CALL_END = "<｜tool▁call▁end｜>"
_DS_SEP = "<｜tool▁sep｜>"
# A call runs to its end token; an unclosed one stops at the next call or the end of the section (or text).
_DS_CALL = re.compile(
    rf"{re.escape(_DS_CALL_BEGIN)}(.*?)"
    rf"({re.escape(_DS_CALL_END)}|(?={re.escape(_DS_CALL_BEGIN)}|{re.escape(_DS_CALLS_END)})|\Z)",
    re.DOTALL,
)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL)


def parse_assistant(
    text: str, tokenizer: Any = None, *, prefix: str | None = None, chat_template: str | None = None
) -> Message:
    """Parse the model's raw text into ``{"role": "assistant", "content": str, "tool_calls": [...]}``.

    Args:
        text: The generated text of one assistant turn (special tokens may be included; a trailing end-of-turn token
            is removed).
        tokenizer: The model's tokenizer; its chat template selects the tool-call format (see the module docstring).
            With ``None``, the Hermes/Qwen ``<tool_call>`` format.
        prefix: The prompt text before generation, for ``parse_response``. Defaults to the template's generation
            prompt (e.g. ``"<|im_start|>assistant\\n"``).
        chat_template: The template the text was generated under when it is not the tokenizer's own (e.g. the one
            given to ``ChatRenderer(chat_template=...)``).

    Returns:
        An assistant message. ``tool_calls`` is present only when the text has well-formed calls;
        ``malformed_tool_calls`` lists why a call could not be parsed.
    """
    text = _strip_end_of_turn(text, tokenizer)
    format_ = tool_call_format(tokenizer, chat_template)
    if format_ == "llama3_json":
        return parse_llama3(text)
    if format_ == "deepseek_v3":
        return parse_deepseek_v3(text)
    if tokenizer is not None and getattr(tokenizer, "response_template", None) is not None:
        message = _parse_with_transformers(text, tokenizer, prefix)
        if message is not None:
            return _hermes_json_checked(text, message)
    return parse_hermes(text)


def _hermes_json_checked(text: str, message: Message) -> Message:
    """transformers' parse of ``text`` unless its ``<tool_call>`` blocks hold JSON (the Hermes format, which
    :func:`parse_hermes` reads exactly) and the two disagree: then :func:`parse_hermes`'s. A response template reads
    only the ``arguments`` key (a call written with ``parameters`` ran with no arguments) and takes an unclosed
    ``<tool_call>`` as a call; a model's call must not mean one thing with a response template and another without."""
    bodies = [match.group(1).strip() for match in _TOOL_CALL.finditer(text)]
    if not bodies or not all(body.startswith("{") for body in bodies):
        return message
    own = parse_hermes(text)
    if own.get("malformed_tool_calls") or own.get("tool_calls") != message.get("tool_calls"):
        return own
    return message


def tool_call_format(tokenizer: Any = None, chat_template: str | None = None) -> ToolCallFormat:
    """The tool-call format of ``chat_template`` (default: the tokenizer's template), read off the template text.

    ``"deepseek_v3"`` when it renders DeepSeek's ``<｜tool▁call▁begin｜>`` tokens, ``"hermes"`` for ``<tool_call>``
    blocks, ``"llama3_json"`` for Llama 3's bare ``{"name": ..., "parameters": ...}``; ``"hermes"`` otherwise.
    """
    if chat_template is None and tokenizer is not None:
        chat_template = _template_text(getattr(tokenizer, "chat_template", None))
    return _format_of(chat_template or "")


@lru_cache(maxsize=64)
def _format_of(template: str) -> ToolCallFormat:
    if _DS_CALL_BEGIN in template:
        return "deepseek_v3"
    if "<tool_call>" in template:
        return "hermes"
    # Llama 3.1/3.2 render a call with '{"name": "' + name + '", ' then '"parameters": ' + arguments|tojson.
    if '{"name": "' in template and '"parameters": ' in template:
        return "llama3_json"
    return "hermes"


def _template_text(template: Any) -> str | None:
    if isinstance(template, dict):  # named templates: the tool-use one renders the calls
        template = template.get("tool_use") or template.get("default")
    return template if isinstance(template, str) else None


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


def parse_llama3(text: str) -> Message:
    """The parser for Llama 3.1/3.2's JSON tool calls: ``{"name": ..., "parameters": {...}}`` as the whole reply.

    A leading ``<|python_tag|>`` is allowed, and so is text before the object (kept as ``content``, which the template
    does not render for a call). A reply that starts like a call (``{"name"`` or ``{"parameters"``) but is not valid
    JSON, lacks the name, holds several calls (``;``- or ``,``-separated, or a list: the template renders one per
    turn) or goes on after the call is malformed, and so is a reply that is JSON holding a call inside it (OpenAI's
    ``{"type": "function", "function": {...}}``): an attempted call is never read as the final answer. Any other
    reply, including a JSON answer without ``"parameters"`` and prose quoting a call, is plain content.
    """
    stripped = text.strip()
    body = stripped[len(_PYTHON_TAG) :].lstrip() if stripped.startswith(_PYTHON_TAG) else stripped
    start = _LLAMA_CALL.search(body)
    if start is None:
        return {"role": "assistant", "content": stripped}
    before, raw = body[: start.start()].strip(), body[start.start() :]
    shown = _shown(raw)
    try:
        data, end = json.JSONDecoder().raw_decode(raw)
    except json.JSONDecodeError as error:
        if before:  # prose that happens to contain '{"name": …': not an attempted call
            return {"role": "assistant", "content": stripped}
        if error.pos >= len(raw.rstrip()):
            return _malformed(stripped, f"the tool call's JSON is not closed (the reply ends inside it): {shown}")
        return _malformed(stripped, f"invalid JSON ({error.msg} at position {error.pos}): {shown}")
    rest = raw[end:].strip()
    if not isinstance(data, dict) or not ("parameters" in data or "arguments" in data):
        return {"role": "assistant", "content": stripped}
    if rest.startswith((";", "{", ",")) or body.startswith("["):
        return _malformed(stripped, f"several tool calls in one reply; this chat template takes one per turn: {shown}")
    if before.startswith("{"):  # the reply is JSON with the call inside it (an OpenAI-style {"type", "function"})
        expected = 'expected the reply to be {"name": ..., "parameters": {...}}'
        return _malformed(stripped, f"{expected}, got: {_shown(body)}")
    if rest and not before:  # the reply opens with the call: an attempted call, which the template renders alone
        return _malformed(stripped, f"text after the tool call; the chat template renders a call alone: {_shown(rest)}")
    if rest:  # a call-shaped object inside prose: the template could not have rendered it as a call
        return {"role": "assistant", "content": stripped}
    if not isinstance(data.get("name"), str):
        return _malformed(stripped, f'missing "name": expected {{"name": ..., "parameters": {{...}}}}, got: {shown}')
    arguments, problem = _arguments_object(data.get("parameters", data.get("arguments")), shown)
    if arguments is None:
        return _malformed(stripped, problem)
    return {
        "role": "assistant",
        "content": before,
        "tool_calls": [{"type": "function", "function": {"name": data["name"], "arguments": arguments}}],
    }


def parse_deepseek_v3(text: str) -> Message:
    """The parser for DeepSeek-V3's tool-call tokens (see the module docstring for the exact format).

    ``content`` is always the text itself, call tokens included: that is what the DeepSeek-V3 template renders back
    identically (it cannot render a call message through ``apply_chat_template``). Each ``<｜tool▁call▁begin｜>``
    block must be closed by ``<｜tool▁call▁end｜>``, name its function after ``<｜tool▁sep｜>`` and hold a JSON object
    (fenced as a json code block, as the template writes it); ``<｜tool▁calls▁end｜>`` may be missing, as the template
    omits it after a single call.
    """
    message: Message = {"role": "assistant", "content": text}
    calls, malformed = [], []
    for match in _DS_CALL.finditer(text):
        call, problem = _parse_deepseek_call(match.group(1), closed=bool(match.group(2)))
        if call is not None:
            calls.append(call)
        else:
            malformed.append(problem)
    if not calls and not malformed and _DS_CALLS_BEGIN in text:
        malformed.append(f"{_DS_CALLS_BEGIN} holds no {_DS_CALL_BEGIN}…{_DS_CALL_END} call: {_shown(text)}")
    if calls:
        message["tool_calls"] = calls
    if malformed:
        message["malformed_tool_calls"] = malformed
    return message


def _parse_deepseek_call(raw: str, closed: bool) -> tuple[dict[str, Any] | None, str]:
    shown = _shown(raw)
    if not closed:
        return None, f"{_DS_CALL_BEGIN} is not closed with {_DS_CALL_END}: {shown}"
    _type, sep, rest = raw.partition(_DS_SEP)
    if not sep:
        return None, f"expected function{_DS_SEP}NAME and the JSON arguments, got: {shown}"
    name, _, arguments_text = rest.partition("\n")
    if not name.strip():
        return None, f"missing function name after {_DS_SEP}: {shown}"
    fenced = _FENCE.fullmatch(arguments_text.strip())
    arguments_text = (fenced.group(1) if fenced else arguments_text).strip()
    try:
        arguments = json.loads(arguments_text) if arguments_text else {}
    except json.JSONDecodeError as error:
        return None, f"invalid JSON ({error.msg} at position {error.pos}): {shown}"
    arguments, problem = _arguments_object(arguments, shown)
    if arguments is None:
        return None, problem
    return {"type": "function", "function": {"name": name.strip(), "arguments": arguments}}, ""


def _parse_call_json(raw: str, closed: bool) -> tuple[dict[str, Any] | None, str]:
    snippet = raw.strip()
    shown = _shown(snippet)
    if not closed:
        return None, f"<tool_call> is not closed with </tool_call>: {shown}"
    try:
        data = json.loads(snippet)
    except json.JSONDecodeError as error:
        return None, f"invalid JSON ({error.msg} at position {error.pos}): {shown}"
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None, f'expected {{"name": ..., "arguments": {{...}}}}, got: {shown}'
    arguments, problem = _arguments_object(data.get("arguments", data.get("parameters", {})), shown)
    if arguments is None:
        return None, problem
    return {"type": "function", "function": {"name": data["name"], "arguments": arguments}}, ""


def _arguments_object(arguments: Any, shown: str) -> tuple[dict[str, Any] | None, str]:
    """The arguments as a dict (a JSON string holding an object is decoded), or ``None`` and why not."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return None, f"arguments are a string that is not JSON: {shown}"
    if not isinstance(arguments, dict):
        return None, f"arguments must be an object, got {type(arguments).__name__}: {shown}"
    return arguments, ""


def _malformed(text: str, problem: str) -> Message:
    return {"role": "assistant", "content": text, "malformed_tool_calls": [problem]}


def _shown(snippet: str) -> str:
    snippet = snippet.strip()
    return snippet if len(snippet) <= 200 else snippet[:200] + "…"


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
    for marker in filter(None, (eos, *_END_OF_TURN)):
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
