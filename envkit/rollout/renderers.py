"""Chat renderers shared by every engine of the process, and one run's opening prompts rendered once each.

A renderer is built once per (tokenizer, chat template, template variables, tool set) in this process, not once per
engine (``make_rollout_func`` builds an engine per trainer); the template probes themselves run once per tokenizer
and template whatever the tool set (see :class:`~envkit.chat.ChatRenderer`). The cache keeps the
:data:`_RENDERERS_MAX` most recently used renderers: envs whose tools vary by task must not keep every renderer
forever.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
from collections import OrderedDict
from typing import Any

from envkit.chat.render import ChatRenderer
from envkit.core.messages import Message

_RENDERERS: OrderedDict[str, ChatRenderer] = OrderedDict()
"""Renderers per (tokenizer, template, template variables, tools), least recently used first, at most
:data:`_RENDERERS_MAX`."""
_RENDERERS_MAX = 64
_RENDERER_LOCK = threading.Lock()
"""Held for the cache's dict operations only: a renderer is built outside it (see :func:`shared_renderer`)."""
_BUILDING: dict[str, concurrent.futures.Future[ChatRenderer]] = {}
"""Renderers being built now, by key: a second caller for the same key waits for the first one's renderer."""


def shared_renderer(
    tokenizer: Any,
    tools: list[dict[str, Any]] | None,
    *,
    chat_template: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> ChatRenderer:
    """The process's renderer for ``tools`` under ``tokenizer``'s (or ``chat_template``'s) template, built on first
    use. Building one tool set's renderer never holds up another's; two callers of the same key get the same
    renderer, or the same :class:`~envkit.chat.TemplateError`."""
    key = _key(tokenizer, tools, chat_template, template_kwargs)
    while True:
        with _RENDERER_LOCK:  # a dict lookup: building one tool set's renderer never holds up another's
            renderer = _RENDERERS.get(key)
            if renderer is not None and renderer.tokenizer is tokenizer:
                _RENDERERS.move_to_end(key)
                return renderer
            building = _BUILDING.get(key)
            mine = building is None
            if building is None:
                building = _BUILDING[key] = concurrent.futures.Future()
        if not mine:
            renderer = building.result()  # the same renderer, or the same TemplateError, as the first caller's
            if renderer.tokenizer is tokenizer:
                return renderer
            continue  # another tokenizer under a reused id: build our own
        try:
            renderer = ChatRenderer(tokenizer, tools, chat_template=chat_template, template_kwargs=template_kwargs)
        except BaseException as error:
            with _RENDERER_LOCK:
                _BUILDING.pop(key, None)
            building.set_exception(error)
            raise
        with _RENDERER_LOCK:
            _RENDERERS[key] = renderer
            _RENDERERS.move_to_end(key)
            while len(_RENDERERS) > _RENDERERS_MAX:
                _RENDERERS.popitem(last=False)
            _BUILDING.pop(key, None)
        building.set_result(renderer)
        return renderer


def built_renderer(
    tokenizer: Any,
    tools: list[dict[str, Any]] | None,
    *,
    chat_template: str | None = None,
    template_kwargs: dict[str, Any] | None = None,
) -> ChatRenderer | None:
    """The renderer :func:`shared_renderer` would return when it is already built, else ``None``: a dict lookup that
    never builds (so never probes a template), safe to call on an event loop."""
    key = _key(tokenizer, tools, chat_template, template_kwargs)
    with _RENDERER_LOCK:
        renderer = _RENDERERS.get(key)
        if renderer is None or renderer.tokenizer is not tokenizer:
            return None
        _RENDERERS.move_to_end(key)
        return renderer


def _key(
    tokenizer: Any,
    tools: list[dict[str, Any]] | None,
    chat_template: str | None,
    template_kwargs: dict[str, Any] | None,
) -> str:
    """The cache key of a renderer: the tokenizer object, the template, its variables and the tool set."""
    return json.dumps([id(tokenizer), chat_template, template_kwargs, tools], sort_keys=True, default=str)


class OpeningPrompts:
    """One run's opening prompts: each distinct (renderer, opening messages) is rendered once.

    A GRPO group's episodes reset with the same seed and open with the same messages, so only one of them renders
    (measured: 195 us per opening prompt, Qwen2.5 tokenizer, hotel tools); the others, opening at the same moment on
    other threads, wait for it and copy its ids. Openings that are not JSON data are rendered every time. Thread-safe;
    holds at most one entry per distinct opening, dropped with the run.
    """

    def __init__(self) -> None:
        self._prompts: dict[tuple[int, str], concurrent.futures.Future[tuple[ChatRenderer, list[int]]]] = {}

    def prompt_ids(self, renderer: ChatRenderer, opening: list[Message]) -> list[int]:
        """The opening prompt's token ids under ``renderer``: a list of the caller's own."""
        try:
            key = (id(renderer), json.dumps(opening))  # key order kept: templates see it
        except (TypeError, ValueError):
            return renderer.prompt_ids(list(opening))
        # The entry holds its renderer, so no other renderer can take its id while the entry lives.
        mine: concurrent.futures.Future[tuple[ChatRenderer, list[int]]] = concurrent.futures.Future()
        kept = self._prompts.setdefault(key, mine)
        if kept is mine:
            try:
                mine.set_result((renderer, renderer.prompt_ids(list(opening))))
            except BaseException as error:  # e.g. a TemplateError: every episode with this opening gets it
                mine.set_exception(error)
        return list(kept.result()[1])
