"""Renderers for many tool sets built at once (envs whose tools vary by task): building one never holds up another's
(the renderer cache's lock covers its dict operations only), and the template probes still run once per
(tokenizer, template) however many renderers of it are built concurrently."""

from __future__ import annotations

import threading
import uuid

from envkit.chat import ChatRenderer
from envkit.chat import render as chat
from envkit.rollout import engine as rollout_engine

WAIT_S = 20.0  # a generous bound on a blocked thread: the assertions are about order, never about speed


def tool(name: str) -> dict:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        },
    }


def engine(tokenizer, variant: str) -> rollout_engine.RolloutEngine:
    """An engine whose template variables are new to this process: its template has not been probed yet."""
    return rollout_engine.RolloutEngine(lambda: None, None, tokenizer, template_kwargs={"variant": variant})


def in_thread(function, *args) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def target() -> None:
        try:
            out["value"] = function(*args)
        except BaseException as error:  # handed to the test
            out["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def test_a_slow_renderer_build_does_not_block_another_tool_sets(monkeypatch, local_tokenizer):
    """Tool set A's renderer is held inside its build (a slow check); tool set B's renderer, of another template,
    is built and returned meanwhile. Before: the engine built renderers under one global lock, so B waited for A."""
    entered, release = threading.Event(), threading.Event()
    check = ChatRenderer._check_tool_rendering

    def slow_for_a(self) -> None:
        if self.tools[0]["function"]["name"] == "slow_tool":
            entered.set()
            release.wait(WAIT_S)
        check(self)

    monkeypatch.setattr(ChatRenderer, "_check_tool_rendering", slow_for_a)
    a, a_out = in_thread(engine(local_tokenizer, uuid.uuid4().hex).renderer_for, [tool("slow_tool")])
    try:
        assert entered.wait(WAIT_S)
        b, b_out = in_thread(engine(local_tokenizer, uuid.uuid4().hex).renderer_for, [tool("quick_tool")])
        b.join(WAIT_S)
        assert not b.is_alive(), "tool set B's renderer waited for tool set A's build"
        assert a.is_alive()  # A is still held: B did not wait for it
        assert "error" not in b_out, b_out
        assert "quick_tool" in b_out["value"].render([{"role": "user", "content": "Hi."}])
    finally:
        release.set()
        a.join(WAIT_S)
    assert "slow_tool" in a_out["value"].render([{"role": "user", "content": "Hi."}])


def test_concurrent_renderers_of_many_tool_sets_probe_the_template_once(monkeypatch, local_tokenizer):
    """Eight renderers of one new template, each with its own tool set, built at once on eight threads: the first
    to probe waits until all eight have looked up the probe cache, so without a per-template probe lock each would
    probe on its own. The template probes run once; every renderer has its own tools and the probed settings."""
    count = 8
    variant = uuid.uuid4().hex
    arrived, arrivals = threading.Condition(), [0]
    probes: list[str] = []
    probed, prefix_problem = chat._probed, ChatRenderer.prefix_problem
    local_problem = ChatRenderer._local_suffix_problem

    def counting_probed(*args):
        result = probed(*args)
        with arrived:
            arrivals[0] += 1
            arrived.notify_all()
        return result

    def first_waits(self, template):
        probes.append("prefix")
        if len(probes) == 1:
            with arrived:
                arrived.wait_for(lambda: arrivals[0] >= count, WAIT_S)
        return prefix_problem(self, template)

    def counting_local(self):
        probes.append("local")
        return local_problem(self)

    monkeypatch.setattr(chat, "_probed", counting_probed)
    monkeypatch.setattr(ChatRenderer, "prefix_problem", first_waits)
    monkeypatch.setattr(ChatRenderer, "_local_suffix_problem", counting_local)
    engines = [engine(local_tokenizer, variant) for _ in range(count)]
    threads = [in_thread(e.renderer_for, [tool(f"tool_{i}")]) for i, e in enumerate(engines)]
    for thread, _ in threads:
        thread.join(WAIT_S)
    outs = [out for _, out in threads]
    assert all("value" in out for out in outs), [out.get("error") for out in outs]
    assert probes == ["prefix", "local"], probes
    opening = [{"role": "user", "content": "Hi."}]
    for i, out in enumerate(outs):
        text = out["value"].render(opening)
        assert f"tool_{i}" in text and f"tool_{(i + 1) % count}" not in text
        assert out["value"].suffix_mode == outs[0]["value"].suffix_mode


def test_callers_of_one_tool_set_share_one_build(monkeypatch, local_tokenizer):
    """Callers asking at once for the renderer of one tool set get the same renderer, built once."""
    entered, release = threading.Event(), threading.Event()
    builds: list[int] = []
    check = ChatRenderer._check_tool_rendering

    def held(self) -> None:
        builds.append(1)
        entered.set()
        release.wait(WAIT_S)
        check(self)

    monkeypatch.setattr(ChatRenderer, "_check_tool_rendering", held)
    variant = uuid.uuid4().hex
    shared = engine(local_tokenizer, variant)
    first = in_thread(shared.renderer_for, [tool("same_tool")])
    assert entered.wait(WAIT_S)
    others = [in_thread(shared.renderer_for, [tool("same_tool")]) for _ in range(3)]
    release.set()
    for thread, _ in [first, *others]:
        thread.join(WAIT_S)
    renderers = {id(out["value"]) for _, out in [first, *others]}
    assert len(renderers) == 1 and builds == [1]
