"""Thread workers of one process share warm threads: an engine per trainer step (or per benchmark arm) starts none."""

from __future__ import annotations

import asyncio


def test_thread_workers_of_one_process_share_warm_threads():
    """A second pool of thread workers (a trainer's next engine, a benchmark's next arm) runs its calls on the threads
    the first one started, instead of starting ``concurrency`` new ones."""
    import threading

    from helpers import RELEASE_CAP_S

    from envkit.workers.threads import ThreadWorkers

    async def burst(workers: ThreadWorkers) -> set[int]:
        together = threading.Barrier(8, timeout=RELEASE_CAP_S / 2)  # all 8 calls run at once, each on its own thread

        def ident() -> int:
            together.wait()
            return threading.get_ident()

        return set(await asyncio.gather(*(workers.call(ident, timeout_s=RELEASE_CAP_S) for _ in range(8))))

    first = asyncio.run(burst(ThreadWorkers(8)))
    # The process may hold more idle pool threads than these 8 (earlier pools, earlier tests): the second burst may run
    # on any of them, but on no thread started after the first burst.
    alive = {thread.ident for thread in threading.enumerate()}
    second = asyncio.run(burst(ThreadWorkers(8)))
    assert len(first) == 8 and first <= alive and second <= alive
