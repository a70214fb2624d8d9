"""The template-probe cache is bounded like the renderer cache: a run whose renderers vary their template variables
(or a process that meets many templates) keeps only the most recently used probe results."""

from __future__ import annotations

from test_incremental_rendering import family_tokenizer

from envkit.chat import ChatRenderer
from envkit.chat import render as chat


def test_template_probe_cache_is_bounded_and_reused(monkeypatch):
    tokenizer = family_tokenizer("qwen2.5-instruct")
    monkeypatch.setattr(chat, "_TEMPLATE_PROBES_MAX", 2)
    monkeypatch.setattr(chat, "_TEMPLATE_PROBES", type(chat._TEMPLATE_PROBES)())
    for variant in range(4):
        ChatRenderer(tokenizer, template_kwargs={"cache_variant": variant})
        assert len(chat._TEMPLATE_PROBES) <= 2
    probed = []
    monkeypatch.setattr(ChatRenderer, "_local_suffix_problem", lambda self: probed.append(1))
    ChatRenderer(tokenizer, template_kwargs={"cache_variant": 3})  # the most recent: no probe again
    assert probed == []
    ChatRenderer(tokenizer, template_kwargs={"cache_variant": 0})  # evicted: probed again
    assert probed == [1]
