"""ThreadWorkers: reused daemon threads, deadlines from the call, and capacity kept when a call hangs."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from envkit.workers import EnvTimeout, ThreadWorkers


def test_threads_are_reused_across_calls():
    workers = ThreadWorkers(4)
    threads: set[threading.Thread] = set()  # the objects, not their idents (the OS reuses those)

    async def main():
        for _ in range(50):
            await workers.call(lambda: threads.add(threading.current_thread()), timeout_s=5)

    asyncio.run(main())
    assert len(threads) == 1  # one call at a time: one thread serves them all


def test_a_hung_call_times_out_and_capacity_is_kept():
    workers = ThreadWorkers(2)
    release = threading.Event()

    async def main():
        with pytest.raises(EnvTimeout):
            await workers.call(release.wait, timeout_s=0.2)
        with pytest.raises(EnvTimeout):
            await workers.call(release.wait, timeout_s=0.2)
        # Both slots' threads are still blocked, yet two calls run at once: new threads took their places.
        started = time.perf_counter()
        await asyncio.gather(*(workers.call(time.sleep, 0.3, timeout_s=5) for _ in range(2)))
        return time.perf_counter() - started

    try:
        elapsed = asyncio.run(main())
    finally:
        release.set()
    assert workers.abandoned == 2
    assert elapsed < 0.55  # two 0.3 s calls side by side, not one after the other


def test_an_exception_comes_back_to_the_caller_and_the_thread_serves_the_next_call():
    workers = ThreadWorkers(1)

    async def main():
        with pytest.raises(KeyError, match="missing"):
            await workers.call(lambda: {}["missing"], timeout_s=5)
        return await workers.call(lambda: 42, timeout_s=5)

    assert asyncio.run(main()) == 42
