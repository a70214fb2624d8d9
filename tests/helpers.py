"""Small envs used across the tests (the quickstart's example lives in examples/capitals.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import envkit
from envkit.backends.oracle import OracleBackend


class CounterEnv(envkit.ToolEnv):
    """Add numbers with tools until the total reaches the target; a simulated user asks for one more step."""

    max_turns = 8

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.target = int(self.np_random.integers(5, 50))
        self.total = 0
        self.asked_again = False
        return [
            {"role": "system", "content": "You keep a running total with tools."},
            {"role": "user", "content": f"Bring the total to {self.target}, then tell me."},
        ], {"target": self.target}

    @envkit.tool
    def add(self, amount: int) -> str:
        """Add an amount to the running total.

        Args:
            amount: The whole number to add (may be negative).
        """
        self.total += amount
        return f"total is now {self.total}"

    @envkit.tool
    def get_total(self) -> dict:
        """Read the running total."""
        return {"total": self.total}

    @envkit.tool
    def explode(self, reason: str = "because") -> str:
        """A tool with a bug: it always raises.

        Args:
            reason: Why it explodes.
        """
        raise KeyError(reason)

    def on_text(self, message):
        if not self.asked_again:
            self.asked_again = True
            return [{"role": "user", "content": "Great. Please double-check the total."}]
        return None

    def score(self) -> float:
        return 1.0 if self.total == self.target and self.asked_again else 0.0

    def oracle(self):
        if self.total != self.target:
            return call("add", amount=self.target - self.total)
        if not self.asked_again:
            return {"role": "assistant", "content": f"Done: the total is {self.target}."}
        if self.messages[-1]["role"] == "user":
            return {"role": "assistant", "content": "Checking.", "tool_calls": [tool_call("get_total")]}
        return {"role": "assistant", "content": f"Confirmed: the total is {self.total}."}


class FailsOnSomeSeeds(envkit.Env):
    """Any reply scores 1, except that the step raises on every ``every``-th task seed from ``first`` on (a tool
    server some tasks reach: ``first=1_000_000`` fails held-out tasks only); with ``once_exists``, only once that
    file exists (a server that goes down mid-run)."""

    max_turns = 1

    def __init__(self, first: int = 0, every: int = 1, once_exists: str | None = None) -> None:
        super().__init__()
        self.first, self.every, self.once_exists = first, every, once_exists

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.task, self.solved = seed, False
        return [{"role": "user", "content": f"task {seed}"}], {"task_id": f"t{seed}"}

    def step(self, action):
        down = self.once_exists is None or os.path.exists(self.once_exists)
        if down and self.task >= self.first and (self.task - self.first) % self.every == 0:
            raise RuntimeError("tool server unreachable")
        self.solved = True
        return [], 1.0, True, False, {}

    def score(self) -> float:
        return float(self.solved)


class SilentOnce(CounterEnv):
    """The first text turn gets no reply and the episode goes on (``on_text`` returning ``[]`` is allowed)."""

    def on_text(self, message):
        if not getattr(self, "was_silent", False):
            self.was_silent = True
            return []
        return super().on_text(message)


def quick_train_flags(
    *,
    max_steps: int | None = 2,
    max_new_tokens: int = 8,
    max_turns: int = 2,
    batch_size: int = 4,
    generations: int = 2,
    train_tasks: int = 8,
    eval_tasks: int = 2,
) -> list[str]:
    """``envkit train`` flags for a run of seconds on a tiny model: a few short steps on a few tasks
    (``max_steps=None``: no ``--max-steps``, for a test that gives its own)."""
    steps = [] if max_steps is None else ["--max-steps", str(max_steps)]
    return [
        *steps,
        *("--rl-max-new-tokens", str(max_new_tokens), "--max-turns", str(max_turns)),
        *("--per-device-train-batch-size", str(batch_size), "--rl-num-generations", str(generations)),
        *("--train-tasks", str(train_tasks), "--eval-tasks", str(eval_tasks)),
    ]


def tool_call(name: str, **arguments) -> dict:
    """One tool call in the Hugging Face chat format."""
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def call(name: str, **arguments) -> dict:
    """An assistant message with a single tool call."""
    return {"role": "assistant", "content": "", "tool_calls": [tool_call(name, **arguments)]}


class VerbosityEnv(envkit.Env):
    """One turn; the score grows with the answer's length, so even a random model gets varied rewards."""

    max_turns = 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": f"Say something long about the number {seed}."}], {}

    def step(self, action):
        return [], self.score(), True, False, {}

    def score(self) -> float:
        said = [m["content"] for m in self.messages if m["role"] == "assistant"]
        return min(1.0, len(said[-1]) / 400) if said else 0.0

    def oracle(self):
        return {"role": "assistant", "content": "x" * 400}


RELEASE_CAP_S = 60.0
"""How long a call that blocks until its test releases it waits at most: a test that never releases it (a bug) still
ends, and a deadline of seconds is never this long."""

ENGINE_DEADLINE_S = 5.0
"""``step_timeout_s`` for an engine test in which one env call blocks until released and must time out: the engine
times every call of an episode against it, rendering included (milliseconds idle; the renderer's first build, seconds
under load, is outside the deadline), so only the blocked call may come near it. A timeout costs this much."""


@contextlib.contextmanager
def hung_step_env_file(folder: Path) -> Iterator[str]:
    """Write ``hung_env.py`` into ``folder``: a CounterEnv whose every step blocks until the test releases it; yield its
    env spec (``path:HungStep``) for the command line, and release it on the way out.

    The step waits for a release file (it may run in another process), at most :data:`RELEASE_CAP_S`, so a deadline
    is the only thing that can end it early, however loaded the machine: the test does not race a sleep.

    Args:
        folder: Where the env file and its release file go (a test's ``tmp_path``).

    Returns:
        A context manager yielding the env spec; leaving it releases every step.
    """
    path, release = folder / "hung_env.py", folder / "hung_env.release"
    path.write_text(
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from helpers import CounterEnv\n\n"
        "class HungStep(CounterEnv):\n"
        "    def step(self, action):\n"
        f"        give_up = time.monotonic() + {RELEASE_CAP_S!r}\n"
        f"        while not os.path.exists({str(release)!r}) and time.monotonic() < give_up:\n"
        "            time.sleep(0.01)\n"
        "        return super().step(action)\n"
    )
    try:
        yield f"{path}:HungStep"
    finally:
        release.touch()


def wait_until(condition: Callable[[], bool], what: str, limit_s: float = RELEASE_CAP_S) -> None:
    """Poll ``condition()`` until it holds; fail the test naming ``what`` if it still does not after ``limit_s``.

    For waiting on something another thread does (a released call returning): a fixed sleep races the machine's load.

    Args:
        condition: Polled every 10 ms.
        what: What is waited for, for the failure message.
        limit_s: A cap, not a bound: minutes of margin over what the test expects.
    """
    give_up = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < give_up, f"{what}: still not so after {limit_s:g}s"
        time.sleep(0.01)


def backend_is_free(backend: object) -> bool:
    """Whether no engine call of ``backend`` is still running (one abandoned at its deadline keeps it until it returns).

    The engine marks the call over just after the backend's ``generate`` returned; a test that calls the backend again
    right after :meth:`~envkit.backends.RecordingBackend.wait_idle` can land in between and be refused as "still
    running past its deadline", so such tests wait for this instead.

    Args:
        backend: The backend an engine (or a :class:`~envkit.rollout.batching.MicroBatcher`) calls.

    Returns:
        Whether the backend may be called again.
    """
    from envkit.rollout import batching

    running = batching._running(backend)
    return running is None or running.returned.is_set()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for servers started by tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def accelerate_launch(*target: str, processes: int = 2) -> list[str]:
    """The command running ``target`` (a script and its arguments, or ``-m module ...``) under ``accelerate launch
    --multi_gpu`` with ``processes`` processes: with GRPOConfig's ``use_cpu``, DDP over gloo on CPU (accelerate's
    ``--cpu`` would start one process); on a free port, without mixed precision or dynamo."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--main_process_port",
        str(free_port()),
        "--num_processes",
        str(processes),
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        *target,
    ]


@contextlib.contextmanager
def serve_env(*argv: str, start_s: float = 180.0) -> Iterator[str]:
    """``envkit serve-env ARGV...`` as a real subprocess: yields the ``ws://`` URL it prints once it is up, and stops
    it at the end (SIGTERM, SIGKILL after 15 s). Fails the test when it exits, or prints no URL, within ``start_s``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "envkit.cli", "serve-env", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stdout], daemon=True).start()
    try:
        seen, deadline = [], time.monotonic() + start_s
        while not (seen and re.search(r"ws://\S+:\d+", seen[-1])):
            assert time.monotonic() < deadline and process.poll() is None, f"serve-env did not start: {seen}"
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=1))
        yield re.search(r"ws://\S+:\d+", seen[-1]).group(0)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def envkit_serve(model_dir: Path, *flags: str, log_path: Path | None = None) -> Iterator[str]:
    """``envkit serve --model MODEL_DIR FLAGS...`` as a real subprocess on a free port: yields its base URL once
    ``/health`` answers, and stops it by its pid at the end (SIGTERM, SIGKILL if it lingers).

    No wall-clock budget decides a test: it waits as long as the server process lives (a loaded machine is slow,
    not broken) and fails at once, with the server's output, when it exits (an hour at most, against a hang)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [str(Path(sys.executable).parent / "envkit"), "serve", "--model", str(model_dir), "--port", str(port)]
    command += ["--served-model-name", "tiny", *flags]
    with contextlib.ExitStack() as stack:
        log = stack.enter_context(open(log_path, "wb")) if log_path is not None else subprocess.DEVNULL
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 3600
            while True:
                try:
                    urllib.request.urlopen(url + "/health", timeout=5).read()
                    break
                except OSError:
                    output = log_path.read_text(errors="replace")[-2000:] if log_path is not None else ""
                    assert process.poll() is None, f"envkit serve exited with {process.returncode}: {output}"
                    assert time.monotonic() < deadline, f"envkit serve never answered /health: {output}"
                    time.sleep(0.2)
            yield url
        finally:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
                try:
                    process.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    os.kill(process.pid, signal.SIGKILL)
                    process.wait()


MODEL_LOGPROB = -0.5


# Kept hand-written: an oracle policy that also checks each prompt against the template (not a scripted reply).
class CheckedOracleBackend(OracleBackend):
    """Replies with the tokens the env's oracle would produce (an
    :class:`~envkit.backends.oracle.OracleBackend`), and checks
    every prompt the engine sends against the chat template's own rendering of the conversation so far.

    The check is independent of the engine: the expected prompt is the template rendering the replica's transcript
    whole (with the generation prompt), tokenized, never the engine's suffix arithmetic. A prompt one token off fails
    the episode, so these tests fail on any drift from the template's rendering.

    ``spans[seed]`` is the list of token lists the oracle generated on task ``seed`` (one per assistant turn, of the
    first episode played on that seed); wrap it in a :class:`~envkit.backends.RecordingBackend` to count its calls.
    """

    def __init__(self, env_factory, tokenizer, seeds, **renderer_kwargs):
        super().__init__(env_factory, tokenizer, seeds, logprob=MODEL_LOGPROB, **renderer_kwargs)
        self.spans: dict[int, list[list[int]]] = {}

    def on_prompt(self, prompt, replica):
        renderer = replica.renderer
        expected = renderer.encode(renderer.render(replica.env.messages, add_generation_prompt=True))
        if list(prompt) != expected:
            got, want = (renderer.tokenizer.decode(ids[-40:]) for ids in (prompt, expected))
            raise AssertionError(
                f"the prompt is not the template's rendering of the transcript: ...{got!r} != ...{want!r}"
            )
        self.spans.setdefault(replica.seed, replica.generated)


# The Java-game suites (tests/test_textworld_express.py, tests/test_scienceworld.py): the same checks on both families.


def java_game_marks(module: str, extra: str) -> list[pytest.MarkDecorator]:
    """A Java-game suite's ``pytestmark``: skipped, with the install command as the reason, when the game's package
    (``module``, installed by the ``extra``) or a Java runtime is missing."""
    return [
        pytest.mark.skipif(
            importlib.util.find_spec(module) is None,
            reason=f"{module} is not installed: pip install -e '.[{extra}]'",
        ),
        pytest.mark.skipif(
            shutil.which("java") is None, reason="no Java runtime: sudo apt-get install default-jre-headless"
        ),
    ]


@contextlib.contextmanager
def forgotten_adapter_classes() -> Iterator[None]:
    """Drop, on leaving, the adapter env classes resolved inside (the registry caches them per spec)."""
    from envkit.registry import families as registry

    before = set(registry._ADAPTER_CLASSES)
    try:
        yield
    finally:
        for spec in set(registry._ADAPTER_CLASSES) - before:
            del registry._ADAPTER_CLASSES[spec]


def say(content: str) -> dict:
    """An assistant reply with ``content``."""
    return {"role": "assistant", "content": content}


def play_oracle(env: envkit.Env, seed: int) -> float:
    """Play task ``seed`` by the env's oracle to the end; the score."""
    env.reset(seed=seed)
    while not env.done:
        action = env.oracle()
        assert action is not None, f"{env.envkit_spec}: no oracle action on seed {seed}"
        env.step(action)
    return env.score()


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    except OSError:
        return True


def wait_gone(pids: list[int], limit_s: float = 60.0) -> list[int]:
    """Poll until none of ``pids`` runs (at most ``limit_s``: generous for a loaded 2-core CI machine); those still
    running."""
    deadline = time.monotonic() + limit_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


def check_missing_java_is_one_line(spec: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Making ``spec`` with no Java runtime (none on PATH, no JAVA_HOME) fails in one line naming the fix."""
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on PATH
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(envkit.EnvSpecError) as raised:
        envkit.make(spec)
    message = str(raised.value)
    assert "\n" not in message and "no Java runtime was found" in message
    assert "apt-get install default-jre-headless" in message


def oracle_rollouts(spec: str, seeds: list[int], tokenizer) -> list:
    """One episode per seed of ``spec`` through the rollout engine, played by a :class:`CheckedOracleBackend` (so
    every prompt is checked against the template); the episodes."""
    from envkit.backends import SamplingParams
    from envkit.rollout import RolloutEngine

    def factory() -> envkit.Env:
        return envkit.make(spec)

    backend = CheckedOracleBackend(factory, tokenizer, seeds)
    return RolloutEngine(factory, backend, tokenizer).run(seeds, 1, SamplingParams())


def eval_episodes(spec: str, model_dir: Path, out: Path, tasks: int, max_turns: int, capsys) -> list[dict]:
    """``envkit eval`` of the model in ``model_dir`` on ``tasks`` tasks of ``spec`` (8 new tokens a turn), which must
    exit 0; the episodes it wrote to ``out``."""
    from envkit.cli.app import main as cli_main

    argv = ["eval", spec, "--model", str(model_dir), "--tasks", str(tasks), "--max-turns", str(max_turns)]
    argv += ["--max-new-tokens", "8", "--out", str(out)]
    assert cli_main(argv) == 0, capsys.readouterr().out
    return [json.loads(line) for line in out.read_text().splitlines()]
