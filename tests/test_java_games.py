"""A closed env's JVM handed on to the next env of its game (``envkit.adapters.textworld_express.java``), through real
TextWorldExpress games on real JVMs: the next env plays as on a new JVM, a JVM still running a call is never handed
on, nor one grown past ``JVM_RETIRE_MIB`` or one out of memory, and a waiting JVM ends after ``JVM_IDLE_SECONDS`` or
with the Python process that started it.

Skipped, with the install command as the reason, when the package or a Java runtime is missing.
"""

from __future__ import annotations

import gc
import json
import logging
import multiprocessing
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from helpers import forgotten_adapter_classes, java_game_marks, play_oracle, say, wait_gone

import envkit
from envkit.adapters.textworld_express import java

pytestmark = java_game_marks("textworld_express", "textworld-express")


@pytest.fixture(autouse=True)
def _no_waiting_jvms() -> Iterator[None]:
    """Each test starts and ends with no JVM waiting (and drops the classes it resolved)."""
    java.end_idle_jvms()
    with forgotten_adapter_classes():
        yield
    java.end_idle_jvms()


def oracle_episode(spec: str, seed: int, **config: Any) -> tuple[list[dict], float, int]:
    """One episode of ``spec`` by its oracle on a new env, closed after: its messages, its score and its JVM's pid."""
    with closing(envkit.make(spec, **config)) as env:
        score = play_oracle(env, seed)
        return env.messages, score, env.java.process.pid


def test_the_next_env_of_a_game_plays_on_a_closed_envs_jvm_as_it_would_on_a_new_one(monkeypatch):
    monkeypatch.setattr(java, "JVM_IDLE_SECONDS", 0)  # every env on a JVM of its own, ended with it
    new = [oracle_episode("textworld-express:cookingworld", seed) for seed in (0, 1)]
    assert new[0][2] != new[1][2] and not wait_gone([new[0][2]], limit_s=15)

    monkeypatch.setattr(java, "JVM_IDLE_SECONDS", 60)
    other_game = envkit.make("textworld-express:coin")  # the same JAR; closed mid-episode
    other_game.reset(seed=3)
    other_game.step(say("open door to north"))
    pid = other_game.java.process.pid
    other_game.close()
    handed_on = [oracle_episode("textworld-express:cookingworld", seed) for seed in (0, 1)]
    assert [episode[2] for episode in handed_on] == [pid, pid]
    assert [episode[:2] for episode in handed_on] == [episode[:2] for episode in new]
    assert other_game.java is None and other_game.server is None  # the closed env holds nothing of the JVM


def test_every_game_plays_the_same_on_a_jvm_that_played_the_others(monkeypatch):
    """Three seeds of every game, with its default parameters and with others: the openings, and for the games whose
    gold path the JAR generates the same in every JVM (not coin's nor twc's), the whole oracle transcript."""
    games = {
        "coin": None,
        "cookingworld": None,
        "twc": None,
        "mapreader": None,
        "arithmetic": None,
        "sorting": None,
        "simonsays": None,
        "peckingorder": None,
        "coin ": "numLocations=2,includeDoors=0",
        "cookingworld ": "numLocations=3,numIngredients=2",
    }

    def play() -> tuple[dict[str, list], set[int]]:
        found, pids = {}, set()
        for name, params in games.items():
            game = name.strip()
            with closing(envkit.make(f"textworld-express:{game}", game_params=params)) as env:
                for seed in (0, 2, 5):
                    if game in ("coin", "twc"):
                        found[f"{name}{seed}"] = env.reset(seed=seed)[0]
                    else:
                        play_oracle(env, seed)
                        found[f"{name}{seed}"] = env.messages
                pids.add(env.java.process.pid)
        return found, pids

    monkeypatch.setattr(java, "JVM_IDLE_SECONDS", 0)
    on_new, new_pids = play()
    monkeypatch.setattr(java, "JVM_IDLE_SECONDS", 60)
    on_handed_on, handed_on_pids = play()
    assert len(new_pids) == len(games) and len(handed_on_pids) == 1
    assert on_handed_on == on_new


def test_a_jvm_still_running_a_call_of_its_env_ends_with_the_env():
    env = envkit.make("textworld-express:coin")
    game = env.java
    failures: list[BaseException] = []

    def sleep_in_the_jvm() -> None:
        try:
            game.jvm.java.lang.Thread.sleep(3000)
        except BaseException as error:  # the JVM ends under the call
            failures.append(error)

    sleeper = threading.Thread(target=sleep_in_the_jvm)
    sleeper.start()
    deadline = time.monotonic() + 10
    while game.gateway.counting_client.calls_in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert game.gateway.counting_client.calls_in_flight == 1
    env.close()
    assert not wait_gone([game.process.pid], limit_s=15)
    with closing(envkit.make("textworld-express:coin")) as next_env:
        assert next_env.java.process.pid != game.process.pid
    sleeper.join()
    assert failures  # the call did not survive its JVM


def test_a_waiting_jvm_ends_after_jvm_idle_seconds(monkeypatch):
    monkeypatch.setattr(java, "JVM_IDLE_SECONDS", 0.5)
    env = envkit.make("textworld-express:coin")
    pid = env.java.process.pid
    env.close()
    assert wait_gone([pid], limit_s=0.1) == [pid]  # waiting for the next env
    assert not wait_gone([pid], limit_s=15)
    with closing(envkit.make("textworld-express:coin")) as next_env:
        assert next_env.java.process.pid != pid


def test_a_jvm_grown_past_jvm_retire_mib_ends_with_its_env(monkeypatch):
    env = envkit.make("textworld-express:coin")
    game = env.java
    assert 10 < game.resident_mib() < java.JVM_RETIRE_MIB
    monkeypatch.setattr(java, "JVM_RETIRE_MIB", 1)
    env.close()
    assert not wait_gone([game.process.pid], limit_s=15)


ALLOCATIONS = {
    "py4j's array command": lambda game: game.gateway.new_array(game.jvm.byte, 256 * 2**20),
    "a Java method": lambda game: game.jvm.java.nio.ByteBuffer.allocate(256 * 2**20),
}
"""Two ways to ask a 64 MiB heap for 256 MiB. The JVM either closes the call's connection as it exits or first answers
with py4j's bare error (about one call in five here), so each runs twice."""


@pytest.mark.parametrize("attempt", [1, 2])
@pytest.mark.parametrize("allocation", list(ALLOCATIONS))
def test_a_jvm_that_runs_out_of_memory_exits_saying_so_and_the_next_env_gets_a_new_one(allocation, attempt):
    env = envkit.make("textworld-express:coin", java_heap="64m")
    game = env.java
    with pytest.raises(java.JavaOutOfMemory, match=r"ran out of memory \(its heap: -Xmx64m\).*larger java_heap"):
        ALLOCATIONS[allocation](game)
    assert game.process.wait(timeout=15) == java.OUT_OF_MEMORY_EXIT
    env.close()
    with closing(envkit.make("textworld-express:coin", java_heap="64m")) as next_env:
        assert next_env.java is not game
        assert next_env.reset(seed=0)[0]


def test_a_jvm_that_ran_out_of_memory_leaves_no_errors_in_the_log_as_its_objects_are_collected(caplog):
    """py4j tells the JVM of every Python proxy it collects; to an exited JVM, each would log a connection error with
    its traceback (and, formatted inside another parse, 3.11's ``ast`` can fail: CI's pytest did, on such a test)."""
    env = envkit.make("textworld-express:coin", java_heap="64m")
    game = env.java
    proxies = [game.jvm.java.util.ArrayList() for _ in range(3)]
    with pytest.raises(java.JavaOutOfMemory):
        ALLOCATIONS["py4j's array command"](game)
    caplog.clear()  # py4j's own record of the failing call stays: it is that call's
    with caplog.at_level(logging.INFO):
        del proxies
        gc.collect()
        env.close()
    assert [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR] == []


def test_a_jvm_started_with_java_options_from_the_environment_says_so_once(monkeypatch, caplog):
    """``JAVA_TOOL_OPTIONS`` reaches every game JVM (Java prints only "Picked up …" on its stderr), and its options can
    change what a game plays: the first JVM started with a setting warns, naming it; the next ones do not repeat it."""
    from textworld_express.constants import JAR_PATH as JAR

    monkeypatch.setattr(java, "_options_warned", set())
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", "-Denvkit.test=1")
    with caplog.at_level(logging.WARNING, logger=java.__name__):
        for _ in range(2):
            java.JavaGame.open(JAR, "textworld-express:coin", reusable=False).close()
        assert [record.getMessage() for record in caplog.records] == [
            "textworld-express:coin: the game's JVM starts with JAVA_TOOL_OPTIONS='-Denvkit.test=1' from the "
            "environment; JVM options can change the games' play (ScienceWorld's with -XX:TieredStopAtLevel=1), so a "
            "seed may not play as it does elsewhere: unset JAVA_TOOL_OPTIONS for the games' usual play"
        ]
        monkeypatch.delenv("JAVA_TOOL_OPTIONS")
        java.JavaGame.open(JAR, "textworld-express:coin", reusable=False).close()
    assert len(caplog.records) == 1


def _jvm_cpu_limit(env: Any) -> str:
    """The soft CPU-time limit of ``env``'s JVM, as /proc shows it (for ``session.call``)."""
    limits = Path(f"/proc/{env.java.process.pid}/limits").read_text().splitlines()
    return next(line for line in limits if line.startswith("Max cpu time")).split()[3]


def test_a_jvm_started_in_a_worker_under_a_cpu_limit_is_not_bound_by_it_for_life():
    """The worker renews its own CPU limit per call; a JVM it starts inherited the limit as it stood, a lifetime
    budget (here 5 s) that a JVM handed from episode to episode used up, then died of SIGXCPU."""
    import asyncio

    from envkit.util.children import ResourceLimits
    from envkit.workers import EnvFactory
    from envkit.workers.processes import ProcessWorkers

    async def limit_of_the_jvm() -> str:
        workers = ProcessWorkers(1, processes=1, limits=ResourceLimits(cpu_s=5))
        try:
            session = await workers.open(EnvFactory("textworld-express:coin"), timeout_s=120)
            await session.reset(0, timeout_s=120)
            return await session.call(_jvm_cpu_limit, timeout_s=30, what="reading the JVM's limits")
        finally:
            workers.close()

    assert asyncio.run(limit_of_the_jvm()) == "unlimited"


def _client_answering(answer: str, monkeypatch: pytest.MonkeyPatch, jvm_exit_code: int | None) -> Any:
    """A gateway client whose JVM (a Python stand-in) answers every call with ``answer``, then exits with
    ``jvm_exit_code`` (``None``: goes on running)."""
    from py4j.java_gateway import GatewayClient, GatewayParameters

    monkeypatch.setattr(GatewayClient, "send_command", lambda self, command, retry=True, binary=False: answer)
    client = java._counting_gateway()(gateway_parameters=GatewayParameters(port=1)).counting_client
    code = "import time; time.sleep(60)" if jvm_exit_code is None else f"import sys; sys.exit({jvm_exit_code})"
    client.java_process = subprocess.Popen([sys.executable, "-c", code])
    return client


def test_a_bare_error_answer_from_a_jvm_exiting_out_of_memory_raises_java_out_of_memory(monkeypatch):
    """The answer the real JVM sometimes gives before it exits (above): deterministic here."""
    client = _client_answering("x", monkeypatch, jvm_exit_code=java.OUT_OF_MEMORY_EXIT)
    with pytest.raises(java.JavaOutOfMemory, match="ran out of memory"):
        client.send_command("c\no0\ntoString\ne\n")
    assert client.calls_in_flight == 0


@pytest.mark.parametrize(("answer", "jvm_exit_code"), [("x", None), ("x", 1), ("ysanswer", java.OUT_OF_MEMORY_EXIT)])
def test_other_answers_are_left_to_py4j(monkeypatch, answer, jvm_exit_code):
    """A bare error from a JVM that goes on (or exits otherwise) is py4j's to raise, and an answer is an answer."""
    client = _client_answering(answer, monkeypatch, jvm_exit_code)
    try:
        assert client.send_command("c\no0\ntoString\ne\n") == answer
    finally:
        client.java_process.kill()
        client.java_process.wait()


def test_a_waiting_jvm_that_no_longer_answers_is_not_handed_on(monkeypatch):
    env = envkit.make("textworld-express:coin")
    game = env.java
    env.close()
    monkeypatch.setattr(java.JavaGame, "answers", lambda self: False)  # as a JVM whose gateway died
    with closing(envkit.make("textworld-express:coin")) as next_env:
        assert next_env.java is not game
    assert not wait_gone([game.process.pid], limit_s=15)


def test_only_an_env_with_the_same_heap_takes_a_waiting_jvm():
    capped = oracle_episode("textworld-express:arithmetic", 0, java_heap="256m")
    default_heap = oracle_episode("textworld-express:arithmetic", 0)
    assert default_heap[2] != capped[2]
    assert oracle_episode("textworld-express:arithmetic", 1, java_heap="256m")[2] == capped[2]
    assert java.end_idle_jvms() == 2 and not wait_gone([capped[2], default_heap[2]], limit_s=15)


def test_waiting_jvms_end_with_the_python_process_that_started_them():
    script = "import envkit; env = envkit.make('textworld-express:coin'); print(env.java.process.pid); env.close()"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert not wait_gone([int(done.stdout.split()[-1])], limit_s=15)


def _takes_nothing_and_leaves_the_parents_jvm(game: java.JavaGame) -> None:
    taken = java._IDLE.take(game.key)
    game.close()  # the parent's: nothing happens in a child
    sys.exit(0 if taken is None else 1)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="no fork on this platform")
def test_a_forked_process_does_not_take_its_parents_waiting_jvm():
    with closing(envkit.make("textworld-express:coin")) as env:
        game = env.java
    child = multiprocessing.get_context("fork").Process(target=_takes_nothing_and_leaves_the_parents_jvm, args=(game,))
    child.start()
    child.join(60)
    assert child.exitcode == 0
    assert java._IDLE.take(game.key) is game and game.answers()  # still the parent's, alive, to hand on
    game.close()


def test_the_jvm_reuse_benchmark_times_both_arms_on_the_same_episodes(tmp_path):
    """``benchmarks/jvm_reuse.py`` at its smallest: each arm in a process of its own, the same commands and scores."""
    out = tmp_path / "jvm_reuse.json"
    argv = ["--specs", "textworld-express:arithmetic", "--episodes", "2", "--repeats", "1", "--out", str(out)]
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "benchmarks/jvm_reuse.py", *argv], cwd=root, check=True, timeout=300)
    figures = json.loads(out.read_text())
    arms = figures["textworld-express:arithmetic"]
    assert figures["same_episodes"] and arms["same_commands_and_scores"] and arms["same_messages"]
    assert all(len(arms[arm]["env_s"]) == 1 and arms[arm]["env_s"][0] > 0 for arm in ("new", "handed-on"))
