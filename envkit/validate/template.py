"""The chat template transcripts are rendered with (the bundled default or the model's), and how a transcript is
rendered and searched for the env's messages."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envkit.core.messages import Message, message_problems
from envkit.validate.driver import Run

BUNDLED_LABEL = "envkit bundled ChatML"
"""How reports name the bundled default template."""
_BUNDLED: list[Any] = []


def bundled_tokenizer() -> Any:
    """The default tokenizer of ``envkit validate``: envkit's bundled ChatML tool template
    (:func:`envkit.chat.bundled_template`) on a byte-level BPE tokenizer without merges, built in memory in
    milliseconds (one token per byte, plus the ChatML control tokens). It renders exactly like a real ChatML model's
    tokenizer; only token counts are byte counts. Cached; never read from disk beyond the packaged template."""
    if not _BUNDLED:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast

        from envkit.chat.render import bundled_template

        alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
        backend = Tokenizer(models.BPE(vocab={char: i for i, char in enumerate(alphabet)}, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            additional_special_tokens=["<|im_start|>"],
        )
        tokenizer.chat_template = bundled_template()
        _BUNDLED.append(tokenizer)
    return _BUNDLED[0]


@dataclass
class TemplateTokenizer:
    """The tokenizer transcripts are rendered with, and how reports name it."""

    tokenizer: Any
    label: str
    bundled: bool = False

    @classmethod
    def of(cls, tokenizer: Any = None) -> TemplateTokenizer:
        """``tokenizer`` (named after its folder), or the bundled default when it is ``None``."""
        if tokenizer is None:
            return cls(bundled_tokenizer(), BUNDLED_LABEL, bundled=True)
        source = str(getattr(tokenizer, "name_or_path", "") or "")
        return cls(tokenizer, Path(source).name or source or type(tokenizer).__name__)


def message_origins(run: Run, messages: list[Any]) -> list[tuple[int | None, bool]]:
    """Who wrote each message: ``(turn, True)`` for the env (turn 0 is reset), ``(turn, False)`` for the policy's
    action of that turn. When the transcript does not have the recorded shape, ``(None, role != "assistant")``."""
    origins: list[tuple[int | None, bool]] = []
    for turn, size in enumerate(run.observed):
        if size is None:
            break
        if turn:
            origins.append((turn, False))
        origins += [(turn, True)] * size
    if len(messages) == len(origins) + 1 and _role(messages[-1]) == "assistant":
        origins.append((len(run.observed), False))  # the last step() raised: its action is recorded, no reply
    if len(origins) == len(messages) and None not in run.observed:
        return origins
    return [(None, _role(m) != "assistant") for m in messages]


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, dict) else None


def as_generated(message: Any) -> Message:
    """A scripted action as training hands model output to the template: text plus well-formed calls only."""
    message = message if isinstance(message, dict) else {"content": message}
    content = message.get("content")
    calls = []
    raw = message.get("tool_calls")
    for call in raw if isinstance(raw, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                arguments = None
        arguments = arguments if isinstance(arguments, dict) else {}
        calls.append({"type": "function", "function": {"name": function["name"], "arguments": arguments}})
    generated: Message = {"role": "assistant", "content": content if isinstance(content, str) else ""}
    if calls:
        generated["tool_calls"] = calls
    return generated


def render_transcript(
    renderer: Any, messages: list[Message], origins: list[tuple[int | None, bool]], *, add_generation_prompt: bool
) -> tuple[str | None, int | None, str, int]:
    """``(text, None, "", n)`` or, when the template fails, ``(None, index of the message it fails on, error, n)``.

    An action of a scripted policy the template cannot render (Llama 3 refuses several calls in one turn) is
    rendered as its text instead (``n`` counts them): only the env's messages are under test.
    """
    shown = list(messages)
    replaced = 0
    while True:
        try:
            return renderer.render(shown, add_generation_prompt=add_generation_prompt), None, "", replaced
        except Exception as error:
            failure = f"{type(error).__name__}: {error}"
        culprit = _first_unrenderable(renderer, shown)
        if culprit < len(shown) and not origins[culprit][1] and shown[culprit].get("tool_calls"):
            shown[culprit] = {"role": "assistant", "content": shown[culprit].get("content") or ""}
            replaced += 1
            continue
        return None, culprit, failure, replaced


def _first_unrenderable(renderer: Any, messages: list[Message]) -> int:
    """The index of the message the template fails on: the one after the longest prefix that renders (only on the
    failure path; from the end, since some templates cannot render a prefix without a user message)."""
    for end in range(len(messages), 0, -1):
        try:
            renderer.render(messages[:end])
        except Exception:
            continue
        return end
    return 0


def render_failure(
    run: Run,
    messages: list[Message],
    origins: list[tuple[int | None, bool]],
    culprit: int | None,
    error: str,
    label: str,
) -> str:
    """The report line of a transcript the template cannot render: the message it fails on, named by its place."""
    if culprit is None or culprit >= len(messages):
        return f"[{run.policy}, seed {run.seed}]: the {label} template cannot render the transcript: {error}"
    message = messages[culprit]
    turn, from_env = origins[culprit]
    where = message_place(run, turn, message)
    if not from_env:
        previous = "an unknown turn" if turn is None else "the opening" if turn == 1 else f"turn {turn - 1}"
        where = f"the assistant turn after {previous} [{run.policy}, seed {run.seed}]"
        if turn is not None and turn - 1 in run.silent_turns:
            where += f" (turn {turn - 1} returned no messages)"
    malformed = message_problems(message) if from_env else []
    return f"{where}: the {label} template cannot render it ({error})" + (f"; {malformed[0]}" if malformed else "")


def message_place(run: Run, turn: int | None, message: Any) -> str:
    """A message named by its role, turn, policy and seed: ``the 'tool' message of turn 3 [oracle, seed 0]``."""
    role = message.get("role") if isinstance(message, dict) else type(message).__name__
    when = "the opening" if turn == 0 else "an unknown turn" if turn is None else f"turn {turn}"
    return f"the {role!r} message of {when} [{run.policy}, seed {run.seed}]"


def find_content(text: str, content: str, start: int) -> int | None:
    """Where ``content`` ends in ``text`` (searched from ``start``): verbatim, trimmed (Llama and Gemma trim), or
    JSON-encoded (Llama 3 renders tool results as JSON strings); ``None`` when it is not there."""
    for form in (content, content.strip(), json.dumps(content, ensure_ascii=False), json.dumps(content)):
        at = text.find(form, start)
        if at >= 0:
            return at + len(form)
    return None


def control_pattern(tokenizer: Any) -> re.Pattern[str] | None:
    """A pattern of the tokenizer's control-token strings (its special tokens: ``<|im_end|>``, ``<|eot_id|>``, …)."""
    specials = {
        t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", False)
    }
    specials.update(getattr(tokenizer, "all_special_tokens", None) or [])
    ordered = sorted((s for s in specials if isinstance(s, str) and s.strip()), key=lambda s: (-len(s), s))
    return re.compile("|".join(re.escape(s) for s in ordered)) if ordered else None
