"""ThreadWorkers: reused daemon threads, deadlines from the call, and capacity kept when a call hangs."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from helpers import RELEASE_CAP_S

from envkit.workers import EnvTimeout, ThreadWorkers


def test_threads_are_reused_across_calls():
    workers = ThreadWorkers(4)
    threads: set[threading.Thread] = set()  # the objects, not their idents (the OS reuses those)
    before = set(threading.enumerate())  # idle threads of the process-wide pool may serve these calls too

    async def main():
        for _ in range(50):
            await workers.call(lambda: threads.add(threading.current_thread()), timeout_s=5)

    asyncio.run(main())
    assert len(threads - before) <= 1  # one call at a time: at most one new thread serves them all


def test_a_hung_call_times_out_and_capacity_is_kept():
    workers = ThreadWorkers(2)
    release = threading.Event()

    # Two calls that can only return together (a barrier for two): one after the other, the first waits for ever.
    together = threading.Barrier(2, timeout=RELEASE_CAP_S / 2)

    async def main():
        with pytest.raises(EnvTimeout):
            await workers.call(release.wait, timeout_s=0.2)  # only a blocked call passes any deadline
        with pytest.raises(EnvTimeout):
            await workers.call(release.wait, timeout_s=0.2)
        # Both slots' threads are still blocked, yet two calls run at once: new threads took their places.
        return await asyncio.gather(*(workers.call(together.wait, timeout_s=RELEASE_CAP_S) for _ in range(2)))

    try:
        arrivals = asyncio.run(main())
    finally:
        release.set()
    assert workers.abandoned == 2
    assert sorted(arrivals) == [0, 1]  # both were inside the barrier at once


def test_an_exception_comes_back_to_the_caller_and_the_thread_serves_the_next_call():
    workers = ThreadWorkers(1)

    async def main():
        with pytest.raises(KeyError, match="missing"):
            await workers.call(lambda: {}["missing"], timeout_s=5)
        return await workers.call(lambda: 42, timeout_s=5)

    assert asyncio.run(main()) == 42


def test_a_long_queue_of_healthy_calls_is_load_not_a_timeout():
    # 24 calls of 0.2 s on 2 workers with a 2 s timeout: the last waits ~2.2 s for a slot. Waiting behind healthy
    # calls is not the env's fault, so none of them times out (each runs in a tenth of its timeout: a loaded machine
    # does not stretch a 0.2 s sleep to 2 s).
    workers = ThreadWorkers(2)

    async def main():
        return await asyncio.gather(
            *(workers.call(time.sleep, 0.2, timeout_s=2.0) for _ in range(24)), return_exceptions=True
        )

    outcomes = asyncio.run(main())
    assert [o for o in outcomes if isinstance(o, BaseException)] == []


def test_calls_queued_behind_hung_calls_are_given_up_and_say_why():
    # Both workers hang; the queued calls are not left to wait a timeout per round: once they have waited their
    # timeout while every worker is stuck, they fail, with a message that names the queue. Counted, not timed: four
    # rounds of hung calls would start all 8 on a thread; the first two rounds at most do (every call blocks until
    # the test releases it, so the timeout only decides when each gives up).
    workers = ThreadWorkers(2)
    release = threading.Event()

    async def main():
        return await asyncio.gather(
            *(workers.call(release.wait, timeout_s=0.4) for _ in range(8)), return_exceptions=True
        )

    try:
        outcomes = asyncio.run(main())
    finally:
        release.set()
    assert all(isinstance(o, EnvTimeout) for o in outcomes), outcomes
    queued = [o for o in outcomes if o.detail]
    assert queued and all("waited" in o.detail and "stuck" in o.detail for o in queued)
    assert workers.abandoned <= 2 * 2 and workers.abandoned + len(queued) == 8


def test_slow_but_healthy_calls_are_not_a_jam():
    # Each call takes 1.2 s of a 2 s timeout, more than half: the pool's workers are slow, not stuck, since calls
    # keep finishing. The last of 6 calls on 2 workers waits ~2.4 s for its slot, and still none times out. (0.8 s
    # to spare per call: a loaded machine wakes a sleeping thread within milliseconds.)
    workers = ThreadWorkers(2)

    async def main():
        return await asyncio.gather(
            *(workers.call(time.sleep, 1.2, timeout_s=2.0) for _ in range(6)), return_exceptions=True
        )

    assert [o for o in asyncio.run(main()) if isinstance(o, BaseException)] == []


def test_a_timeout_error_the_env_raises_itself_is_its_own_error_not_the_deadline():
    workers = ThreadWorkers(1)

    def fetch():
        raise TimeoutError("socket read timed out")

    async def main():
        return await asyncio.gather(workers.call(fetch, timeout_s=5), return_exceptions=True)

    (outcome,) = asyncio.run(main())
    assert type(outcome) is TimeoutError and str(outcome) == "socket read timed out"


def test_a_pool_that_fails_to_start_is_one_line_for_every_command(monkeypatch):
    # envkit eval and envkit train both turn this ValueError into their one-line usage error.
    import envkit.workers.kinds as kinds

    def no_cluster(kind, **options):
        raise ConnectionError("Could not connect to a Ray cluster at 10.0.0.9:6379\n(long traceback follows)")

    monkeypatch.setattr(kinds, "make_workers", no_cluster)
    with pytest.raises(ValueError) as raised:
        kinds.workers_from_flags("ray", 4, "10.0.0.9:6379")
    assert str(raised.value) == (
        "--env-workers ray: ConnectionError: Could not connect to a Ray cluster at 10.0.0.9:6379"
    )
