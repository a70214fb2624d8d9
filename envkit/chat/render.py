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

The renderer learns the template, not the tokenizer: the token that closes an assistant turn is read off a rendered
probe conversation (``<|im_end|>`` for ChatML even when ``eos_token`` is ``<|endoftext|>``; ``<|eot_id|>`` for Llama 3;
``<end_of_turn>`` for Gemma). A template that cannot serve the env fails at construction with one line naming the fix:
no tool rendering for an env with tools, no control token to stop on, not prefix-preserving.

Suffixes are rendered *incrementally* where the template allows it: only a bounded local context (the opening
system/first messages, the last assistant turn and the new messages) is rendered, so a step costs the same at turn 200
as at turn 10. Whether that context yields exactly the full-history suffix is a property of the template, decided once
per (tokenizer, template, template variables) by a probe at several depths; a template that fails it renders the whole
history (:attr:`ChatRenderer.suffix_mode` ``"full"``, with :attr:`ChatRenderer.suffix_mode_reason`).

Env text is encoded as text: a control-token string (``<|im_end|>``, ``<|im_start|>``, …) inside an env or tool
message becomes ordinary text tokens, so env content can never forge a turn boundary.
"""

from __future__ import annotations

import datetime
import json
import logging
import re
import threading
from collections import OrderedDict
from typing import Any

from envkit.chat import probes
from envkit.chat.readback import readback_problem
from envkit.core.messages import Message

logger = logging.getLogger(__name__)


class TemplateError(ValueError):
    """The chat template cannot be used for token-exact multi-turn rendering."""


_PLACEHOLDER = "@@envkit-control-{}@@"
_PLACEHOLDER_SPLIT = re.compile(r"@@envkit-control-(\d+)@@")
_ENCODE_LOCK = threading.RLock()
"""Held by every encode of every :class:`ChatRenderer`: rendering runs on worker threads that share a tokenizer."""

_TEMPLATE_PROBES: OrderedDict[str, tuple[Any, dict[str, Any], threading.RLock]] = OrderedDict()
"""Results of the template probes per (tokenizer, template, template variables, tools or not), least recently used
first, each with its own lock (held while that key's probes run): renderers for other tool sets of the same template
reuse them instead of probing again, and renderers of other templates never wait for them."""
_TEMPLATE_PROBES_MAX = 32
_TEMPLATE_PROBES_LOCK = threading.Lock()
"""Held for the cache's dict operations only, never while a probe runs."""


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
        self.chat_template = chat_template or _tokenizer_template(tokenizer)
        if "date_string" in self.chat_template and "date_string" not in self.template_kwargs:
            # Llama 3 templates print today's date: fix it once, or a run crossing midnight changes earlier turns.
            self.template_kwargs["date_string"] = datetime.date.today().strftime("%d %b %Y")
        self.template_source = "chat_template argument" if chat_template else "tokenizer"
        """Where :attr:`chat_template` came from: the tokenizer, the argument, or a TRL training template."""
        self.control_token_ids: frozenset[int] = frozenset(
            int(i) for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items() if token.special
        )
        """Ids of the tokenizer's special (control) tokens; env text never encodes to them."""
        specials = sorted(
            (t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special), key=len
        )
        self._control_text = re.compile("|".join(re.escape(t) for t in reversed(specials))) if specials else None
        if self.tools:
            self._check_tool_rendering()
        # The probes below depend on the template, its variables and whether there are tools, not on the tool set.
        probe_key = json.dumps(
            [id(tokenizer), self.chat_template, self.template_kwargs, bool(self.tools), end_of_turn],
            sort_keys=True,
            default=str,
        )
        # Renderers of one key created at once (envs whose tools vary by task) probe once: the first runs the probes
        # under the key's own lock, the others wait for its results; other templates' renderers do not wait.
        probed, probing = _probed(tokenizer, probe_key)
        with probing:
            if "template" in probed:
                self.template_source, self.chat_template, problem = probed["template"]
            else:
                problem = self.prefix_problem(self.chat_template)
                if problem and chat_template is None:
                    replacement = self._training_template()
                    if replacement is not None:
                        logger.info("chat template is not prefix-preserving (%s); using %s", problem, replacement[0])
                        self.template_source = replacement[0]
                        self.chat_template, problem = replacement[1], None
                probed["template"] = (self.template_source, self.chat_template, problem)
        if problem:
            raise TemplateError(
                f"the chat template is not prefix-preserving: {problem}. Token-exact multi-turn rollouts need a "
                "template where appending messages never changes earlier ones. Fix: pass chat_template= a "
                "prefix-preserving variant (for Qwen3-style templates, trl.chat_template_utils."
                "get_training_chat_template(tokenizer) returns one)."
            )
        self.end_of_turn, self.turn_tail = self._learn_turn_end(end_of_turn)
        """The control token that closes an assistant turn, and the text the template writes after it."""
        self._split_cache: dict[str, list[int]] = {}
        self.end_of_turn_ids: list[int] = tokenizer.encode(self.end_of_turn, add_special_tokens=False)
        if len(self.end_of_turn_ids) != 1 or self.end_of_turn_ids[0] not in self.control_token_ids:
            raise TemplateError(
                f"the end-of-turn text {self.end_of_turn!r} is not one control token of this tokenizer, so generation "
                "cannot stop on it. Fix: pass end_of_turn= the special token that ends an assistant turn"
            )
        self.end_of_turn_id: int = self.end_of_turn_ids[0]
        if self.tools:
            with probing:
                if "readback" not in probed:
                    probed["readback"] = readback_problem(
                        tokenizer, self.chat_template, self.template_kwargs, self.end_of_turn
                    )
            if probed["readback"]:
                raise TemplateError(probed["readback"])
        with probing:
            if "suffix_mode" not in probed:
                reason = self._local_suffix_problem()
                probed["suffix_mode"] = ("full", reason) if reason else ("incremental", _INCREMENTAL_REASON)
        self.suffix_mode: str = probed["suffix_mode"][0]
        """How :meth:`suffix_text` renders: ``"incremental"`` (a bounded local context: the opening system/first
        messages, the last assistant turn and the new messages, so a step's cost does not grow with the history) or
        ``"full"`` (the whole history, twice). Decided once per template by a probe, like :attr:`template_source`."""
        self.suffix_mode_reason: str = probed["suffix_mode"][1]
        """Why :attr:`suffix_mode` is what it is (for ``"full"``: the first probe step where the local context's
        suffix differed from the full rendering's, or the render that failed)."""
        if self.suffix_mode == "full":
            logger.info("chat template suffixes are rendered from the full history: %s", self.suffix_mode_reason)

    def _learn_turn_end(self, given: str | None) -> tuple[str, str]:
        """The end-of-turn token and the text after it, read off the template's rendering of an assistant reply."""
        reply = "Probe reply 7."
        opening = [{"role": "user", "content": "Hello."}]
        try:
            prompt = self.render(opening, add_generation_prompt=True)
            full = self.render([*opening, {"role": "assistant", "content": reply}])
        except Exception as error:
            raise TemplateError(
                f"the chat template cannot render a user message and an assistant reply ({type(error).__name__}: "
                f"{error}). Fix: pass chat_template="
            ) from None
        start = full.find(reply, len(prompt)) if full.startswith(prompt) else -1
        if start < 0:
            raise TemplateError(
                "the chat template does not render an assistant reply after its own generation prompt. "
                "Fix: pass chat_template= a template whose generation prompt starts the assistant turn"
            )
        tail = full[start + len(reply) :]
        if given is not None:
            cut = tail.find(given)
            if cut < 0:
                raise TemplateError(f"end_of_turn={given!r} does not appear after an assistant reply: {tail!r}")
            return given, tail[cut + len(given) :]
        match = self._control_text.search(tail) if self._control_text is not None else None
        if match is None:
            raise TemplateError(
                f"the chat template ends an assistant turn with {tail!r}, which holds no control token to stop "
                "generation on. Fix: pass end_of_turn= (a special token) or a chat_template= that closes turns with one"
            )
        if tail[: match.start()].strip():
            raise TemplateError(
                f"the chat template writes {tail[: match.start()]!r} between an assistant reply and its end-of-turn "
                f"token {match.group()!r}; the model would have to generate it. Fix: pass chat_template="
            )
        return match.group(), tail[match.end() :]

    def _check_tool_rendering(self) -> None:
        """Refuse a template that would hide the env's tools, tool calls or tool results from the model."""
        assert self.tools is not None
        opening = [{"role": "user", "content": "Hello."}]
        names = [t.get("function", t).get("name", "") for t in self.tools]
        call = {"type": "function", "function": {"name": names[0], "arguments": {}}}
        fix = (
            "Fix: pass chat_template= a template that renders tools (envkit.chat.bundled_template() is a ChatML one "
            "in the Hermes <tool_call> format)"
        )
        try:
            with_tools = self.render(opening, add_generation_prompt=True)
            without = self.tokenizer.apply_chat_template(
                opening,
                chat_template=self.chat_template,
                add_generation_prompt=True,
                tokenize=False,
                **self.template_kwargs,
            )
        except Exception as error:
            problem = f"{type(error).__name__}: {error}"
            raise TemplateError(f"the chat template cannot render tools ({problem}). {fix}") from None
        if with_tools == without or not all(name in with_tools for name in names):
            raise TemplateError(
                f"the chat template does not render tool definitions (tools=): the model would never see this env's "
                f"tools {names}. {fix}"
            )
        problems = []
        for content in ("", None):  # templates differ on how a call-only assistant message carries its content
            conversation = [
                *opening,
                {"role": "assistant", "content": content, "tool_calls": [call]},
                {"role": "tool", "name": names[0], "content": "Probe result 9."},
            ]
            try:
                rendered = self.render(conversation, add_generation_prompt=True)
            except Exception as error:
                problems.append(f"{type(error).__name__}: {error}")
                continue
            if "Probe result 9." in rendered and names[0] in rendered[len(with_tools) :]:
                return
            problems.append("a tool call or a tool result is dropped")
        raise TemplateError(f"the chat template cannot render tool calls and tool results ({problems[0]}). {fix}")

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
        with _ENCODE_LOCK:  # see _as_text: no encode may overlap the split-special-tokens one
            return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """Token ids of the opening prompt: ``messages`` + tools + the generation prompt (env text encoded as text)."""
        masked, originals = self._mask_control_text(messages)
        return self._encode_masked(self.render(masked, add_generation_prompt=True), originals)

    def suffix_text(
        self, history: list[Message], new_messages: list[Message], *, add_generation_prompt: bool = True
    ) -> str:
        """The text that follows the last assistant turn's end-of-turn token when ``new_messages`` are appended.

        ``history`` must end with the assistant message the model just produced. The result starts right after that
        turn's end-of-turn token and ends with the next generation prompt (when ``add_generation_prompt``). With no
        ``new_messages`` it is what closes the turn and opens the next one (the generation prompt).
        """
        if self.suffix_mode == "incremental":
            history = probes.local_context(history)
        return self._suffix_text(history, new_messages, add_generation_prompt)

    def _suffix_text(self, history: list[Message], new_messages: list[Message], add_generation_prompt: bool) -> str:
        """:meth:`suffix_text` from exactly ``history`` (the template-suffix rule and its checks)."""
        before = self.render(history)
        after = self.render([*history, *new_messages], add_generation_prompt=add_generation_prompt)
        if not after.startswith(before):
            raise TemplateError(
                "appending env messages changed the rendering of earlier messages (the template is not "
                f"prefix-preserving for this conversation): ...{before[-200:]!r} became "
                f"...{after[len(before) - 200 : len(before)]!r}"
            )
        cut = before.rfind(self.end_of_turn)
        if cut < 0 or before[cut + len(self.end_of_turn) :] != self.turn_tail:
            # The cut must fall right after the last assistant message: anything else would splice the suffix into
            # the wrong place and the trajectory would no longer be the template's rendering.
            raise TemplateError(
                f"the rendered conversation does not end with the assistant turn's end-of-turn token "
                f"{self.end_of_turn!r} followed by {self.turn_tail!r}: ...{before[-120:]!r}"
            )
        return before[cut + len(self.end_of_turn) :] + after[len(before) :]

    def suffix_ids(
        self, history: list[Message], new_messages: list[Message], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of :meth:`suffix_text`: the env tokens to append after the model's end-of-turn token.

        Control-token strings inside ``new_messages`` are encoded as plain text, never as control tokens.
        """
        masked, originals = self._mask_control_text(new_messages)
        text = self.suffix_text(history, masked, add_generation_prompt=add_generation_prompt)
        return self._encode_masked(text, originals)

    def turn_close_ids(self, generated: list[int]) -> list[int]:
        """Tokens to append when a turn stopped without its end-of-turn token (e.g. at ``max_new_tokens``)."""
        n = len(self.end_of_turn_ids)
        return [] if generated[-n:] == self.end_of_turn_ids else list(self.end_of_turn_ids)

    def control_strings(self, text: str) -> list[str]:
        """The control-token strings (``<|im_end|>``, …) that occur in ``text``."""
        return [] if self._control_text is None else self._control_text.findall(text)

    def _mask_control_text(self, messages: list[Message]) -> tuple[list[Message], list[str]]:
        """Messages whose control-token strings are replaced by placeholders, and the replaced strings in order."""
        if self._control_text is None or not any(
            isinstance(m.get("content"), str) and self._control_text.search(m["content"]) for m in messages
        ):
            return messages, []
        originals: list[str] = []

        def placeholder(match: re.Match[str]) -> str:
            originals.append(match.group())
            return _PLACEHOLDER.format(len(originals) - 1)

        masked = [
            {**m, "content": self._control_text.sub(placeholder, m["content"])}
            if isinstance(m.get("content"), str)
            else m
            for m in messages
        ]
        return masked, originals

    def _encode_masked(self, text: str, originals: list[str]) -> list[int]:
        """Encode text whose env control strings are placeholders: those strings become plain text tokens."""
        if not originals:
            return self.encode(text)
        pieces = _PLACEHOLDER_SPLIT.split(text)
        if len(pieces) != 2 * len(originals) + 1:
            raise TemplateError(
                "env content holds control-token strings and the chat template transforms message content, so they "
                f"cannot be kept as text: {sorted(set(originals))}. Fix: remove them from the env's messages"
            )
        ids: list[int] = []
        for index, piece in enumerate(pieces):
            if index % 2 == 0:
                ids += self.encode(piece)
            else:
                ids += self._as_text(originals[int(piece)])
        return ids

    def _as_text(self, control: str) -> list[int]:
        """Token ids of a control-token string read as plain text, computed once per string.

        ``split_special_tokens=True`` flips a flag on the tokenizer's shared Rust object for the duration of the call
        (transformers 5.x), and encoding releases the GIL: two threads encoding at once would see each other's
        setting (measured: wrong tokens in both, silently). So it runs once per string, under a lock, never beside
        any other encode of a renderer (:data:`_ENCODE_LOCK`).
        """
        cached = self._split_cache.get(control)
        if cached is None:
            with _ENCODE_LOCK:
                cached = self.tokenizer.encode(control, add_special_tokens=False, split_special_tokens=True)
            self._split_cache[control] = cached
        return list(cached)

    def _local_suffix_problem(self) -> str | None:
        """Why suffixes rendered from the local context (:func:`~envkit.chat.probes.local_context`) may differ from the
        full history's, or ``None``.

        Walks probe conversations (with and without a system message; tool calls, several results, user messages, no
        new message) step by step to a depth of dozens of messages, and compares every step's local-context suffix,
        with and without the generation prompt, to the full rendering's.
        """
        thinking_off, compared = False, 0
        for opening, steps in probes.locality_probes(bool(self.tools)):
            if not thinking_off:
                try:
                    thinking_off = self.render(opening, add_generation_prompt=True).rstrip().endswith("</think>")
                except Exception as error:
                    return f"the probe conversation does not render ({type(error).__name__}: {error})"
            history = list(opening)
            for index, (said, new) in enumerate(steps):
                if thinking_off:
                    said = {**said, "content": probes.THINK_BLOCK.sub("", said["content"] or "")}
                history.append(said)
                try:
                    full = {prompt: self._suffix_text(history, new, prompt) for prompt in (True, False)}
                except Exception:  # a step this template cannot render at all (e.g. two calls in one turn for Llama)
                    history.pop()
                    continue
                local = probes.local_context(history)
                for prompt in (True, False) if local is not history else ():
                    try:
                        part = self._suffix_text(local, new, prompt)
                    except Exception as error:
                        return (
                            f"the local context (opening, last assistant turn, new messages) does not render at probe "
                            f"step {index + 1} ({type(error).__name__}: {error})"
                        )
                    if part != full[prompt]:
                        roles = "+".join(m["role"] for m in new) or "no message"
                        return (
                            f"the template renders position-dependent text: at probe step {index + 1} ({roles} after "
                            f"{len(history)} messages) the suffix from the local context differs from the full "
                            f"rendering's ({part[:80]!r} vs {full[prompt][:80]!r})"
                        )
                    compared += 1
                history += new
        if compared < probes.MIN_PROBE_STEPS:
            return (
                f"only {compared} probe steps render with this template (at least {probes.MIN_PROBE_STEPS} are needed)"
            )
        return None

    def _training_template(self) -> tuple[str, str] | None:
        """A prefix-preserving replacement that formats every message exactly as the original template does.

        A candidate must render the probe conversation identically up to the first point where the original stops
        being prefix-preserving, and render each later message (a user turn after an assistant turn) the same way.
        """

        probe, tools = self._probe()

        def render(template: str, messages: list[Message]) -> str:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=tools,
                chat_template=template,
                add_generation_prompt=messages[-1]["role"] != "assistant",
                tokenize=False,
                **self.template_kwargs,
            )

        try:
            expected = [render(self.chat_template, probe[:end]) for end in range(2, len(probe) + 1)]
        except Exception:
            return None
        first_change = next(
            (i for i in range(1, len(expected)) if not expected[i].startswith(expected[i - 1])), len(expected)
        )
        for source, candidate in probes.trl_training_templates(self.tokenizer, self.chat_template):
            if self.prefix_problem(candidate):
                continue
            try:
                rendered = [render(candidate, probe[:end]) for end in range(2, len(probe) + 1)]
            except Exception:
                continue
            if (
                all(
                    got == want or (index > 0 and want.endswith(got[len(rendered[index - 1]) :]))
                    for index, (got, want) in enumerate(zip(rendered, expected, strict=True))
                )
                and rendered[:first_change] == expected[:first_change]
            ):
                return source, candidate
        return None

    def _probe(self) -> tuple[list[Message], list[dict[str, Any]] | None]:
        """The probe conversation and tools: with tool calls and results for an env with tools, text-only otherwise."""
        return (probes.PROBE, probes.PROBE_TOOLS) if getattr(self, "tools", None) else (probes.TEXT_PROBE, None)

    def prefix_problem(self, template: str) -> str | None:
        """Why ``template`` is not prefix-preserving on a probe conversation, or ``None`` when it is."""
        probe, tools = self._probe()
        try:
            opening = self.tokenizer.apply_chat_template(
                probe[:2], chat_template=template, tokenize=False, add_generation_prompt=True, **self.template_kwargs
            )
        except Exception as error:
            return f"rendering failed ({type(error).__name__}: {error})"
        if opening.rstrip().endswith("</think>"):  # thinking switched off: the model writes no <think> block
            probe = [{**m, "content": probes.THINK_BLOCK.sub("", m["content"])} for m in probe]
        previous = ""
        for end in range(2, len(probe) + 1):
            messages = probe[:end]
            try:
                text = self.tokenizer.apply_chat_template(
                    messages,
                    tools=tools,
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


_INCREMENTAL_REASON = "the local-context suffix equals the full rendering's at every step of the probe conversations"


def _probed(tokenizer: Any, key: str) -> tuple[dict[str, Any], threading.RLock]:
    """The (shared, mutable) probe results for ``key`` and the lock to hold while filling them; the cache keeps the
    most recently used few. The cache's own lock is held for the lookup only."""
    with _TEMPLATE_PROBES_LOCK:
        entry = _TEMPLATE_PROBES.get(key)
        if entry is None or entry[0] is not tokenizer:  # an id reused by another tokenizer is another entry
            entry = _TEMPLATE_PROBES[key] = (tokenizer, {}, threading.RLock())
        _TEMPLATE_PROBES.move_to_end(key)
        while len(_TEMPLATE_PROBES) > _TEMPLATE_PROBES_MAX:
            _TEMPLATE_PROBES.popitem(last=False)
        return entry[1], entry[2]


def _tokenizer_template(tokenizer: Any) -> str:
    template = tokenizer.chat_template
    if isinstance(template, dict):  # several named templates: the tool-use one if there is one
        template = template.get("tool_use") or template.get("default") or next(iter(template.values()))
    if not template:
        raise TemplateError("the tokenizer has no chat template; pass chat_template=")
    return template


def bundled_template() -> str:
    """envkit's own ChatML tool-calling template (Hermes/Qwen ``<tool_call>`` format, prefix-preserving)."""
    from importlib.resources import files

    return (files("envkit.chat") / "templates" / "chatml_tools.jinja").read_text(encoding="utf-8")
