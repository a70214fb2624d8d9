"""OpenEnv 0.10 (``openenv``, not its frozen old name ``openenv-core``) on both sides of envkit's seam (issue 22,
items 5, 14, 15): a served ``score()`` that fails crosses the wire as a failure, ``serve-env`` keeps the oracle to
itself unless asked, and the matrix — envkit's server with OpenEnv's client and ``openenv validate --url``; OpenEnv's
server and envs (the echo env ``openenv init`` writes, which is not MCP; MCP envs that put the task in ``metadata``, as
finqa does) with envkit's consumer (``play``, ``validate``, ``eval``)."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import math
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("openenv", reason="openenv is not installed: pip install -e '.[openenv]'")

from importlib.metadata import PackageNotFoundError, version

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

import envkit
from envkit.adapters.openenv import STEP_TOOL, OpenEnvConnectionError, OpenEnvScoreError
from envkit.adapters.openenv.server import create_envkit_app, start_server
from envkit.backends import ScriptedBackend
from envkit.cli.app import build_parser
from envkit.cli.app import main as cli_main
from envkit.rollout import RolloutEngine, SamplingParams

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_the_installed_package_is_openenv_0_10_not_openenv_core():
    """Both names install the same ``openenv`` directory; envkit's extra installs the current one only."""
    assert version("openenv").startswith("0.10.")
    with pytest.raises(PackageNotFoundError):
        version("openenv-core")


# ---- envs of this module -----------------------------------------------------------------------------------------
class GraderDown(envkit.Env):
    """One text turn, then the grader: ``score()`` raises (``mode="raise"``) or returns NaN (``mode="nan"``)."""

    max_turns = 2

    def __init__(self, mode: str = "raise") -> None:
        super().__init__()
        self.mode = mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "Say anything."}], {}

    def step(self, action):
        return [], 0.0, True, False, {}

    def score(self) -> float:
        if not self.messages or len(self.messages) < 2:
            return 0.0
        if self.mode == "nan":
            return math.nan
        raise RuntimeError("grader unavailable")


class GraderDownTool(envkit.ToolEnv):
    """A tool env whose ``score()`` (which ``ToolEnv.step`` reads) raises once the agent has acted."""

    max_turns = 3

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "Answer."}], {}

    @envkit.tool
    def answer(self, text: str) -> str:
        """Give the answer.

        Args:
            text: The answer.
        """
        return "noted"

    def score(self) -> float:
        if len(self.messages) > 1:
            raise RuntimeError("grader unavailable")
        return 0.0


class FinqaLike(MCPEnvironment):
    """An OpenEnv 0.10 MCP env shaped as OpenEnv's finqa env: the reset observation is a bare ``Observation`` whose
    ``metadata`` carries the question; ``submit_answer`` ends the episode with the reward."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("finqa-like")

        @mcp.tool
        def submit_answer(answer: str) -> str:
            """Submit the final answer; this ends the episode."""
            self.answer = answer
            return "submitted"

        super().__init__(mcp)
        self.answer: str | None = None
        self._state = State(episode_id=None, step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self.answer = None
        self._state = State(episode_id=episode_id, step_count=0)
        question = f"What was ACME's revenue growth in fiscal year {2000 + (seed or 0) % 20}?"
        return Observation(done=False, reward=0.0, metadata={"question": question, "company": "ACME"})

    def _finish(self, observation, action):
        if isinstance(action, CallToolAction) and action.tool_name == "submit_answer":
            observation.done, observation.reward = True, 1.0 if str(action.arguments.get("answer")) == "7%" else 0.0
        return observation

    def step(self, action, timeout_s=None, **kwargs):
        return self._finish(super().step(action, timeout_s=timeout_s, **kwargs), action)

    async def step_async(self, action, timeout_s=None, **kwargs):
        return self._finish(await super().step_async(action, timeout_s=timeout_s, **kwargs), action)

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(done=False, reward=0.0, metadata={"error": "MCP actions only"})

    @property
    def state(self):
        return self._state


class Untyped(Environment):
    """A non-MCP OpenEnv env whose ``step`` names no action type: nothing to build a tool from."""

    def reset(self, seed=None, episode_id=None, **kwargs):
        return Observation(done=False, reward=0.0, metadata={"prompt": "hello"})

    def step(self, action, timeout_s=None, **kwargs):
        return Observation(done=True, reward=0.0, metadata={"seen": action.message})

    @property
    def state(self):
        return State()


class Move(Action):
    """Penalized's action: a move."""

    move: str


class Penalized(Environment):
    """A typed OpenEnv env with a step penalty: -0.1 for each move but ``goal``, which ends the episode with +1.0 (the
    final sum, e.g. 0.9, is in [0, 1]; the sum after the first wrong move is not)."""

    def reset(self, seed=None, episode_id=None, **kwargs):
        return Observation(done=False, reward=0.0, metadata={"prompt": "Reach the goal: move 'goal'."})

    def step(self, action: Move, timeout_s=None, **kwargs):
        done = action.move == "goal"
        return Observation(done=done, reward=1.0 if done else -0.1, metadata={"at": action.move})

    @property
    def state(self):
        return State()


def test_a_step_penalty_below_the_range_mid_episode_does_not_fail_an_episode_that_ends_in_it():
    """The sum of rewards after a penalized step is -0.1, below [0, 1]; the episode's final sum is 0.9. The step
    rewards ToolEnv reads after each step used to raise on the partial sum and fail every such episode."""
    env = envkit.make("openenv:test_openenv_010:Penalized")
    env.reset(seed=0)
    for move in ("left", "goal"):
        env.step(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": STEP_TOOL, "arguments": {"move": move}}}],
            }
        )
    env.end("done")
    assert env.done and env.score() == pytest.approx(0.9)
    env.close()


def calls_step(request) -> str:
    """A scripted policy that calls the non-MCP ``step`` tool once (``message="hello"``), then stops with text."""
    if "<tool_response>" in request.text:
        return "done<|im_end|>"
    return f"<tool_call>{json.dumps({'name': STEP_TOOL, 'arguments': {'message': 'hello'}})}</tool_call><|im_end|>"


@contextlib.contextmanager
def serving(app: Any):
    server = start_server(app)
    try:
        yield server.url
    finally:
        server.stop()


# ---- the echo env `openenv init` writes (OpenEnv 0.10 ships it as a template, not as an importable module) -----------
@pytest.fixture(scope="module")
def echo_env(tmp_path_factory):
    """``openenv init echo_env``: the generated package, importable as ``echo_env``."""
    where = tmp_path_factory.mktemp("openenv-init")
    done = subprocess.run(
        [sys.executable, "-m", "openenv.cli", "init", "echo_env", "--output-dir", str(where)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (where / "echo_env" / "server" / "app.py").is_file(), done.stdout + done.stderr
    sys.path.insert(0, str(where))
    try:
        environment = importlib.import_module("echo_env.server.echo_env_environment")
        yield environment, importlib.import_module("echo_env.models")
    finally:
        sys.path.remove(str(where))


@pytest.fixture(scope="module")
def echo_url(echo_env):
    """The generated echo env on OpenEnv's own ``create_app``, with 4 session slots."""
    environment, models = echo_env
    action, observation = models.EchoAction, models.EchoObservation
    app = create_app(environment.EchoEnvironment, action, observation, env_name="echo_env", max_concurrent_envs=4)
    with serving(app) as url:
        yield url


# ---- item 5: a served score() that fails ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["raise", "nan"])
def test_a_served_score_that_fails_fails_the_episode_as_in_process(mode, local_tokenizer):
    spec = "test_openenv_010:GraderDown"
    with serving(create_envkit_app(spec, {"mode": mode})) as url:
        with GenericEnvClient(base_url=url).sync() as client:  # on the wire: no score, and why
            client.reset(seed=0)
            observation = client.step({"type": "message", "message": "hi"}).observation
            assert observation["score"] is None
            assert ("grader unavailable" if mode == "raise" else "returned nan") in observation["score_error"]
        env = envkit.make(f"openenv:{url}")
        env.reset(seed=0)
        env.step("hi")
        with pytest.raises(OpenEnvScoreError, match="grader unavailable" if mode == "raise" else "returned nan"):
            env.score()
        env.close()
        says_hello = ScriptedBackend("hello<|im_end|>", tokenizer=local_tokenizer, logprob=-0.5)
        here, there = (
            RolloutEngine(factory, says_hello, local_tokenizer).run([0, 1], 1, SamplingParams())
            for factory in (lambda: envkit.make(spec, mode=mode), lambda: envkit.make(f"openenv:{url}"))
        )
    expected = "grader unavailable" if mode == "raise" else "returned nan"
    for episodes in (here, there):
        assert all(e.error and expected in e.error for e in episodes), [e.error for e in episodes]


def test_a_step_that_fails_on_the_server_is_a_failure_not_a_tool_result():
    """An env failure inside a turn (here ``score()``, read by ``ToolEnv.step``) is not the agent's ``Error:`` text."""
    with serving(create_envkit_app("test_openenv_010:GraderDownTool")) as url:
        with MCPToolClient(base_url=url).sync() as client:  # OpenEnv's own MCP client: the call fails
            client.reset(seed=0)
            with pytest.raises(Exception, match="grader unavailable"):
                client.call_tool("answer", text="42")
            client.reset(seed=0)  # a step loop: the failed turn ends the episode, with no reward, not 0 and go on
            result = client.step(CallToolAction(tool_name="answer", arguments={"text": "42"}))
            assert result.done is True and result.reward is None
            assert "grader unavailable" in str(result.observation.error)
        env = envkit.make(f"openenv:{url}")
        env.reset(seed=0)
        call = {"function": {"name": "answer", "arguments": {"text": "42"}}}
        with pytest.raises(RuntimeError, match="grader unavailable"):
            env.step({"role": "assistant", "content": "", "tool_calls": [call]})
        env.close()


# ---- item 14: the oracle stays on the server unless asked ----------------------------------------------------------
def test_serve_env_keeps_the_oracle_to_itself_unless_asked():
    assert build_parser().parse_args(["serve-env", "arithmetic"]).expose_oracle is False
    assert build_parser().parse_args(["serve-env", "arithmetic", "--expose-oracle"]).expose_oracle is True
    assert build_parser().parse_args(["serve-env", "arithmetic", "--no-oracle"]).expose_oracle is False
    local = envkit.make("arithmetic")
    local.reset(seed=3)
    for expose, expected in ((False, None), (True, local.oracle())):
        app = create_envkit_app("arithmetic", expose_oracle=expose) if expose else create_envkit_app("arithmetic")
        with serving(app) as url:
            with GenericEnvClient(base_url=url).sync() as client:  # what any OpenEnv client can read
                client.reset(seed=3)
                state = client.state()
                assert state["oracle"] == expected and state["envkit"]["has_oracle"] is expose
            env = envkit.make(f"openenv:{url}")
            env.reset(seed=3)
            assert env.oracle() == expected
            env.close()


# ---- item 15: envkit's server with OpenEnv's tools -----------------------------------------------------------------
def test_openenv_validate_url_passes_against_serve_env():
    with serving(create_envkit_app("hotel-booking")) as url:
        http = url.replace("ws://", "http://")
        done = subprocess.run(
            [sys.executable, "-m", "openenv.cli", "validate", "--url", http, "--json"],
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["passed"] and report["summary"]["passed_count"] == report["summary"]["total_count"] > 0


# ---- item 15: OpenEnv's server and envs with envkit's consumer -----------------------------------------------------
def test_an_mcp_env_that_puts_the_task_in_metadata_keeps_it():
    with serving(create_app(FinqaLike, CallToolAction, CallToolObservation, max_concurrent_envs=4)) as url:
        env = envkit.make(f"openenv:{url}")
        opening, _ = env.reset(seed=3)
        assert opening == [{"role": "user", "content": "What was ACME's revenue growth in fiscal year 2003?"}]
        call = {"function": {"name": "submit_answer", "arguments": {"answer": "7%"}}}
        messages, reward, terminated, _, _ = env.step({"role": "assistant", "content": "", "tool_calls": [call]})
        assert messages[0]["content"] == "submitted" and reward == 1.0 and terminated and env.score() == 1.0
        env.close()


def test_the_openenv_init_echo_env_is_one_typed_step_tool(echo_env, echo_url):
    for spec in (f"openenv:{echo_url}", "openenv:echo_env.server.echo_env_environment:EchoEnvironment"):
        env = envkit.make(spec)
        (tool,) = env.tools
        assert tool["function"]["name"] == STEP_TOOL
        assert tool["function"]["parameters"]["properties"]["message"]["type"] == "string"
        assert tool["function"]["parameters"]["required"] == ["message"]
        opening, _ = env.reset(seed=0)
        assert "Echo Env environment ready!" in opening[0]["content"]
        call = {"function": {"name": STEP_TOOL, "arguments": {"message": "hello"}}}
        messages, reward, terminated, _, info = env.step({"role": "assistant", "content": "", "tool_calls": [call]})
        assert json.loads(messages[0]["content"])["echoed_message"] == "hello" and reward == pytest.approx(0.5)
        assert info["tool_errors"] == 0 and not terminated and env.score() == pytest.approx(0.5)
        bad = {"function": {"name": STEP_TOOL, "arguments": {"text": "hello"}}}  # no "message": the model's mistake
        messages, _, _, _, info = env.step({"role": "assistant", "content": "", "tool_calls": [bad]})
        assert info["tool_errors"] == 1 and messages[0]["content"].startswith("Error: the env refused the action")
        messages, *_ = env.step({"role": "assistant", "content": "", "tool_calls": [call]})  # the session goes on
        assert json.loads(messages[0]["content"])["echoed_message"] == "hello"
        env.close()


def test_envkit_play_validate_and_eval_drive_the_echo_env(echo_url, tiny_model_dir, capsys):
    spec = f"openenv:{echo_url}"
    assert cli_main(["play", spec]) == 2  # no oracle: one line, no traceback
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "has no oracle()" in err and "\n" not in err and "Traceback" not in err
    # The echo env rewards 0.1 per character, so fuzzed long messages sum far past 1: without a declared
    # reward_range validate fails those episodes (naming the fix) instead of passing clipped scores.
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli_main(["validate", spec, "--episodes", "2", "--json", "--call-timeout", "600"])  # no hang here
    failed = [c for c in json.loads(out.getvalue())["checks"] if c["status"] == "FAIL"]
    assert failed and all("reward_range" in json.dumps(c) for c in failed), failed
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli_main(
            [
                "validate",
                spec,
                "--episodes",
                "2",
                "--json",
                "--call-timeout",
                "600",
                "--env-config",
                '{"reward_range": [0, 1e9]}',
            ]
        )
    checks = {c["id"]: c for c in json.loads(out.getvalue())["checks"]}
    assert not [c for c in checks.values() if c["status"] == "FAIL"], checks
    assert "1 valid tool schemas" in checks[10]["reason"]  # the step tool, not an env without tools
    assert checks[3]["status"] == "WARN"  # no oracle: said, not passed
    capsys.readouterr()
    argv = ["eval", spec, "--model", str(tiny_model_dir), "--tasks", "2", "--max-new-tokens", "8", "--max-turns", "2"]
    cli_main([*argv, "--json"])
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 2 and not summary.get("errors"), summary


def test_a_rollout_through_the_echo_env_scores_its_rewards(echo_url, local_tokenizer):
    engine = RolloutEngine(
        lambda: envkit.make(f"openenv:{echo_url}"),
        ScriptedBackend(calls_step, tokenizer=local_tokenizer, logprob=-0.5),
        local_tokenizer,
    )
    episodes = engine.run([0, 1], 2, SamplingParams())
    assert [e.error for e in episodes] == [None] * 4
    assert all(e.num_tool_calls == 1 and e.tool_errors == 0 and e.score == pytest.approx(0.5) for e in episodes)


def test_a_one_session_server_refuses_a_second_instance_in_one_line(echo_env):
    from echo_env.server.app import app  # the app exactly as `openenv init` writes it: max_concurrent_envs=1

    with serving(app) as url:
        first, second = envkit.make(f"openenv:{url}"), envkit.make(f"openenv:{url}")
        first.reset(seed=0)
        with pytest.raises(OpenEnvConnectionError) as error:
            second.reset(seed=0)
        message = str(error.value)
        assert "refused a session" in message and "CAPACITY_REACHED" in message and "\n" not in message
        assert "cannot reach" not in message
        first.close()


def test_a_non_mcp_env_without_an_action_type_is_refused_in_one_line(capsys):
    with pytest.raises(envkit.EnvSpecError, match="not an MCP env") as error:
        envkit.make("openenv:test_openenv_010:Untyped")
    assert "\n" not in str(error.value)
    assert cli_main(["play", "openenv:test_openenv_010:Untyped"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "not an MCP env" in err and "\n" not in err


def test_an_openenv_sum_of_rewards_outside_its_range_fails_instead_of_clipping(echo_env):
    # The echo env rewards 0.1 per character: three "hello"s sum to 1.5, which used to score 1.0 like any sum >= 1.
    spec = "openenv:echo_env.server.echo_env_environment:EchoEnvironment"
    call = {"function": {"name": STEP_TOOL, "arguments": {"message": "hello"}}}
    env = envkit.make(spec)
    env.reset(seed=0)
    for _ in range(3):
        env.step({"role": "assistant", "content": "", "tool_calls": [call]})
    assert env.score() == 1.0  # while the episode goes on: the sum so far, held inside the range
    env.end("max_turns")
    with pytest.raises(ValueError, match="reward_range") as error:  # the final score
        env.score()
    assert "1.5" in str(error.value)
    env.close()
    env = envkit.make(spec, reward_range=[0, 10])
    env.reset(seed=0)
    for _ in range(3):
        env.step({"role": "assistant", "content": "", "tool_calls": [call]})
    assert env.score() == pytest.approx(0.15)
    env.close()
    with pytest.raises(envkit.EnvSpecError, match="reward_range"):
        envkit.make(spec, reward_range=[1, 0])
