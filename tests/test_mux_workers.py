"""Multiplexed env workers: many episodes' envs on few worker processes, each call routed to the worker holding its
env; a hang, a crash or an env exception ends only the episodes hosted on the worker it happened on (counted, the
pool back to its size); a step's bytes do not grow with the episode's history."""

from __future__ import annotations

import asyncio
import os
import pickle
import time

import pytest
from test_process_workers import add_one, alive, wait_until

from envkit.rollout import RolloutEngine, SamplingParams
from envkit.workers import EnvFactory
from envkit.workers.processes import ProcessWorkers, default_workers

PROCESSES = 2


def run(workers, tokenizer, factory, seeds, *, max_turns=3, timeout_s=5.0):
    engine = RolloutEngine(
        factory,
        add_one(tokenizer),
        tokenizer,
        max_turns=max_turns,
        concurrency=len(seeds),
        step_timeout_s=timeout_s,
        env_workers=workers,
    )
    start = time.perf_counter()
    episodes = engine.run(seeds, 1, SamplingParams())
    return episodes, time.perf_counter() - start


def test_default_worker_count_is_bounded_by_cores_and_envs():
    assert default_workers(1024, cores=2) == 4
    assert default_workers(1024, cores=16) == 32
    assert default_workers(3, cores=16) == 3


def steps_at_once(record) -> dict[int, int]:
    """The most steps any moment saw running at once in each worker process, from Faulty's ``record`` file."""
    windows: dict[int, list[tuple[float, int]]] = {}
    for line in record.read_text().splitlines():
        pid, start, end = line.split()
        windows.setdefault(int(pid), []).extend([(float(start), 1), (float(end), -1)])
    peaks = {}
    for pid, edges in windows.items():
        running = peak = 0
        for _, change in sorted(edges, key=lambda edge: (edge[0], edge[1])):  # an end before a start at one instant
            running += change
            peak = max(peak, running)
        peaks[pid] = peak
    return peaks


def test_more_episodes_than_processes_run_at_once_on_few_workers(local_tokenizer, tmp_path):
    workers = ProcessWorkers(12, processes=PROCESSES)
    try:
        # Each step sleeps 0.3 s and records when it ran: a worker that ran its envs' calls one after another would
        # never have two steps running at once, however fast or loaded the machine.
        record = tmp_path / "steps.txt"
        factory = EnvFactory("worker_envs:Faulty", {"delay": 0.3, "record": str(record)})
        run(workers, local_tokenizer, factory, [0, 1], max_turns=1)  # start both processes
        record.unlink()
        episodes, _ = run(workers, local_tokenizer, factory, list(range(12)))
        assert all(e.error is None and e.turns == 3 for e in episodes), [e.error for e in episodes]
        assert len(workers.pids) == PROCESSES and workers.pool.started == PROCESSES
        assert workers.pool.peak_sessions == 12
        hosts = [e.worker["pid"] for e in episodes]
        assert set(hosts) == set(workers.pids) and sorted(hosts.count(pid) for pid in set(hosts)) == [6, 6]
        peaks = steps_at_once(record)
        assert set(peaks) == set(workers.pids) and min(peaks.values()) >= 2, peaks
    finally:
        workers.close()


@pytest.mark.parametrize(
    ("fault", "expected"),
    [("hang", None), ("sigkill", "killed by SIGKILL"), ("exit", "exit code 1"), ("raise", None)],
)
def test_a_fault_ends_only_the_episodes_it_must(local_tokenizer, fault, expected):
    """8 episodes on 2 processes (4 each); seed 1's first step misbehaves while the others on its worker are mid-
    episode (each step sleeps 1 s, 3 steps; a hang is found at 2.5 s). A hang or an env error ends its own episode
    only (a hung worker is retired: replaced at once, killed once its other episodes end); a worker that dies ends
    the episodes it hosted, and only those."""
    workers = ProcessWorkers(8, processes=PROCESSES)
    try:
        factory = EnvFactory("worker_envs:Faulty", {"delay": 1.0, "faults": {1: fault}})
        episodes, _ = run(workers, local_tokenizer, factory, list(range(8)), timeout_s=2.5)
        assert len(episodes) == 8
        faulty = episodes[1]
        host = faulty.worker["pid"]
        neighbours = [e for e in episodes if e.worker["pid"] == host and e is not faulty]
        others = [e for e in episodes if e.worker["pid"] != host]
        assert len(neighbours) == 3 and len(others) == 4
        assert all(e.error is None and e.turns == 3 for e in others), [e.error for e in others]
        if fault == "raise":  # the env's own error: its episode only; the worker serves on
            assert faulty.error == "ValueError: step failed on seed 1"
            assert all(e.error is None for e in neighbours), [e.error for e in neighbours]
            assert workers.pool.replaced == 0
            assert alive(host) and host in workers.pids
            return
        if fault == "hang":
            assert faulty.finish_reason == "timeout" and "took longer than 2.5s" in faulty.error
            assert all(e.error is None and e.turns == 3 for e in neighbours), [e.error for e in neighbours]
            assert workers.pool.timeouts == 1 and workers.pool.lost_sessions == 0
        else:
            assert faulty.error.startswith(f"EnvWorkerLost: env worker process {host} died during step()")
            assert expected in faulty.error
            for episode in neighbours:  # mid-step when the worker went: each told why
                assert episode.error.startswith(f"EnvWorkerLost: env worker process {host} "), episode.error
                assert expected in episode.error, episode.error
            assert workers.pool.lost_sessions == 4  # the faulty episode and its three neighbours
        assert workers.pool.replaced == 1
        assert wait_until(lambda: len(workers.pids) == PROCESSES and all(alive(p) for p in workers.pids))
        assert wait_until(lambda: not alive(host)) and host not in workers.pids and workers.pool.retiring == []
    finally:
        workers.close()


def test_a_second_hang_on_a_retired_worker_kills_it_and_ends_its_episodes(local_tokenizer):
    """Two hangs on one worker: the first retires it, the second (its other episode) kills it at once; the episodes
    on the other worker never notice."""
    workers = ProcessWorkers(4, processes=PROCESSES)
    try:
        factory = EnvFactory("worker_envs:Faulty", {"delay": 0.5, "faults": {0: "hang", 2: "hang"}})
        episodes, _ = run(workers, local_tokenizer, factory, [0, 1, 2, 3], timeout_s=2.0)
        hosts = {e.task_seed: e.worker["pid"] for e in episodes}
        if hosts[0] != hosts[2]:
            pytest.skip(f"the two hanging episodes were placed on different workers: {hosts}")
        assert [e.finish_reason for e in (episodes[0], episodes[2])] == ["timeout", "timeout"]
        assert all(e.error is None for e in episodes if hosts[e.task_seed] != hosts[0])
        assert workers.pool.timeouts == 2
        assert wait_until(lambda: not alive(hosts[0]))
    finally:
        workers.close()


async def _step_many(factory, steps):
    workers = ProcessWorkers(1, processes=1)
    try:
        session = await workers.open(factory, timeout_s=30)
        await session.reset(0, timeout_s=30)
        received, outcomes = [], []
        for _ in range(steps):
            call = {"type": "function", "function": {"name": "add", "arguments": {"amount": 1}}}
            outcome = await session.step({"role": "assistant", "content": "", "tool_calls": [call]}, timeout_s=30)
            received.append(session.bytes_received)
            outcomes.append(outcome)
        transcript = await session.transcript(timeout_s=30)
        session.close()
        return received, outcomes, transcript
    finally:
        workers.close()


def test_a_steps_bytes_do_not_grow_with_the_history():
    received, outcomes, transcript = asyncio.run(_step_many(EnvFactory("worker_envs:LongCounter"), 200))
    last = outcomes[-1]
    assert last.history + last.observation == transcript  # the engine's copy of the transcript is the env's
    assert len(last.history) == 2 + 2 * 199 + 1
    early, late = max(received[:10]), max(received[-10:])
    assert late <= early + 8, (early, late)  # "total is now 200" is two characters longer than "total is now 1"
    whole = len(pickle.dumps(last.history, protocol=pickle.HIGHEST_PROTOCOL))
    assert whole > 20 * late  # what sending the transcript each step would cost by turn 200


def test_an_env_that_rewrites_its_history_is_mirrored_exactly():
    _, outcomes, transcript = asyncio.run(_step_many(EnvFactory("worker_envs:Forgetful"), 12))
    last = outcomes[-1]
    assert last.history + last.observation == transcript and len(transcript) <= 8


# No import circle among the worker modules: tests/test_layout.py checks every envkit module.


@pytest.mark.slow
def test_1024_concurrent_episodes_on_at_most_two_processes_per_core(local_tokenizer):
    """The issue's scale target, short episodes: 1,024 episodes alive at once on ``default_workers`` processes
    (4 on this 2-core machine), nothing lost."""
    workers = ProcessWorkers(1024)
    try:
        factory = EnvFactory("worker_envs:LongCounter")
        # A generous deadline: on the shared 2-core machine (load 20 seen) a step queued behind 255 others on its
        # worker can take seconds; what this test checks is scale and that nothing is lost.
        episodes, _ = run(workers, local_tokenizer, factory, list(range(1024)), timeout_s=120.0)
        assert len(episodes) == 1024 and all(e.error is None and e.turns == 3 for e in episodes), {
            e.error for e in episodes
        }
        assert workers.pool.peak_sessions == 1024
        assert len(workers.pids) == workers.pool.started == default_workers(1024) <= max(4, 2 * (os.cpu_count() or 1))
    finally:
        workers.close()


def test_sessions_open_across_close_give_back_no_slot_twice():
    """close() gives every slot back; a session that ends after it must not give its slot back again, or the reused
    pool would host more envs at once than ``concurrency``."""
    workers = ProcessWorkers(3, processes=2)
    factory = EnvFactory("worker_envs:CounterEnv")

    async def across_close() -> None:
        held = [await workers.open(factory, timeout_s=60) for _ in range(3)]
        workers.close()  # a shutdown while episodes still hold their sessions
        for session in held:
            session.close()  # the episodes' own clean-up, afterwards
        assert workers.pool.sessions == 0
        reopened = [await workers.open(factory, timeout_s=60) for _ in range(3)]
        assert workers.pool.sessions == 3
        with pytest.raises(asyncio.TimeoutError):  # a fourth env waits for a slot
            await asyncio.wait_for(workers.open(factory, timeout_s=60), 2)
        for session in reopened:
            session.close()
        assert workers.pool.sessions == 0

    try:
        asyncio.run(across_close())
    finally:
        workers.close()


def test_an_env_still_being_built_when_its_open_is_cancelled_is_closed_once_built(tmp_path):
    """A cancelled open sends close at once; the worker gets it while the constructor still runs (on another thread),
    and used to register the env afterwards, never closed, its slot already given back."""
    from worker_envs import others_built

    workers = ProcessWorkers(2, processes=1)
    started, built = tmp_path / "started", tmp_path / "built"

    async def cancel_mid_construction() -> int:
        slow = EnvFactory("worker_envs:SlowToBuild", {"build_s": 1.0, "markers": str(tmp_path)})
        opening = asyncio.ensure_future(workers.open(slow, timeout_s=60))
        while not started.exists():
            await asyncio.sleep(0.02)
        opening.cancel()  # the worker is building it
        await asyncio.gather(opening, return_exceptions=True)
        while not built.exists():
            await asyncio.sleep(0.02)
        probe = await workers.open(EnvFactory("worker_envs:SlowToBuild"), timeout_s=60)
        try:  # the cancelled env's open has returned: it ran before the probe's call (one worker, its requests)
            await asyncio.sleep(0.5)
            return await probe.call(others_built, timeout_s=10, what="counting envs")
        finally:
            probe.close()

    try:
        assert asyncio.run(cancel_mid_construction()) == 0
    finally:
        workers.close()


def test_a_close_that_runs_before_its_open_closes_the_env_the_open_builds():
    """Each request runs on a thread of its own in the worker: the close a cancelled open sends can run first."""
    import pickle

    from worker_envs import BUILT

    from envkit.workers.host import EnvHost, unpack_reply

    host = EnvHost()

    def request(session: int, op: str, argument=None):
        return unpack_reply(host.serve(pickle.dumps((session, op, argument))))

    before = set(BUILT)
    request(7, "close")
    request(7, "open", EnvFactory("worker_envs:SlowToBuild"))
    assert host.sessions == {} and set(BUILT) == before  # built, then closed at once
    request(8, "open", EnvFactory("worker_envs:SlowToBuild"))
    assert list(host.sessions) == [8]  # a later session is unaffected
    request(8, "close")
    assert host.sessions == {} and set(BUILT) == before


def test_a_worker_found_dead_when_placing_a_session_counts_the_sessions_it_hosted_as_lost():
    """Placement finds a worker dead before its death is reported (its reader thread then discards it): its
    sessions are lost either way, and counted once, whichever sees the death first."""
    from envkit.workers.pool import MuxPool

    class Worker:
        alive = True

    pool = MuxPool(2, 4, start=Worker, kill=lambda worker: None, healthy=lambda worker: worker.alive)

    async def place_after_a_death() -> None:
        first = await pool.acquire()
        await pool.acquire()  # spread first: the second worker
        first.alive = False  # dies hosting one session, not yet reported
        assert await pool.acquire() is not first
        assert (pool.lost_sessions, pool.replaced) == (1, 1)
        pool.discard(first, "died")  # the report of its death, afterwards
        assert (pool.lost_sessions, pool.replaced) == (1, 1)

    try:
        asyncio.run(place_after_a_death())
    finally:
        pool.close()
