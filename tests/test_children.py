"""No process envkit starts outlives the process that started it (:mod:`envkit.util.children`): a training process
that starts vLLM servers (``envkit train --async --vllm-servers 1``, the real command with a stand-in server that
starts a process of its own, as vLLM starts its engine) and one that holds env worker processes (one of them stuck in
a C call that holds the GIL, where no thread of the worker can run) are SIGTERMed, and separately SIGKILLed: every
process they started is gone. Then the guard's own contract, piece by piece."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers import alive, wait_gone

import envkit
from envkit.util import children

TESTS = Path(__file__).parent


def kill_left(pids: list[int]) -> None:
    """SIGKILL what a failed test left running (only the test's own processes, by pid)."""
    for pid in pids:
        if alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def read_when(path: Path, process: subprocess.Popen[str], limit_s: float = 300.0) -> str:
    """``path``'s text once it ends with a newline (the process that writes it is still running)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return text
        assert process.poll() is None, f"exited with {process.returncode} before writing {path.name}"
        time.sleep(0.2)
    raise AssertionError(f"nothing in {path} after {limit_s:g}s")


# ---- a training process's vLLM servers ------------------------------------------------------------------------------
STAND_IN_SERVER = """
import os, subprocess, sys, time
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])  # as vLLM starts its engine
with open(os.environ["STAND_IN_PIDS"], "a") as out:
    out.write(f"{os.getpid()} {engine.pid}\\n")
time.sleep(3600)  # never healthy: the trainer waits for it
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from envkit.models.tiny import write_tiny_model

    path = tmp_path_factory.mktemp("tiny-arithmetic")
    write_tiny_model(path, env="arithmetic")
    return path


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_trainer_terminated_or_killed_leaves_no_vllm_server_behind(signum, model_dir, tmp_path):
    """``envkit train --async --vllm-servers 1``: once its server (and the server's own child) runs, the trainer gets
    ``signum``; the server and its child are gone soon after. A SIGTERMed trainer exits 143 through its ``finally:``."""
    pytest.importorskip("trl.experimental.async_grpo")
    script = tmp_path / "stand_in_server.py"
    script.write_text(STAND_IN_SERVER)
    python = tmp_path / "python"  # envkit's probe (-c) runs on this Python; `-m vllm...` runs the stand-in
    python.write_text(
        f'#!/bin/sh\nif [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi\nshift 2\n'
        f'exec {sys.executable} {script} "$@"\n'
    )
    python.chmod(0o755)
    pids_file = tmp_path / "pids"
    command = [sys.executable, "-m", "envkit.cli", "train", "arithmetic", "--model", str(model_dir), "--async"]
    command += ["--vllm-servers", "1", "--vllm-python", str(python), "--output-dir", str(tmp_path / "out")]
    command += ["--max-steps", "1", "--disable-tqdm", "true"]
    env = {**os.environ, "STAND_IN_PIDS": str(pids_file), "TRL_EXPERIMENTAL_SILENCE": "1"}
    trainer = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    started: list[int] = []
    try:
        started = [int(pid) for pid in read_when(pids_file, trainer).split()]
        trainer.send_signal(signum)
        output, _ = trainer.communicate(timeout=120)
        left = wait_gone(started)
        assert not left, f"still running after the trainer's {signum.name}: {left}"
        if signum == signal.SIGTERM:
            assert trainer.returncode == 143, output[-2000:]
            assert "terminated" in output
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        kill_left(started)


# ---- a process's env worker processes --------------------------------------------------------------------------------
STUCK_IN_C = """
import asyncio, json, os, sys, threading
sys.path.insert(0, {tests!r})
from envkit.util.children import sigterm_exits
from envkit.workers import EnvFactory
from envkit.workers.processes import ProcessWorkers

async def main():
    workers = ProcessWorkers(2, processes=2)
    factory = EnvFactory("test_children:StuckInC")
    sessions = [await workers.open(factory, timeout_s=120) for _ in range(2)]
    for session in sessions:
        await session.reset(0, timeout_s=120)
    from multiprocessing import forkserver
    pids = [*workers.pids, forkserver._forkserver._forkserver_pid]
    step = asyncio.ensure_future(sessions[0].step({{"role": "assistant", "content": "spin"}}, timeout_s=3600))
    while not os.path.exists({marker!r}):
        await asyncio.sleep(0.05)
    print(json.dumps(sorted(set(pids))), flush=True)
    try:
        await step
    finally:
        workers.close()

if __name__ == "__main__":
    with sigterm_exits():
        asyncio.run(main())
"""


class StuckInC(envkit.Env):
    """An env whose step enters one long C call that holds the GIL (``9**9**9``: hours of big-integer arithmetic)."""

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return [{"role": "user", "content": "go"}], {}

    def step(self, action):
        Path(os.environ["STUCK_MARKER"]).write_text("spinning")
        nine = 9
        return [{"role": "user", "content": str(nine**nine**nine % 7)}], 0.0, True, False, {}

    def score(self) -> float:
        return 0.0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_env_workers_go_with_their_parent_even_one_stuck_in_a_c_call(signum, tmp_path):
    """Two worker processes, one inside ``9**9**9`` (its lifeline thread cannot run: the call holds the GIL): the parent
    gets ``signum``, and both workers and the fork server are gone soon after (the stuck one by the kernel's
    parent-death signal, once the fork server has gone with the parent)."""
    marker = tmp_path / "marker"
    script = tmp_path / "stuck_in_c.py"
    script.write_text(STUCK_IN_C.format(tests=str(TESTS), marker=str(marker)))
    env = {**os.environ, "STUCK_MARKER": str(marker)}
    parent = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    started: list[int] = []
    try:
        line = parent.stdout.readline()
        assert line, "the script printed nothing"
        started = json.loads(line)
        assert len(started) >= 3, started  # two workers and the fork server
        parent.send_signal(signum)
        parent.wait(timeout=120)
        left = wait_gone(started)
        assert not left, f"still running after the parent's {signum.name}: {left}"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        kill_left(started)


# ---- the guard -------------------------------------------------------------------------------------------------------
def test_stop_ends_the_command_and_what_it_started(tmp_path):
    pids = tmp_path / "pids"
    child = children.start(["sh", "-c", f"sleep 600 & echo $$ $! > {pids}; wait"], grace_s=5)
    try:
        deadline = time.monotonic() + 30
        while not (pids.exists() and pids.read_text().endswith("\n")) and time.monotonic() < deadline:
            time.sleep(0.05)
        started = [int(pid) for pid in pids.read_text().split()]
        assert started[0] == child.pid and child in children.live_children()
        assert os.getpgid(started[1]) == child.pid != os.getpgid(0)  # a process group of its own
        assert child.stop() == -signal.SIGTERM  # the guard ends as its command did
        assert not wait_gone(started) and child not in children.live_children()
        assert child.stop() == -signal.SIGTERM  # idempotent
    finally:
        child.kill()


def test_a_command_that_exits_leaves_nothing_running_and_reports_its_status(tmp_path):
    pids = tmp_path / "pids"
    child = children.start(["sh", "-c", f"sleep 600 & echo $! > {pids}; exit 3"])
    assert child.wait(60) == 3
    assert not wait_gone([int(pids.read_text())])


def test_a_command_that_cannot_start_is_one_oserror():
    with pytest.raises(OSError, match="cannot start /no/such/program: FileNotFoundError"):
        children.start(["/no/such/program"])


def test_sigterm_exits_raises_terminated_in_the_main_thread_and_puts_the_handler_back():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(children.Terminated) as raised, children.sigterm_exits():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the handler raises at the next bytecode
    assert raised.value.code == 143 and isinstance(raised.value, SystemExit)
    assert signal.getsignal(signal.SIGTERM) is before


def test_importing_envkit_changes_no_signal_handler():
    code = "import signal; a = signal.getsignal(signal.SIGTERM); import envkit, envkit.cli.app, envkit.util.children; "
    code += "import envkit.workers.processes; print(a == signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "True", done.stderr[-2000:]


def test_resource_limits_stop_a_call_stuck_in_c_and_an_allocation_past_the_bound(tmp_path):
    """In a process of its own: past ``cpu_s`` CPU seconds since the latest :meth:`renew_cpu` the kernel ends it
    (SIGXCPU), inside a C call that holds the GIL; past ``memory_bytes`` an allocation raises ``MemoryError``."""
    code = textwrap.dedent(
        """
        import sys
        from envkit.util.children import ResourceLimits
        ResourceLimits(cpu_s=1, memory_bytes=4 << 30).apply()
        try:
            bytearray(5 << 30)
        except MemoryError:
            print("MemoryError", flush=True)
        nine = 9
        nine**nine**nine
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "MemoryError" and done.returncode == -signal.SIGXCPU, (done.returncode, done.stderr)


def test_the_lifeline_fires_when_the_other_end_closes():
    ours, theirs = os.pipe()
    gone = threading.Event()
    children.watch_lifeline(ours, gone.set)
    assert not gone.wait(0.2)
    os.close(theirs)
    assert gone.wait(30)
    os.close(ours)


# ---- servers another library starts: MCP stdio -------------------------------------------------------------------
STUCK_MCP_SERVER = """
import os, sys, time
from mcp.server.fastmcp import FastMCP

server = FastMCP("stuck", log_level="WARNING")


@server.tool()
async def hang() -> str:
    \"\"\"Block the server's event loop: it can no longer read the end of its stdin.\"\"\"
    time.sleep(3600)
    return "never"


with open(sys.argv[1], "w") as out:
    out.write(f"{os.getpid()}\\n")
server.run()
"""

MCP_CLIENT = """
import sys, threading
from envkit.adapters.mcp.client import MCPSession

session = MCPSession("stdio", [sys.executable, sys.argv[1], sys.argv[2]], timeout_s=120)
session.open()
threading.Thread(target=session.call_tool, args=("hang", {{}}), daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


def test_an_mcp_stdio_server_goes_with_its_parent_even_when_it_is_stuck(tmp_path):
    """The MCP SDK starts a stdio server itself; a server whose event loop is blocked never reads the end of its
    stdin, so only its guard (:func:`children.guarded`) can stop it when the process that started it is SIGKILLed."""
    pytest.importorskip("mcp", reason="the mcp extra is not installed")
    server, client, pid_file = tmp_path / "stuck_server.py", tmp_path / "client.py", tmp_path / "server.pid"
    server.write_text(STUCK_MCP_SERVER)
    client.write_text(MCP_CLIENT.format())
    parent = subprocess.Popen(
        [sys.executable, str(client), str(server), str(pid_file)], stdout=subprocess.PIPE, text=True
    )
    started: list[int] = []
    try:
        assert parent.stdout.readline().strip() == "ready"
        started = [int(read_when(pid_file, parent))]
        time.sleep(1.0)  # the hang call is in the server
        parent.kill()
        parent.wait(timeout=60)
        left = wait_gone(started)
        assert not left, f"the MCP server {left} outlived the process that started it"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        kill_left(started)


def test_a_guarded_command_keeps_its_stdio_and_exit_status():
    """What a library sees of a guarded command is the command itself: its stdin, stdout and exit status."""
    command = children.guarded(
        [sys.executable, "-c", "import sys; sys.stdout.write(sys.stdin.read().upper()); sys.exit(3)"]
    )
    result = subprocess.run(command, input="echo\n", capture_output=True, text=True, timeout=120)
    assert (result.stdout, result.returncode) == ("ECHO\n", 3)
    missing = subprocess.run(children.guarded(["envkit-no-such-command"]), capture_output=True, text=True, timeout=120)
    assert missing.returncode == 127 and "envkit-no-such-command" in missing.stderr
