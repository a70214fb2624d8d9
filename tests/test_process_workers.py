"""Env workers in processes: token-exact with threads, and every fault (a hang, a crash, a kill from outside, an env
exception) stays in its episode, the pool keeps its size, and no worker process outlives its pool or its parent."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers import CheckedOracleBackend

from envkit.backends import ScriptedBackend
from envkit.cli.app import main
from envkit.rollout import RolloutEngine, SamplingParams
from envkit.util.install import install_command
from envkit.workers import EnvFactory, EnvWorkerLost
from envkit.workers.inherit import THREADING_PREFIXES
from envkit.workers.processes import ProcessWorkers

TESTS = Path(__file__).parent
CONCURRENCY = 3
# Only a hung step may reach it: every call of an episode is timed against it, and the run's first rendering call
# builds the renderer (probing the template: 2.5-4.2 s at load 19 on 2 cores). A hung step costs this much.
TIMEOUT_S = 10.0
MAX_TURNS = 3


@pytest.fixture(scope="module")
def workers():
    """One pool for the module: reused across runs, as a trainer reuses it across steps."""
    pool = ProcessWorkers(CONCURRENCY)
    yield pool
    pool.close()


def add_one(tokenizer) -> ScriptedBackend:
    """A backend that always calls ``add(1)``: every episode runs ``MAX_TURNS`` steps."""
    return ScriptedBackend(
        '<tool_call>{"name": "add", "arguments": {"amount": 1}}</tool_call><|im_end|>', tokenizer=tokenizer
    )


def run(workers, tokenizer, factory, seeds, *, timeout_s=TIMEOUT_S, backend=None, group_size=1):
    engine = RolloutEngine(
        factory,
        backend or add_one(tokenizer),
        tokenizer,
        max_turns=MAX_TURNS,
        concurrency=CONCURRENCY,
        step_timeout_s=timeout_s,
        env_workers=workers,
    )
    start = time.perf_counter()
    episodes = engine.run(seeds, group_size, SamplingParams())
    return episodes, time.perf_counter() - start


def wait_until(condition, timeout=60.0):  # a cap: process start-up takes seconds on a loaded machine
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def full_pool(workers):
    return len(workers.pids) == CONCURRENCY and all(alive(pid) for pid in workers.pids)


def scripted(factory, tokenizer, seeds):
    return CheckedOracleBackend(factory, tokenizer, seeds)


def comparable(episode):
    data = episode.to_dict()
    data.pop("timings")
    data["info"].pop("pid")
    data.pop("worker")
    return data


def test_episodes_on_processes_are_token_exact_equal_to_threads(workers, local_tokenizer):
    factory = EnvFactory("worker_envs:WhoAmI")
    seeds = [0, 1, 2, 3]
    threaded, _ = run("threads", local_tokenizer, factory, seeds, backend=scripted(factory, local_tokenizer, seeds))
    remote, _ = run(workers, local_tokenizer, factory, seeds, backend=scripted(factory, local_tokenizer, seeds))
    assert all(e.error is None and e.score == 1.0 and e.finish_reason == "done" for e in remote), remote
    assert [comparable(e) for e in remote] == [comparable(e) for e in threaded]
    assert {e.info["pid"] for e in threaded} == {os.getpid()}
    assert os.getpid() not in {e.info["pid"] for e in remote}
    assert {e.info["pid"] for e in remote} <= set(workers.pids)


def test_a_hung_step_times_out_only_its_episode_and_the_pool_keeps_its_size(workers, local_tokenizer):
    wait_until(lambda: full_pool(workers), timeout=20)  # warm: process start-up is not what this measures
    before = set(workers.pids)
    seeds = list(range(6))
    episodes, seconds = run(workers, local_tokenizer, EnvFactory("worker_envs:Faulty", {"seeds": [1]}), seeds)
    assert len(episodes) == 6
    hung = episodes[1]
    assert hung.finish_reason == "timeout" and hung.error.startswith(f"env step took longer than {TIMEOUT_S:g}s"), hung
    assert all(e.error is None and e.finish_reason == "max_turns" for e in episodes if e is not hung)
    # The documented bound: ceil(episodes / processes) episode lifetimes of (max_turns + 3) deadlines each.
    assert seconds < math.ceil(6 / CONCURRENCY) * (MAX_TURNS + 3) * TIMEOUT_S, seconds
    assert wait_until(lambda: full_pool(workers)), workers.pids  # the killed process was replaced
    killed = before - set(workers.pids)
    assert len(killed) == 1 and not any(alive(pid) for pid in killed)


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("exit", "died during step() (exit code 1)"),
        ("sigkill", "died during step() (killed by SIGKILL)"),
        ("raise", "ValueError: step failed on seed 2"),
        ("odd-error", "RemoteEnvError: OddError: odd failure on seed 2 (no pickle)"),
    ],
)
def test_a_crash_or_an_env_exception_ends_only_its_episode(workers, local_tokenizer, fault, expected):
    factory = EnvFactory("worker_envs:Faulty", {"fault": fault, "seeds": [2]})
    episodes, _ = run(workers, local_tokenizer, factory, [1, 2, 3])
    failed = episodes[1]
    assert failed.finish_reason == "error" and expected in failed.error, failed.error
    if fault in ("exit", "sigkill"):
        assert failed.error.startswith("EnvWorkerLost: env worker process ")
    assert all(e.error is None and e.turns == MAX_TURNS for e in (episodes[0], episodes[2]))
    assert wait_until(lambda: full_pool(workers)), workers.pids


def test_a_worker_killed_from_outside_mid_run_fails_only_its_episode(workers, local_tokenizer):
    wait_until(lambda: full_pool(workers))
    killed: list[int] = []

    def kill_one():
        wait_until(lambda: len(workers.pool.leased) == CONCURRENCY, timeout=10)
        time.sleep(0.5)  # mid-episode: each step sleeps 0.4 s
        pid = workers.pool.leased[0].pid
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)

    killer = threading.Thread(target=kill_one)
    killer.start()
    episodes, _ = run(
        workers, local_tokenizer, EnvFactory("worker_envs:Faulty", {"delay": 0.4}), list(range(6)), timeout_s=10
    )
    killer.join()
    assert len(episodes) == 6 and killed
    failed = [e for e in episodes if e.error is not None]
    assert len(failed) == 1, [e.error for e in episodes]
    assert failed[0].error.startswith(f"EnvWorkerLost: env worker process {killed[0]} died during ")
    assert "killed by SIGKILL" in failed[0].error
    assert all(e.turns == MAX_TURNS for e in episodes if e.error is None)
    assert wait_until(lambda: full_pool(workers)), workers.pids


def test_a_worker_that_dies_on_its_own_takes_what_its_env_started_with_it():
    """A worker leads a process group: when it crashes (no close() runs), the helper its env started goes too."""
    import asyncio

    from worker_envs import StartsAHelper

    async def crash() -> int:
        pool = ProcessWorkers(1, processes=1)
        try:
            session = await pool.open(StartsAHelper, timeout_s=60)
            _, info, _ = await session.reset(0, timeout_s=60)
            assert alive(info["helper"])
            with pytest.raises(EnvWorkerLost, match=r"died during step\(\) \(exit code 1\)"):
                await session.step({"role": "assistant", "content": "go"}, timeout_s=60)
            return info["helper"]
        finally:
            pool.close()

    helper = asyncio.run(crash())
    assert wait_until(lambda: not alive(helper), timeout=10), f"helper {helper} outlived its crashed worker"


def test_what_an_env_starts_in_a_worker_still_answers_sigint():
    """The worker ignores Ctrl-C (its parent ends it), but the processes its env starts keep SIGINT's default."""
    import asyncio

    from worker_envs import StartsAHelper

    async def interrupt_the_helper() -> int:
        pool = ProcessWorkers(1, processes=1)
        try:
            session = await pool.open(StartsAHelper, timeout_s=60)
            _, info, _ = await session.reset(0, timeout_s=60)
            os.kill(info["helper"], signal.SIGINT)
            ended = wait_until(lambda: not alive(info["helper"]), timeout=10)
            assert ended, "the env's helper ignored SIGINT"
            return info["helper"]
        finally:
            pool.close()

    asyncio.run(interrupt_the_helper())


def test_an_exception_only_the_worker_can_import_keeps_its_name_message_and_traceback(tmp_path):
    """An env loaded from a file path defines its module in the worker only: its own exception class cannot be
    rebuilt here, and used to come back as an error about reading the reply."""
    import asyncio

    from envkit.workers.host import RemoteEnvError

    (tmp_path / "game.py").write_text(
        textwrap.dedent(
            """
            import envkit

            class IllegalMove(Exception):
                pass

            class Game(envkit.ToolEnv):
                def reset(self, *, seed=None, options=None):
                    super().reset(seed=seed, options=options)
                    return [{"role": "user", "content": "move"}], {}

                def on_text(self, message):
                    raise IllegalMove("e2-e5 is not a legal move for a pawn")

                def score(self):
                    return 0.0
            """
        )
    )

    async def illegal_move() -> None:
        pool = ProcessWorkers(1, processes=1)
        try:
            session = await pool.open(EnvFactory(f"{tmp_path / 'game.py'}:Game"), timeout_s=60)
            await session.reset(0, timeout_s=60)
            await session.step({"role": "assistant", "content": "e2-e5"}, timeout_s=60)
        finally:
            pool.close()

    with pytest.raises(RemoteEnvError, match=r"^IllegalMove: e2-e5 is not a legal move for a pawn$") as caught:
        asyncio.run(illegal_move())
    assert caught.value.remote_traceback.rstrip().endswith("IllegalMove: e2-e5 is not a legal move for a pawn")


def test_a_lambda_factory_fails_at_engine_construction_in_one_line(local_tokenizer):
    with pytest.raises(ValueError) as caught:
        RolloutEngine(lambda: None, add_one(local_tokenizer), local_tokenizer, env_workers="processes")
    assert str(caught.value) == (
        "env_workers='processes' builds envs in other processes from a picklable factory: pass "
        "envkit.workers.EnvFactory('SPEC', {...config}) (or functools.partial(envkit.make, 'SPEC', **config)); "
        "got <lambda>"
    )


def test_open_refuses_an_unpicklable_factory_and_a_closed_pool_fails_its_waiters():
    import asyncio

    pool = ProcessWorkers(1)
    with pytest.raises(ValueError, match="picklable factory"):
        asyncio.run(pool.open(lambda: None, timeout_s=5))

    async def wait_then_close():
        waiter = asyncio.ensure_future(pool.pool.acquire())
        await asyncio.sleep(0)
        pool.close()
        return await waiter

    with pytest.raises(EnvWorkerLost, match="closed"):
        asyncio.run(wait_then_close())
    assert wait_until(lambda: not [p for p in psutil.Process().children(recursive=True) if p.pid in pool.pids])


def test_workers_see_the_environment_variables_of_the_moment_they_start(monkeypatch):
    """A forked worker's environment is the fork server's, frozen when the first pool of the process started it: a
    variable set (or removed) after that must still reach (or leave) the next workers, as it would a spawned one."""
    import asyncio

    from worker_envs import Environ

    async def environ_of_a_new_worker() -> dict[str, str]:
        pool = ProcessWorkers(1, processes=1)
        try:
            session = await pool.open(Environ, timeout_s=60)
            _, info, _ = await session.reset(0, timeout_s=60)
            return info["environ"]
        finally:
            pool.close()

    monkeypatch.setenv("ENVKIT_TEST_BEFORE", "kept until removed")
    assert asyncio.run(environ_of_a_new_worker()) == {"ENVKIT_TEST_BEFORE": "kept until removed"}  # server started
    monkeypatch.delenv("ENVKIT_TEST_BEFORE")
    monkeypatch.setenv("ENVKIT_TEST_AFTER", "set once the fork server ran")
    assert asyncio.run(environ_of_a_new_worker()) == {"ENVKIT_TEST_AFTER": "set once the fork server ran"}


@pytest.mark.parametrize("start_method", ["forkserver", "spawn"])
def test_workers_take_the_parents_process_state_of_the_moment_they_start(start_method):
    """umask, resource limits, CPU affinity, niceness and OMP_NUM_THREADS changed by the parent after its first pool
    started (and with it the fork server) reach the next workers, as they reach a spawned one: torch's thread count
    too, which the fork server's torch fixed as it loaded (tests/parent_state_script.py, a process of its own: it
    raises its niceness for good)."""
    script = Path(__file__).with_name("parent_state_script.py")
    # Started without threading settings of its own, so its first workers' torch takes every CPU (a CI machine that
    # sets OMP_NUM_THREADS=1 would otherwise give the same count before and after the change).
    environment = {k: v for k, v in os.environ.items() if not k.startswith(THREADING_PREFIXES)}
    done = subprocess.run(
        [sys.executable, str(script), start_method],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=script.parent,
        env=environment,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    states = json.loads(done.stdout.splitlines()[-1])
    assert states["second"] == states["parent"]
    assert states["first"]["umask"] != states["parent"]["umask"]  # what the check tells apart
    assert states["first"]["niceness"] != states["parent"]["niceness"]
    if len(os.sched_getaffinity(0)) > 1:  # one CPU, and torch chooses one thread either way
        assert states["first"]["torch_threads"] != states["parent"]["torch_threads"]


def test_a_hanging_threads_question_keeps_the_servers_count_well_inside_the_start_timeout(tmp_path, monkeypatch):
    """The fresh interpreter a forked worker asks for torch's thread count may hang (a broken site hook, a stuck
    filesystem): past its timeout the worker keeps the fork server's count and goes on starting; a timeout as long as
    the start's own would fail the start instead."""
    import torch

    from envkit.workers.inherit import THREADS_QUESTION_TIMEOUT_S, ParentState, match_torch_threads
    from envkit.workers.pool import START_TIMEOUT_S

    assert THREADS_QUESTION_TIMEOUT_S <= START_TIMEOUT_S / 2
    hangs = tmp_path / "python"
    hangs.write_text("#!/bin/sh\nexec sleep 600\n")
    hangs.chmod(0o755)
    server = ParentState.capture()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # settings that differ from the server's: the question is asked
    monkeypatch.setattr(sys, "executable", str(hangs))
    before = torch.get_num_threads()
    started = time.monotonic()
    match_torch_threads(server, timeout_s=1.0)
    assert time.monotonic() - started < 30
    assert torch.get_num_threads() == before


def test_every_worker_draws_other_numbers_from_the_global_generators():
    """Forked workers inherit the fork server's generators: without a fresh seed each, every worker of every pool
    drew the same numpy and torch "random" numbers."""
    import asyncio

    from worker_envs import global_draws

    async def draws_of_two_pools() -> list[tuple[int, int, int]]:
        draws = []
        for _ in range(2):
            pool = ProcessWorkers(2, processes=2)
            try:
                sessions = [await pool.open(EnvFactory("worker_envs:CounterEnv"), timeout_s=60) for _ in range(2)]
                assert len({s.placement["pid"] for s in sessions}) == 2
                draws += [await s.call(global_draws, timeout_s=30, what="drawing") for s in sessions]
            finally:
                pool.close()
        return draws

    draws = asyncio.run(draws_of_two_pools())
    for generator in range(3):  # random, numpy, torch
        assert len({d[generator] for d in draws}) == 4, (generator, draws)


def test_close_ends_every_worker_process(local_tokenizer):
    pool = ProcessWorkers(2)
    episodes, _ = run(pool, local_tokenizer, EnvFactory("worker_envs:CounterEnv"), [0, 1, 2], timeout_s=30)
    assert all(e.error is None for e in episodes)
    pids = pool.pids
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    pool.close()
    assert wait_until(lambda: not any(alive(pid) for pid in pids), timeout=10)
    assert pool.pids == []


ORPHANS = textwrap.dedent(
    """
    import asyncio, json, sys, threading, time
    sys.path.insert(0, {tests!r})
    import psutil
    from envkit.workers.processes import ProcessWorkers
    from envkit.workers import EnvFactory

    hanging = threading.Event()


    async def hang(workers):
        hung = await workers.open(EnvFactory("worker_envs:Faulty", {{"seeds": [1]}}), timeout_s=60)
        idle = await workers.open(EnvFactory("worker_envs:CounterEnv"), timeout_s=60)
        await hung.reset(1, timeout_s=60)
        step = asyncio.ensure_future(hung.step({{"role": "assistant", "content": "hi"}}, timeout_s=600))
        await asyncio.sleep(1.0)  # the env now hangs in its step
        hanging.set()
        await step


    if __name__ == "__main__":
        start = time.perf_counter()
        workers = ProcessWorkers(2)
        threading.Thread(target=asyncio.run, args=(hang(workers),), daemon=True).start()
        hanging.wait()
        print(json.dumps([p.pid for p in psutil.Process().children(recursive=True)]), flush=True)
        print(f"{{time.perf_counter() - start:.2f}}s", file=sys.stderr)
        if {mode!r} == "exit":
            sys.exit(0)  # interpreter exit with a call hung in a worker: atexit ends the workers
        time.sleep(3600)  # killed by the test: each worker sees its lifeline pipe close
    """
)


def test_no_worker_process_outlives_its_parent(tmp_path):
    """At interpreter exit (atexit) and when the parent is SIGKILLed (each worker watches a pipe to its parent), with
    one worker hung in a step: every process the parent started (workers, fork server) is gone. Both run at once."""
    processes = {}
    for mode in ("exit", "sigkill"):
        script = tmp_path / f"orphans_{mode}.py"
        script.write_text(ORPHANS.format(tests=str(TESTS), mode=mode))
        processes[mode] = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    children = []
    try:
        for mode, process in processes.items():
            line = process.stdout.readline()
            assert line, f"the {mode} script printed nothing"
            started = json.loads(line)
            assert len(started) >= 2, started  # two workers (and the fork server)
            children += started
            if mode == "sigkill":
                os.kill(process.pid, signal.SIGKILL)
        for process in processes.values():
            process.wait(timeout=30)
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
    assert processes["exit"].returncode == 0
    assert wait_until(lambda: not any(alive(pid) for pid in children), timeout=15), [
        pid for pid in children if alive(pid)
    ]


def test_eval_cli_on_process_workers(tiny_model_dir, capsys):
    code = main(
        [
            "eval",
            "guess-number",
            "--model",
            str(tiny_model_dir),
            "--tasks",
            "2",
            "--samples",
            "2",
            "--max-new-tokens",
            "8",
            "--max-turns",
            "2",
            "--env-workers",
            "processes",
            "--concurrency",
            "2",
            "--json",
        ]
    )
    assert code == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["episodes"] == 4 and metrics["error_rate"] == 0.0 and metrics["mean_turns"] == 2.0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--env-workers", "fibers"], "--env-workers must be one of threads, processes, ray; got 'fibers'"),
        (["--env-workers", "processes", "--ray-address", "auto"], "--ray-address goes with --env-workers ray"),
    ],
)
def test_eval_cli_refuses_bad_env_workers_in_one_line(flags, message, capsys):
    assert main(["eval", "guess-number", "--model", "/no/such/model", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_eval_cli_without_ray_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert main(["eval", "guess-number", "--model", "/no/such/model", "--env-workers", "ray"]) == 2
    err = capsys.readouterr().err
    assert install_command("ray") in err and err.count("\n") == 1


def test_train_cli_on_process_workers(tiny_model_dir, tmp_path):
    out = tmp_path / "run"
    flags = ["--max-steps", "1", "--rl-max-new-tokens", "8", "--max-turns", "2", "--per-device-train-batch-size", "4"]
    flags += ["--rl-num-generations", "2", "--train-tasks", "4", "--eval-tasks", "2", "--concurrency", "2"]
    argv = ["train", "--env", "guess-number", "--model", str(tiny_model_dir), "--output-dir", str(out), *flags]
    assert main([*argv, "--env-workers", "processes"]) == 0
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["train_steps"] == 1 and summary["before"]["error_rate"] == 0.0


def test_train_cli_refuses_an_unknown_env_workers_kind_in_one_line(tiny_model_dir, capsys):
    argv = ["train", "--env", "guess-number", "--model", str(tiny_model_dir), "--env-workers", "fibers"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--env-workers must be one of threads, processes, ray; got 'fibers'" in err and err.count("\n") == 1


def test_a_worker_that_fails_to_start_leaves_no_descriptor_open():
    """Each failed start (here: past a start deadline it cannot meet) used to keep its pipe's and lifeline's ends."""
    import asyncio

    def descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def fail_to_start(times: int) -> None:
        for _ in range(times):
            pool = ProcessWorkers(1, processes=1, start_timeout_s=0.001)
            try:
                with pytest.raises(EnvWorkerLost, match=r"did not start within 0\.001s"):
                    await pool.open(EnvFactory("worker_envs:CounterEnv"), timeout_s=60)
            finally:
                pool.close()

    asyncio.run(fail_to_start(1))  # the fork server and the event loop's own descriptors, once
    before = descriptors()
    asyncio.run(fail_to_start(5))
    assert wait_until(lambda: descriptors() <= before, timeout=10), (before, descriptors())
