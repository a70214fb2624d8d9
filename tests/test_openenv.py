"""OpenEnv: envkit envs served over OpenEnv's protocol (``envkit serve-env``) and OpenEnv envs consumed as envkit
envs (``openenv:ws://…``, ``openenv:module:Class``), against ``openenv`` 0.10's own client and server code."""

from __future__ import annotations

import contextlib
import io
import json
import pickle
import random
import re
import time

import pytest

pytest.importorskip("openenv", reason="openenv is not installed: pip install -e '.[openenv]'")

import httpx
import websockets
from fastmcp import FastMCP
from helpers import free_port, serve_env
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient
from websockets.sync.client import connect as ws_connect

import envkit
from envkit.adapters.openenv.server import create_envkit_app, start_server
from envkit.backends import ScriptedBackend
from envkit.cli.app import main as cli_main
from envkit.demos import oracle_episodes
from envkit.rollout import RolloutEngine, SamplingParams
from envkit.validate import FAIL, validate_env

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


# ---- a small OpenEnv env, written against openenv only ---------------------------------------------------------
class TaskObservation(Observation):
    prompt: str = ""


class SumToTarget(MCPEnvironment):
    """An OpenEnv MCP env: bring a running total to the target with ``add``, then ``submit``."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("sum-to-target")

        @mcp.tool
        def add(amount: int) -> int:
            """Add an amount to the running total and return the new total."""
            self.total += amount
            self.steps += 1
            return self.total

        @mcp.tool
        def submit() -> str:
            """Submit the running total as the answer; this ends the episode."""
            self.finished = True
            return "correct" if self.total == self.target else f"the total is {self.total}"

        super().__init__(mcp)
        self.target = self.total = self.steps = 0
        self.finished, self.credit, self.episode_id = False, 0.0, None

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.target = random.Random(seed).randint(5, 60)
        self.total = self.steps = 0
        self.finished, self.credit, self.episode_id = False, 0.0, episode_id
        return TaskObservation(prompt=f"Bring the total to {self.target} with add, then call submit.", reward=0.0)

    def _scored(self, observation):
        """Dense reward: the change in closeness to the target (1 when the total is the target)."""
        if isinstance(observation, CallToolObservation):
            credit = round(max(0.0, 1.0 - abs(self.total - self.target) / self.target), 3)
            observation.reward, self.credit = credit - self.credit, credit
            observation.done = self.finished
        return observation

    def step(self, action, timeout_s=None, **kwargs):
        return self._scored(super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action, timeout_s=None, **kwargs):
        return self._scored(await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(done=self.finished, reward=0.0)

    @property
    def state(self):
        return State(episode_id=self.episode_id, step_count=self.steps, total=self.total)


def solves_sum_to_target(request) -> str:
    """A scripted policy of fixed tool-call text: ``add(target)`` first, then ``submit()``."""
    if "<tool_response>" in request.text:
        call = {"name": "submit", "arguments": {}}
    else:
        call = {"name": "add", "arguments": {"amount": int(re.search(r"total to (\d+)", request.text).group(1))}}
    return f"<tool_call>{json.dumps(call)}</tool_call><|im_end|>"


# ---- servers: started once per module --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hotel_url():
    """``envkit serve-env hotel-booking --expose-oracle`` as a real subprocess (8 session slots: leaked sessions would
    show; the oracle exposed, to validate the served env through OpenEnv)."""
    with serve_env("hotel-booking", "--port", "0", "--max-sessions", "8", "--expose-oracle") as url:
        yield url


@pytest.fixture(scope="module")
def limited_url():
    """arithmetic served in this process: 1 session slot, 1 s session timeout, 64 KiB messages."""
    app = create_envkit_app(
        "arithmetic", max_sessions=1, session_timeout_s=1.0, max_message_bytes=64 * 1024, expose_oracle=True
    )
    server = start_server(app, max_message_bytes=64 * 1024)
    yield server.url
    server.stop()


@pytest.fixture(scope="module")
def openenv_url():
    """SumToTarget served by OpenEnv's own ``create_app``."""
    app = create_app(SumToTarget, CallToolAction, CallToolObservation, env_name="sum", max_concurrent_envs=8)
    server = start_server(app)
    yield server.url
    server.stop()


# ---- serve: OpenEnv's own clients against envkit serve-env --------------------------------------------------------
def test_openenv_mcp_client_runs_a_hotel_booking_episode(hotel_url):
    mirror = envkit.make("hotel-booking")  # the same env here, to script the actions and check every answer
    opening, _ = mirror.reset(seed=7, options={"tier": "hard", "kind": "hidden_confirm"})
    with GenericEnvClient(base_url=hotel_url).sync() as client:
        observation = client.reset(seed=7, options={"tier": "hard", "kind": "hidden_confirm"}).observation
        assert observation["messages"] == opening
    with MCPToolClient(base_url=hotel_url).sync() as client:
        client.reset(seed=7, options={"tier": "hard", "kind": "hidden_confirm"})
        names = [t.name for t in client.list_tools()]
        assert names == [t["function"]["name"] for t in mirror.tools] + ["respond"]
        rewards, done, text_turns = [], False, 0
        while not done:
            action = mirror.oracle()
            expected, reward, terminated, truncated, _ = mirror.step(action)
            if action.get("tool_calls"):  # one call per oracle turn: an MCP tool call
                (call,) = action["tool_calls"]
                result = client.step(
                    CallToolAction(tool_name=call["function"]["name"], arguments=call["function"]["arguments"])
                )
                assert result.observation.result["data"] == expected[0]["content"]
            else:  # a text turn: the respond tool, answered by the simulated guest
                text_turns += 1
                result = client.step(CallToolAction(tool_name="respond", arguments={"message": action["content"]}))
                reply = result.observation.result["data"]
                assert reply == ("\n\n".join(m["content"] for m in expected) or "(the conversation has ended)")
            assert result.reward == pytest.approx(reward) and result.done == (terminated or truncated)
            rewards.append(result.reward)
            done = result.done
        assert text_turns >= 2 and sum(rewards) == pytest.approx(1.0) and mirror.score() == 1.0
        client.reset(seed=8)  # tool errors are results the model reads, not exceptions
        assert client.call_tool("get_hotel_details", hotel_id="H-0").startswith("Error:")


def test_the_http_mcp_endpoint_lists_and_calls_the_tools(hotel_url):
    http = hotel_url.replace("ws://", "http://")
    listed = httpx.post(f"{http}/mcp", json={"jsonrpc": "2.0", "method": "tools/list", "params": {}, "id": 1}).json()
    assert "respond" in [t["name"] for t in listed["result"]["tools"]]
    schema = httpx.get(f"{http}/schema").json()["action"]
    assert schema["properties"]["type"]["default"] == "message"


# ---- serve: limits ---------------------------------------------------------------------------------------------------
def test_the_session_timeout_frees_a_half_open_session(limited_url):
    idle = ws_connect(f"{limited_url}/ws")  # holds the only slot, then never sends again (a client gone silent)
    try:
        last_sent = time.monotonic()  # the server hears from it no earlier than this
        idle.send(json.dumps({"type": "state"}))
        assert json.loads(idle.recv(timeout=10))["type"] == "state"
        with ws_connect(f"{limited_url}/ws") as second:  # OpenEnv refuses a session beyond the limit
            assert json.loads(second.recv(timeout=10))["data"]["code"] == "CAPACITY_REACHED"
        with pytest.raises(websockets.ConnectionClosed) as closed:  # the server closes the idle socket after 1 s
            idle.recv(timeout=60)  # a cap, not a bound: a loaded machine may close it late
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
        assert time.monotonic() - last_sent >= 1.0  # never before its 1 s of silence
        deadline = time.monotonic() + 10
        while True:  # the slot is free again (as soon as OpenEnv has destroyed the idle session)
            try:
                with GenericEnvClient(base_url=limited_url).sync() as client:
                    assert client.reset(seed=0).observation["messages"]
                break
            except (RuntimeError, websockets.ConnectionClosed):
                assert time.monotonic() < deadline, "the idle session's slot was never freed"
                time.sleep(0.1)
    finally:
        idle.close()


def test_oversized_messages_are_refused(limited_url):
    with ws_connect(f"{limited_url}/ws", max_size=None) as socket:
        socket.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
        assert json.loads(socket.recv(timeout=10))["type"] == "observation"
        socket.send(json.dumps({"type": "step", "data": {"type": "message", "message": "x" * 100_000}}))
        with pytest.raises(websockets.ConnectionClosed) as closed:
            socket.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    http = limited_url.replace("ws://", "http://")
    response = httpx.post(f"{http}/step", json={"action": {"type": "message", "message": "x" * 100_000}})
    assert response.status_code == 413
    with GenericEnvClient(base_url=limited_url).sync() as client:  # a normal session works after both
        client.reset(seed=1)
        assert client.step({"type": "message", "message": "x" * 1000}).done


def test_a_session_the_server_timed_out_is_restored_mid_episode(limited_url):
    env, local = envkit.make(f"openenv:{limited_url}"), envkit.make("arithmetic")
    assert env.reset(seed=2) == local.reset(seed=2)
    first = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "calculator", "arguments": {"expression": "6 * 7"}}}],
    }
    assert env.step(first) == local.step(first)
    session = env._session
    time.sleep(1.6)  # the server closes the idle session (1 s timeout)
    assert env.oracle() == local.oracle()  # a new session, reset with the seed, the turn replayed
    assert env._session is not session
    time.sleep(1.6)
    action = local.oracle()
    assert env.step(action) == local.step(action) and env.messages == local.messages
    env.close()


# ---- consume --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["server", "in-process"])
def test_an_openenv_env_is_an_envkit_env(where, openenv_url, local_tokenizer):
    spec = f"openenv:{openenv_url}" if where == "server" else "openenv:test_openenv:SumToTarget"
    env = envkit.make(spec)
    assert [t["function"]["name"] for t in env.tools] == ["add", "submit"]
    assert env.tools[0]["function"]["parameters"]["properties"]["amount"]["type"] == "integer"
    opening, _ = env.reset(seed=4)
    target = random.Random(4).randint(5, 60)
    assert opening == [{"role": "user", "content": f"Bring the total to {target} with add, then call submit."}]
    env.close()
    backend = ScriptedBackend(solves_sum_to_target, tokenizer=local_tokenizer, logprob=-0.5)
    episodes = RolloutEngine(lambda: envkit.make(spec), backend, local_tokenizer).run([0, 1, 2], 2, SamplingParams())
    assert [e.score for e in episodes] == [1.0] * 6, [e.error for e in episodes]
    assert all(e.num_tool_calls == 2 and e.tool_errors == 0 and e.rewards == [1.0, 0.0] for e in episodes)
    assert episodes[0].messages[2]["content"] == str(random.Random(0).randint(5, 60))  # add's result
    wrong = envkit.make(spec)
    wrong.reset(seed=0)
    *_, info = wrong.step({"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "nope"}}]})
    assert info["tool_errors"] == 1 and wrong.messages[-1]["content"].startswith("Error: unknown tool 'nope'")
    _, reward, terminated, _, _ = wrong.step("I give up.")  # other OpenEnv envs cannot answer text: the episode ends
    assert terminated and reward == 0.0 and wrong.score() == 0.0


def test_an_openenv_env_in_process_passes_validate():
    report = validate_env(lambda: envkit.make("openenv:test_openenv:SumToTarget"), target="sum", episodes=3)
    assert not [c for c in report.checks if c.status == FAIL], report.to_dict()


def test_hotel_booking_round_trip_oracle_and_validate(hotel_url, local_tokenizer):
    spec = f"openenv:{hotel_url}"
    env = envkit.make(spec)
    assert env.tools == envkit.make("hotel-booking").tools and env.max_turns == 14
    seeds = [0, 1, 2, 3]
    here = oracle_episodes(lambda: envkit.make("hotel-booking"), local_tokenizer, seeds)
    there = oracle_episodes(lambda: envkit.make(spec), local_tokenizer, seeds)
    assert [e.score for e in there] == [1.0] * 4
    assert [e.messages for e in there] == [e.messages for e in here]
    assert [e.completion_ids for e in there] == [e.completion_ids for e in here]
    # mid-episode copies and pickles rebuild by spec: a new session, the same state
    env.reset(seed=5)
    env.step(env.oracle())
    for clone in (pickle.loads(pickle.dumps(env)), __import__("copy").deepcopy(env)):
        assert clone.messages == env.messages and clone.oracle() == env.oracle()
        clone.close()
    env.close()
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(["validate", spec, "--episodes", "4", "--json", "--call-timeout", "600"])  # no hang here
    report = json.loads(out.getvalue())
    assert code == 0, [c for c in report["checks"] if c["status"] != "PASS"]
    assert next(c for c in report["checks"] if c["id"] == 3)["status"] == "PASS"  # the forwarded oracle reaches 1.0


# ---- errors ---------------------------------------------------------------------------------------------------------
def test_an_unreachable_server_is_one_line(capsys):
    url = f"ws://127.0.0.1:{free_port()}"
    with pytest.raises(envkit.EnvSpecError) as error:
        envkit.make(f"openenv:{url}")
    assert url in str(error.value) and "\n" not in str(error.value)
    assert cli_main(["validate", f"openenv:{url}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and url in err and "cannot reach" in err


def test_bad_consume_and_serve_input_is_one_line(capsys):
    with pytest.raises(envkit.EnvSpecError, match="no class 'Nope'"):
        envkit.make("openenv:test_openenv:Nope")
    with pytest.raises(envkit.EnvSpecError, match="no OpenEnv Environment subclass"):
        envkit.make("openenv:test_openenv:TaskObservation")
    for argv in (
        ["serve-env", "no-such-env"],
        ["serve-env", "hotel-booking", "--env-config", "{bad"],
        ["serve-env", "hotel-booking", "--env-config", '{"tier": "galactic"}'],
        ["serve-env", "hotel-booking", "--session-timeout", "0"],
    ):
        assert cli_main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("error:") and "\n" not in err, err
