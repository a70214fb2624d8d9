"""``envkit serve-env`` contains what a served env's calls cost (:mod:`envkit.serving.hosted`): envs live in worker
processes, every call has a deadline (``--step-timeout``) and the workers run under kernel limits (``--cpu-limit``,
``--memory-limit``). Through the real server (``envkit serve-env`` as a subprocess) and OpenEnv's own clients: one
session stuck in a pure-Python loop and one stuck in a C call that holds the GIL (``9**9**9``, as
``calculate("9**9**9")`` was in τ²-bench) both fail at their deadline, their workers go, and meanwhile another
session, a new handshake and ``/health`` keep answering."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="openenv is not installed: pip install -e '.[openenv]'")

from helpers import alive, serve_env
from openenv.core.generic_client import GenericEnvClient
from openenv.core.mcp_client import MCPToolClient

from envkit.util.children import ResourceLimits
from envkit.workers import EnvFactory, EnvWorkerLost
from envkit.workers.processes import ProcessWorkers

HERE = Path(__file__).resolve()
SPEC = f"{HERE.parent / 'worker_envs.py'}:Spinner"  # light to load: the CPU limit test counts its load
STEP_TIMEOUT_S = 10.0
LIVENESS_S = 120.0  # how long a test waits for what must happen: generous on a loaded 2-core machine


def wait_for(condition, what: str, limit_s: float = LIVENESS_S) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {limit_s:g}s"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``envkit serve-env`` of :class:`Spinner`: 4 worker processes (each session on one of its own), a 10 s deadline,
    the default limits."""
    spin_dir = tmp_path_factory.mktemp("spin")
    before = os.environ.get("SPIN_DIR")
    os.environ["SPIN_DIR"] = str(spin_dir)
    try:
        argv = [SPEC, "--port", "0", "--step-timeout", str(STEP_TIMEOUT_S), "--env-processes", "4"]
        with serve_env(*argv) as url:
            yield url, spin_dir
    finally:
        if before is None:
            os.environ.pop("SPIN_DIR", None)
        else:
            os.environ["SPIN_DIR"] = before


def in_thread(function, *args, **kwargs):
    """Run ``function(*args, **kwargs)`` on a thread; the thread and a dict that gets ``result`` or ``error``."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = function(*args, **kwargs)
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_stuck_calls_fail_their_sessions_at_the_deadline_and_nothing_else_waits(served):
    url, spin_dir = served
    with contextlib.ExitStack() as stack:
        stuck_in_python = stack.enter_context(GenericEnvClient(base_url=url, message_timeout_s=LIVENESS_S).sync())
        stuck_in_c = stack.enter_context(MCPToolClient(base_url=url, message_timeout_s=LIVENESS_S).sync())
        other = stack.enter_context(MCPToolClient(base_url=url, message_timeout_s=LIVENESS_S).sync())
        for client in (stuck_in_python, stuck_in_c, other):
            client.reset(seed=0)
        check_stuck_sessions(url, spin_dir, stuck_in_python, stuck_in_c, other)


def check_stuck_sessions(url, spin_dir, stuck_in_python, stuck_in_c, other) -> None:
    import httpx

    spin_python = {"type": "function", "function": {"name": "spin", "arguments": {"kind": "python"}}}
    python_turn = {"type": "message", "message": {"role": "assistant", "content": "", "tool_calls": [spin_python]}}
    threads = [
        in_thread(stuck_in_python.step, python_turn),  # a whole envkit turn (no OpenEnv tool-call limit)
        in_thread(stuck_in_c.call_tool, "spin", kind="c"),  # an MCP tool call
    ]
    wait_for(lambda: (spin_dir / "python").exists() and (spin_dir / "c").exists(), "both spins starting")
    spinning = [int((spin_dir / kind).read_text()) for kind in ("python", "c")]

    # While they spin: another session, /health, a new handshake
    assert other.call_tool("echo", text="still here") == "still here"
    health = httpx.get(url.replace("ws://", "http://") + "/health", timeout=LIVENESS_S)
    assert health.status_code == 200
    with MCPToolClient(base_url=url, message_timeout_s=LIVENESS_S).sync() as fresh:
        fresh.reset(seed=1)
        assert fresh.call_tool("echo", text="new") == "new"

    for thread, _ in threads:
        thread.join(LIVENESS_S)
        assert not thread.is_alive(), "a stuck call never failed"
    for _, outcome in threads:
        assert f"took longer than {STEP_TIMEOUT_S:g}s" in str(outcome.get("error")), outcome
    with pytest.raises(Exception, match="this session is over"):  # the session failed, not only its call
        stuck_in_python.step({"type": "message", "message": "hello?"})
    wait_for(lambda: not any(alive(pid) for pid in spinning), "the stuck workers going")
    assert os.getpid() not in spinning
    assert other.call_tool("echo", text="after") == "after"


def test_the_workers_run_under_the_default_kernel_limits(served):
    url, _ = served
    with MCPToolClient(base_url=url, message_timeout_s=LIVENESS_S).sync() as client:
        client.reset(seed=0)
        limits = json.loads(client.call_tool("limits"))
    assert limits["memory"] == 8 << 30
    assert limits["cpu"] != resource.RLIM_INFINITY


def test_the_cpu_limit_ends_a_worker_stuck_in_c_before_any_deadline(tmp_path, monkeypatch):
    """``RLIMIT_CPU`` is the kernel's: a worker stuck in ``9**9**9`` (no thread of it can run) is ended by SIGXCPU
    after its CPU budget, far inside the call's 10-minute deadline."""
    monkeypatch.setenv("SPIN_DIR", str(tmp_path))
    workers = ProcessWorkers(1, processes=1, limits=ResourceLimits(cpu_s=2))

    async def spin() -> None:
        session = await workers.open(EnvFactory(SPEC), timeout_s=LIVENESS_S)
        await session.reset(0, timeout_s=LIVENESS_S)
        call = {"type": "function", "function": {"name": "spin", "arguments": {"kind": "c"}}}
        await session.step({"role": "assistant", "content": "", "tool_calls": [call]}, timeout_s=600)

    try:
        with pytest.raises(EnvWorkerLost, match=r"during step\(\) \(killed by SIGXCPU\)"):
            asyncio.run(spin())
    finally:
        workers.close()
    assert (tmp_path / "c").exists()  # the spin began: the worker saw SPIN_DIR


def test_the_serve_env_flags_reach_the_app_and_bad_ones_are_one_line(monkeypatch, capsys):
    import envkit.adapters.openenv.server as openenv_server
    from envkit.cli.app import main
    from envkit.registry import EnvSpecError

    seen = []

    def fake_app(env, config, **kwargs):
        seen.append(kwargs)
        raise EnvSpecError("stopped before listening")

    monkeypatch.setattr(openenv_server, "create_envkit_app", fake_app)
    assert main(["serve-env", "arithmetic"]) == 2
    assert main(["serve-env", "arithmetic", "--step-timeout", "5", "--env-processes", "3", "--cpu-limit", "0"]) == 2
    assert main(["serve-env", "arithmetic", "--memory-limit", "1.5"]) == 2
    default, chosen, more = seen
    assert default["step_timeout_s"] == 20 and default["env_processes"] is None
    assert default["limits"] == ResourceLimits(cpu_s=60, memory_bytes=8 << 30)
    assert chosen["step_timeout_s"] == 5 and chosen["env_processes"] == 3
    assert chosen["limits"] == ResourceLimits(cpu_s=None, memory_bytes=8 << 30)
    assert more["limits"] == ResourceLimits(cpu_s=60, memory_bytes=3 << 29)
    capsys.readouterr()
    for flags, message in (
        (["--step-timeout", "0"], "--step-timeout must be a positive number of seconds"),
        (["--env-processes", "0"], "--env-processes must be at least 1"),
        (["--cpu-limit", "-1"], "--cpu-limit must be 0 (no limit) or a number of CPU seconds, got -1"),
        # inf and NaN were a worker's OverflowError / ValueError traceback; 0.5 GiB a server that never came up.
        (["--cpu-limit", "inf"], "--cpu-limit must be 0 (no limit) or a number of CPU seconds, got inf"),
        (["--memory-limit", "nan"], "--memory-limit must be 0 (no limit) or at least 1 GiB"),
        (["--memory-limit", "inf"], "--memory-limit must be 0 (no limit) or at least 1 GiB"),
        (["--memory-limit", "0.5"], "--memory-limit must be 0 (no limit) or at least 1 GiB"),
    ):
        assert main(["serve-env", "arithmetic", *flags]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1
