"""Token-exact chat rendering through the tokenizer's own chat template.

A trajectory is ``prompt_ids + turn_1 + env_1 + turn_2 + env_2 + …``: the opening prompt is the template's own
rendering (tools and generation prompt included), every ``turn_i`` is exactly the token ids the model generated
(never decoded and re-encoded), and every ``env_i`` is a *template suffix*: the template rendered with and without the
env's new messages, the difference tokenized. The model's turn ends at its end-of-turn token (``<|im_end|>`` for
ChatML); whatever the template writes after that token (``"\\n"``, the next ``<|im_start|>``, …) belongs to the suffix.

This needs a *prefix-preserving* template: appending messages must not change how earlier ones render. Qwen3's
template is not (it drops ``<think>`` blocks of earlier turns and renders the last assistant turn differently).
:class:`ChatRenderer` checks this once per template; for a template that fails it uses TRL's prefix-preserving
training variant (``trl.chat_template_utils.get_training_chat_template``, which covers Qwen3, Qwen3.5 and others) and
otherwise raises :class:`TemplateError` naming the fix: pass a prefix-preserving ``chat_template=``.
"""

from __future__ import annotations

import difflib
import logging
import re
from pathlib import Path
from typing import Any

from envkit.messages import Message

logger = logging.getLogger(__name__)


class TemplateError(ValueError):
    """The chat template cannot be used for token-exact multi-turn rendering."""


_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look something up.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string", "description": "query"}}},
        },
    }
]

_PROBE = [
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


_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


class ChatRenderer:
    """Render conversations to token ids so that prompt + model tokens + env suffixes equal the template's rendering.

    Args:
        tokenizer: A Hugging Face tokenizer with a chat template.
        tools: OpenAI-style tool schemas passed to the template (``ToolEnv.tools``), or ``None``.
        chat_template: A template to use instead of the tokenizer's own.
        end_of_turn: The token that ends an assistant turn; defaults to the tokenizer's ``eos_token``.
        template_kwargs: Extra variables for the template (e.g. ``{"enable_thinking": False}``).
    """

    def __init__(
        self,
        tokenizer: Any,
        tools: list[dict[str, Any]] | None = None,
        *,
        chat_template: str | None = None,
        end_of_turn: str | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.template_kwargs = dict(template_kwargs or {})
        self.end_of_turn = end_of_turn or tokenizer.eos_token
        if not self.end_of_turn:
            raise TemplateError("the tokenizer has no eos_token; pass end_of_turn= (the token that ends a turn)")
        self.end_of_turn_ids = tokenizer.encode(self.end_of_turn, add_special_tokens=False)
        self.chat_template = chat_template or _tokenizer_template(tokenizer)
        self.template_source = "chat_template argument" if chat_template else "tokenizer"
        """Where :attr:`chat_template` came from: the tokenizer, the argument, or a TRL training template."""
        problem = self.prefix_problem(self.chat_template)
        if problem and chat_template is None:
            replacement = self._training_template()
            if replacement is not None:
                logger.info("chat template is not prefix-preserving (%s); using %s", problem, replacement[0])
                self.template_source = replacement[0]
                self.chat_template, problem = replacement[1], None
        if problem:
            raise TemplateError(
                f"the chat template is not prefix-preserving: {problem}. Token-exact multi-turn rollouts need a "
                "template where appending messages never changes earlier ones. Fix: pass chat_template= a "
                "prefix-preserving variant (for Qwen3-style templates, trl.chat_template_utils."
                "get_training_chat_template(tokenizer) returns one)."
            )

    def render(self, messages: list[Message], *, add_generation_prompt: bool = False) -> str:
        """The template's text for ``messages`` (with this renderer's tools and template variables)."""
        return self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.template_kwargs,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text (special tokens in the text are parsed; none are added)."""
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """Token ids of the opening prompt: ``messages`` + tools + the generation prompt."""
        return self.encode(self.render(messages, add_generation_prompt=True))

    def suffix_text(
        self, history: list[Message], new_messages: list[Message], *, add_generation_prompt: bool = True
    ) -> str:
        """The text that follows the last assistant turn's end-of-turn token when ``new_messages`` are appended.

        ``history`` must end with the assistant message the model just produced. The result starts right after that
        turn's end-of-turn token and ends with the next generation prompt (when ``add_generation_prompt``).
        """
        before = self.render(history)
        after = self.render([*history, *new_messages], add_generation_prompt=add_generation_prompt)
        if not after.startswith(before):
            raise TemplateError(
                "appending env messages changed the rendering of earlier messages (the template is not "
                f"prefix-preserving for this conversation): ...{before[-200:]!r} became "
                f"...{after[len(before) - 200 : len(before)]!r}"
            )
        cut = before.rfind(self.end_of_turn)
        if cut < 0:
            raise TemplateError(
                f"the rendered assistant turn does not contain the end-of-turn token {self.end_of_turn!r}"
            )
        return before[cut + len(self.end_of_turn) :] + after[len(before) :]

    def suffix_ids(
        self, history: list[Message], new_messages: list[Message], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of :meth:`suffix_text`: the env tokens to append after the model's end-of-turn token."""
        return self.encode(self.suffix_text(history, new_messages, add_generation_prompt=add_generation_prompt))

    def turn_close_ids(self, generated: list[int]) -> list[int]:
        """Tokens to append when a turn stopped without its end-of-turn token (e.g. at ``max_new_tokens``)."""
        n = len(self.end_of_turn_ids)
        return [] if generated[-n:] == self.end_of_turn_ids else list(self.end_of_turn_ids)

    def _training_template(self) -> tuple[str, str] | None:
        """A prefix-preserving replacement that formats every message exactly as the original template does.

        A candidate must render the probe conversation identically up to the first point where the original stops
        being prefix-preserving, and render each later message (a user turn after an assistant turn) the same way.
        """

        def render(template: str, messages: list[Message]) -> str:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=_PROBE_TOOLS,
                chat_template=template,
                add_generation_prompt=messages[-1]["role"] != "assistant",
                tokenize=False,
                **self.template_kwargs,
            )

        try:
            expected = [render(self.chat_template, _PROBE[:end]) for end in range(2, len(_PROBE) + 1)]
        except Exception:
            return None
        for source, candidate in _trl_training_templates(self.tokenizer, self.chat_template):
            if self.prefix_problem(candidate):
                continue
            try:
                rendered = [render(candidate, _PROBE[:end]) for end in range(2, len(_PROBE) + 1)]
            except Exception:
                continue
            if (
                all(
                    got == want or (index > 0 and want.endswith(got[len(rendered[index - 1]) :]))
                    for index, (got, want) in enumerate(zip(rendered, expected, strict=True))
                )
                and rendered[:3] == expected[:3]
            ):
                return source, candidate
        return None

    def prefix_problem(self, template: str) -> str | None:
        """Why ``template`` is not prefix-preserving on a probe conversation, or ``None`` when it is."""
        probe = _PROBE
        try:
            opening = self.tokenizer.apply_chat_template(
                _PROBE[:2], chat_template=template, tokenize=False, add_generation_prompt=True, **self.template_kwargs
            )
        except Exception as error:
            return f"rendering failed ({type(error).__name__}: {error})"
        if opening.rstrip().endswith("</think>"):  # thinking switched off: the model writes no <think> block
            probe = [{**m, "content": _THINK_BLOCK.sub("", m["content"])} for m in _PROBE]
        previous = ""
        for end in range(2, len(probe) + 1):
            messages = probe[:end]
            try:
                text = self.tokenizer.apply_chat_template(
                    messages,
                    tools=_PROBE_TOOLS,
                    chat_template=template,
                    tokenize=False,
                    add_generation_prompt=messages[-1]["role"] != "assistant",
                    **self.template_kwargs,
                )
            except Exception as error:  # a template that cannot render the probe at all
                return f"rendering failed on a {messages[-1]['role']} message ({type(error).__name__}: {error})"
            if not text.startswith(previous):
                return f"appending a {messages[-1]['role']} message (message {end}) changed the earlier rendering"
            previous = text
        return None


def _tokenizer_template(tokenizer: Any) -> str:
    template = tokenizer.chat_template
    if isinstance(template, dict):  # several named templates: the tool-use one if there is one
        template = template.get("tool_use") or template.get("default") or next(iter(template.values()))
    if not template:
        raise TemplateError("the tokenizer has no chat template; pass chat_template=")
    return template


def _trl_training_templates(tokenizer: Any, original: str) -> list[tuple[str, str]]:
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


def bundled_template() -> str:
    """envkit's own ChatML tool-calling template (Hermes/Qwen ``<tool_call>`` format, prefix-preserving)."""
    from importlib.resources import files

    return (files("envkit") / "templates" / "chatml_tools.jinja").read_text(encoding="utf-8")
