"""What OpenEnv's own clients get from ``envkit serve-env``, and ``envkit validate`` on the served form of an env.

Through the real ``envkit serve-env`` (a subprocess, or its app in this process) and OpenEnv's own ``MCPToolClient``:
a tool argument called ``name`` cannot go through ``call_tool`` (the server warns at start, ``validate`` WARNs, and
``CallToolAction`` works); the client's ``state()`` and step results carry what the README says; a served env without
``--expose-oracle`` SKIPs the checks that need its oracle, naming why, instead of failing the group-signal check; and
with it, the env's canaries reach the consumer, so a planted reward hack is caught through the protocol.
"""

from __future__ import annotations

import contextlib
import json
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="openenv is not installed: pip install -e '.[openenv]'")

from helpers import serve_env
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient

import envkit
from envkit.adapters.openenv.server import create_envkit_app, start_server
from envkit.cli.app import main as cli_main

HERE = Path(__file__).resolve()
SPEC = f"{HERE}:NameGuess"
NAMES = ("Ada", "Grace", "Barbara", "Frances")
WITHHELD = "the served env exposes no oracle (serve-env --expose-oracle)"
START_S = 180.0  # how long serve-env may take to start on a loaded 2-core machine
CALL_TIMEOUT_S = 600.0  # validate's limit on one env call (default 30 s): this env never hangs


class NameGuess(envkit.ToolEnv):
    """Guess the hidden name among four with ``guess(name)``. Planted bug: the score credits a right guess made after
    wrong ones, so guessing every name scores 1.0 — the canary ``every name`` is that hack."""

    max_turns = 6

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.secret = NAMES[(seed or 0) % len(NAMES)]
        self.guesses: list[str] = []
        return [{"role": "user", "content": f"Guess the name, one of {', '.join(NAMES)}."}], {}

    @envkit.tool
    def guess(self, name: str) -> str:
        """Guess the name.

        Args:
            name: One of the four names.
        """
        self.guesses.append(name)
        if name == self.secret:
            self.end_episode()
            return "right"
        return "wrong"

    def score(self) -> float:
        return 1.0 if self.secret in self.guesses else 0.0  # the bug: it should be guesses[:1]

    def oracle(self):
        return _call(self.secret) if not self.guesses else None

    def canaries(self):
        return {"every name": [_call(n) for n in NAMES]}


def _call(name: str) -> dict:
    return _call_of("guess", {"name": name})


def _call_of(tool: str, arguments: dict) -> dict:
    call = {"type": "function", "function": {"name": tool, "arguments": arguments}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


class BrokenOracle(NameGuess):
    """:class:`NameGuess` whose oracle raises (a bug in the oracle, not a missing one)."""

    def oracle(self):
        raise ValueError("no secret yet")


@contextlib.contextmanager
def served(expose_oracle: bool, spec: str = SPEC):
    """:class:`NameGuess` (or ``spec``) served by ``envkit serve-env``'s app in this process (its envs in worker
    processes)."""
    app = create_envkit_app(spec, max_sessions=4, expose_oracle=expose_oracle)
    server = start_server(app)
    try:
        yield server.url
    finally:
        server.stop()


def validate(url: str, capsys) -> tuple[dict, str]:
    """``envkit validate openenv:URL --json``: the checks by id, and the summary line ``envkit validate`` prints."""
    # A call counts as hung only past CALL_TIMEOUT_S: on a loaded machine a served env's first calls can take 30 s.
    flags = ["--episodes", "2", "--call-timeout", str(CALL_TIMEOUT_S)]
    cli_main(["validate", f"openenv:{url}", *flags, "--json"])
    report = json.loads(capsys.readouterr().out)
    cli_main(["validate", f"openenv:{url}", *flags])
    text = capsys.readouterr().out
    return {c["id"]: c for c in report["checks"]} | {"not_run": report.get("not_run")}, text


def test_serve_env_warns_at_start_of_a_tool_argument_call_tool_cannot_pass():
    process = subprocess.Popen(
        [sys.executable, "-m", "envkit.cli", "serve-env", SPEC, "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        seen, deadline = [], time.monotonic() + START_S
        while not (seen and "ws://" in seen[-1]):
            assert time.monotonic() < deadline and process.poll() is None, f"serve-env did not start: {seen}"
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=1))
    finally:
        process.terminate()
        process.wait(timeout=30)
    warnings = [line for line in seen if line.startswith("warning:")]
    assert len(warnings) == 1, seen
    assert "'guess' has an argument 'name'" in warnings[0]
    assert "CallToolAction(tool_name='guess', arguments={'name': ...})" in warnings[0]


def test_openenv_call_tool_cannot_pass_name_and_call_tool_action_can():
    with served(expose_oracle=False) as url, MCPToolClient(base_url=url).sync() as client:
        client.reset(seed=1)
        with pytest.raises(TypeError, match="multiple values for argument 'name'"):
            client.call_tool("guess", name="Ada")
        result = client.step(CallToolAction(tool_name="guess", arguments={"name": "Ada"}))
        assert result.observation.result["data"] == "wrong" and result.done is False
        result = client.step(CallToolAction(tool_name="guess", arguments={"name": NAMES[1]}))
        assert result.observation.result["data"] == "right" and result.done is True


def test_what_openenvs_client_returns_is_what_the_docs_say():
    """docs/how-to/openenv.md: the client's ``state()`` is ``episode_id`` and ``step_count``; a step's result carries
    ``reward`` (the change in score: they add up to the score) and ``done``; ``score`` itself reaches envkit's consumer
    only."""
    readme = " ".join((HERE.parent.parent / "docs" / "how-to" / "openenv.md").read_text().split())
    claim = re.search(r"OpenEnv's `MCPToolClient` reads less of it: its `state\(\)` is (.*?), and a `step", readme)
    assert claim, "docs/how-to/openenv.md's sentence on what OpenEnv's client returns"
    state_fields = set(re.findall(r"`(\w+)`", claim.group(1)))
    result_claim = re.search(r"result carries `reward` \(.*?\), `done` and the observation's (.*?);", readme)
    observation_fields = set(re.findall(r"`(\w+)`", result_claim.group(1)))
    with served(expose_oracle=False) as url:
        with MCPToolClient(base_url=url).sync() as client:
            client.reset(seed=2)
            rewards = []
            for name in NAMES[:3]:
                result = client.step(CallToolAction(tool_name="guess", arguments={"name": name}))
                rewards.append(result.reward)
            state = client.state()
            assert set(state.model_dump()) == state_fields == {"episode_id", "step_count"}
            assert state.step_count == 3 and result.done is True
            fields = set(result.observation.model_dump()) - {"done", "reward", "metadata"}
            assert fields == observation_fields == {"tool_name", "result", "error"}
        env = envkit.make(f"openenv:{url}")
        env.reset(seed=2)
        for name in NAMES[:3]:
            env.step(_call(name))
        assert rewards == [0.0, 0.0, 1.0] and sum(rewards) == env.score() == 1.0
        env.close()


def test_validate_on_a_served_env_without_its_oracle_says_so_instead_of_blaming_the_score(capsys):
    with served(expose_oracle=False) as url:
        checks, text = validate(url, capsys)
    assert checks[11]["status"] == "SKIP" and WITHHELD in checks[11]["reason"], checks[11]
    for id_ in (3, 15, 17, 18, 19, 20, 21):
        assert checks[id_]["status"] == "SKIP" and WITHHELD in checks[id_]["reason"], checks[id_]
    assert checks["not_run"] == {WITHHELD: [3, 11, 15, 17, 18, 19, 20, 21]}
    assert f"checks 3, 11, 15, 17, 18, 19, 20, 21 not run: {WITHHELD}" in " ".join(text.split())
    assert checks[10]["status"] == "WARN" and "'guess' has an argument 'name'" in checks[10]["reason"]
    assert "make the score reflect task progress" not in text


def test_validate_catches_a_canary_through_the_served_env_with_its_oracle(capsys):
    with served(expose_oracle=True) as url:
        checks, _ = validate(url, capsys)
        env = envkit.make(f"openenv:{url}")
        env.reset(seed=0)
        canaries = env.canaries()
        env.close()
    assert checks[3]["status"] == "PASS", checks[3]
    assert checks[17]["status"] == "FAIL", checks[17]
    assert re.search(
        r"canary 'every name' scores 1\.000 on seed \d, above the no-op floor 0\.000", checks[17]["reason"]
    )
    assert checks["not_run"] == {}
    assert canaries == {"every name": [_call(n) for n in NAMES]}


def test_a_served_oracle_that_raises_raises_in_the_consumer_instead_of_being_no_oracle():
    """An exposed oracle() that raises on the server reaches the consumer as its error (the server's state carries
    ``oracle_error``): before, the server sent no oracle, and validate reported a missing oracle instead of the bug."""
    with served(expose_oracle=True, spec=f"{HERE}:BrokenOracle") as url:
        env = envkit.make(f"openenv:{url}")
        env.reset(seed=0)
        with pytest.raises(RuntimeError, match=r"oracle\(\) failed on the server: ValueError: no secret yet"):
            env.oracle()
        env.close()


def test_consumer_options_a_served_env_would_ignore_are_refused():
    """A served envkit env sends its own opening messages and score: a system_prompt or reward_range given to its
    consumer would do nothing, so they are refused in one line naming where they belong."""
    with served(expose_oracle=False) as url:
        for option in ({"system_prompt": "Be brief."}, {"reward_range": [0, 10]}):
            with pytest.raises(envkit.EnvSpecError, match=f"{next(iter(option))} would be ignored: this server is "):
                envkit.make(f"openenv:{url}", **option)


def test_the_readmes_call_tool_action_form_passes_hotel_bookings_name_argument():
    """hotel-booking's ``search_hotels`` has a ``name`` argument: its consumer forwards the server's warning, and the
    README's ``CallToolAction`` line passes it where ``call_tool`` raises."""
    with serve_env("hotel-booking", "--port", "0") as url:
        env = envkit.make(f"openenv:{url}")
        assert [w.split(",")[0] for w in env.client_warnings] == ["tool 'search_hotels' has an argument 'name'"]
        assert env.withheld == WITHHELD
        env.close()
        with MCPToolClient(base_url=url).sync() as client:
            client.reset(seed=3)
            with pytest.raises(TypeError, match="multiple values for argument 'name'"):
                client.call_tool("search_hotels", city="Lisbon", name="Alfama")
            action = CallToolAction(tool_name="search_hotels", arguments={"city": "Lisbon", "name": "Alfama"})
            result = client.step(action)
    local = envkit.make("hotel-booking")
    local.reset(seed=3)
    observation, *_ = local.step(_call_of("search_hotels", {"city": "Lisbon", "name": "Alfama"}))
    assert result.observation.result["data"] == observation[0]["content"]  # the name filter reached the tool
