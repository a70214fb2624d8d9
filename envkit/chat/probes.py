"""What a :class:`~envkit.chat.ChatRenderer` probes its template with, and what incremental rendering renders.

* :data:`PROBE` / :data:`TEXT_PROBE` (with :data:`PROBE_TOOLS`): the conversations that check a template is
  prefix-preserving and learn how it closes an assistant turn (with tool calls and results, or text only).
* :func:`local_context`: the bounded part of a history an incremental suffix is rendered from, and
  :func:`locality_probes`: the conversations that decide, once per template, whether that is exact.
* :func:`trl_training_templates`: TRL's prefix-preserving training templates, offered for a template that is not.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any

from envkit.core.messages import Message

PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "query"}}},
        },
    }
]

PROBE = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Find x."},
    {
        "role": "assistant",
        "content": "<think>\nI should look it up.\n</think>\n\nLooking.",
        "tool_calls": [{"type": "function", "function": {"name": "lookup", "arguments": {"q": "x"}}}],
    },
    {"role": "tool", "name": "lookup", "content": "x = 1"},
    {"role": "assistant", "content": "<think>\nDone.\n</think>\n\nx is 1."},
    {"role": "user", "content": "Thanks. And y?"},
    {"role": "assistant", "content": "y is 2."},
    {"role": "user", "content": "Bye."},
]

TEXT_PROBE = [
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Find x."},
    {"role": "assistant", "content": "<think>\nI should say it.\n</think>\n\nx is 1."},
    {"role": "user", "content": "Thanks. And y?"},
    {"role": "assistant", "content": "y is 2."},
    {"role": "user", "content": "Bye."},
]
"""The probe conversation for an env without tools (templates such as Gemma's cannot render tool messages)."""

THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
"""A ``<think>`` block and the blank space after it (what a template that switches thinking off never shows)."""

MIN_PROBE_STEPS = 12
"""A template passes the locality probe only when at least this many (step, generation prompt) pairs were compared."""


def local_context(history: list[Message]) -> list[Message]:
    """The opening messages (leading system messages and the first other one: Llama 3 puts the tools into the first
    user message), then the history from its last assistant message on; ``history`` itself when nothing is dropped.

    An even number of messages is dropped, so every kept message keeps the parity of its position (templates that
    check role alternation by ``loop.index0``).
    """
    head = 0
    while head < len(history) and history[head].get("role") == "system":
        head += 1
    head += 1
    start = len(history) - 1
    if (start - head) % 2:
        start -= 1
    if start <= head or history[-1].get("role") != "assistant":
        return history
    return [*history[:head], *history[start:]]


def locality_probes(tools: bool) -> list[tuple[list[Message], list[tuple[Message, list[Message]]]]]:
    """Probe conversations for :meth:`ChatRenderer._local_suffix_problem`: openings, then (assistant turn, the env's
    new messages) steps."""
    system = {"role": "system", "content": "You are helpful."}
    user = {"role": "user", "content": "Find x."}
    if tools:

        def calls(*queries: str) -> list[dict[str, Any]]:
            return [{"type": "function", "function": {"name": "lookup", "arguments": {"q": q}}} for q in queries]

        def result(text: str) -> Message:
            return {"role": "tool", "name": "lookup", "content": text}

        cycle = [
            ({"role": "assistant", "content": "", "tool_calls": calls("x")}, [result("x = 1")]),
            (
                {"role": "assistant", "content": "Two lookups.", "tool_calls": calls("y", "z")},
                [result("2"), result("3")],
            ),
            ({"role": "assistant", "content": "x is 1."}, [{"role": "user", "content": "And w?"}]),
            (
                {"role": "assistant", "content": "<think>\nLook up w.\n</think>\n\n", "tool_calls": calls("w")},
                [result("w = 4"), {"role": "user", "content": "Hurry."}],
            ),
            ({"role": "assistant", "content": "<think>\nDone.\n</think>\n\nw is 4."}, []),
            ({"role": "assistant", "content": "Still here."}, [{"role": "user", "content": "Next."}]),
        ]
    else:
        cycle = [
            (
                {"role": "assistant", "content": "<think>\nSay it.\n</think>\n\nx is 1."},
                [{"role": "user", "content": "Y?"}],
            ),
            ({"role": "assistant", "content": "y is 2."}, [{"role": "user", "content": "Z?"}]),
        ]
    steps = cycle * 5
    if not tools:  # last: after a turn with no new message, roles no longer alternate (Gemma refuses that)
        steps.append(({"role": "assistant", "content": "z is 3."}, []))
    return [([system, user], steps), ([user], steps)]


def trl_training_templates(tokenizer: Any, original: str) -> list[tuple[str, str]]:
    """TRL's prefix-preserving training templates, TRL's own pick for this template first, then the rest by
    textual similarity to ``original`` (a tokenizer may ship a slightly different revision of a known template)."""
    try:
        import trl.chat_template_utils as trl_templates
    except Exception:
        return []
    candidates = []
    try:
        exact = trl_templates.get_training_chat_template(tokenizer)
    except Exception:
        exact = None
    if exact:
        candidates.append(("TRL's training template for this model", exact))
    folder = Path(trl_templates.__file__).parent / "chat_templates"
    scored = []
    for path in folder.glob("*_training.jinja"):
        text = path.read_text(encoding="utf-8")
        base = folder / path.name.replace("_training", "")
        reference = base.read_text(encoding="utf-8") if base.is_file() else text
        scored.append((difflib.SequenceMatcher(None, original, reference).quick_ratio(), path.name, text))
    for _, name, text in sorted(scored, reverse=True):
        candidates.append((f"TRL's {name}", text))
    return candidates
