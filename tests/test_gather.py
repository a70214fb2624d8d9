"""The micro-batcher waits for env calls that keep finishing (each within ``gather_s`` of the last), so a batch is
not split because the envs before it took longer in all than ``gather_s`` (instant tools, many episodes); a quiet
``gather_s`` (a slow env) starts the batch without it. A unit test of the batcher alone: the backend records batches."""

from __future__ import annotations

import asyncio

from envkit.backends import Generation, SamplingParams
from envkit.rollout.batching import MicroBatcher


class Recorder:
    def __init__(self) -> None:
        self.batches: list[int] = []

    def generate(self, prompts, sampling):
        self.batches.append(len(prompts))
        return [Generation([1], [0.0], "stop") for _ in prompts]


async def _episodes(batcher: MicroBatcher, finish_at: list[float]) -> None:
    """Each episode leaves its env call at ``finish_at[i]`` seconds, then asks for a generation."""
    busy = len(finish_at)
    batcher.envs_busy = lambda: busy

    async def episode(delay: float) -> None:
        nonlocal busy
        await asyncio.sleep(delay)
        busy -= 1
        batcher.notify()
        await batcher([0], SamplingParams())

    await asyncio.gather(*(episode(delay) for delay in finish_at))


def test_envs_that_keep_finishing_join_one_batch():
    backend = Recorder()
    batcher = MicroBatcher(backend, gather_s=0.05)
    batcher.last_call_s = 1.0  # a backend call costs a second: waiting up to that for a fuller batch pays
    # 16 envs finishing 20 ms apart: 0.3 s in all, six times gather_s, never a quiet gather_s.
    asyncio.run(_episodes(batcher, [0.02 * i for i in range(16)]))
    assert backend.batches == [16]


def test_a_quiet_gather_s_starts_the_batch_without_the_slow_env():
    backend = Recorder()
    batcher = MicroBatcher(backend, gather_s=0.05)
    batcher.last_call_s = 1.0
    asyncio.run(_episodes(batcher, [0.0, 0.01, 0.02, 0.4]))
    assert backend.batches == [3, 1]


def test_the_wait_is_bounded_by_the_last_backend_call():
    backend = Recorder()
    batcher = MicroBatcher(backend, gather_s=0.05)
    batcher.last_call_s = 0.1  # waiting more than 0.1 s for stragglers would cost more than a second call saves
    asyncio.run(_episodes(batcher, [0.03 * i for i in range(10)]))  # 0.27 s of envs finishing 30 ms apart
    assert len(backend.batches) >= 2 and sum(backend.batches) == 10


def test_thread_workers_of_one_process_share_warm_threads():
    """A second pool of thread workers (a trainer's next engine, a benchmark's next arm) runs its calls on the threads
    the first one started, instead of starting ``concurrency`` new ones."""
    import threading
    import time

    from envkit.thread_workers import ThreadWorkers

    def ident() -> int:
        time.sleep(0.05)
        return threading.get_ident()

    async def burst(workers: ThreadWorkers) -> set[int]:
        return set(await asyncio.gather(*(workers.call(ident, timeout_s=5) for _ in range(8))))

    first = asyncio.run(burst(ThreadWorkers(8)))
    second = asyncio.run(burst(ThreadWorkers(8)))
    assert len(first) == 8 and second <= first
