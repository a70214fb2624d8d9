"""Run as a script (its own process: it changes its niceness for good): prints, as JSON, the process state of a
worker of a first pool (which starts the fork server), then the parent's state changed (and the thread count torch
chooses under it), and that of a worker of a second pool started after the change."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys

from envkit.workers import EnvFactory
from envkit.workers.processes import ProcessWorkers


async def state_of_a_new_worker(start_method: str) -> dict:
    pool = ProcessWorkers(1, processes=1, start_method=start_method)
    try:
        session = await pool.open(EnvFactory("worker_envs:ProcessState"), timeout_s=60)
        _, info, _ = await session.reset(0, timeout_s=60)
        return info["state"]
    finally:
        pool.close()


def fresh_torch_threads() -> int:
    """The thread count torch chooses as it loads in a new interpreter with this process's state."""
    done = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True
    )
    return int(done.stdout.split()[-1])


def main() -> None:
    start_method = sys.argv[1]
    first = asyncio.run(state_of_a_new_worker(start_method))
    os.umask(0o027)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft - 7, hard))
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus[:1])  # this (main) thread
    os.nice(3)  # this (main) thread
    os.environ["OMP_NUM_THREADS"] = "1"
    parent = {
        "umask": 0o027,
        "nofile": [soft - 7, hard],
        "cpus": cpus[:1],
        "niceness": os.getpriority(os.PRIO_PROCESS, 0),
        "torch_threads": fresh_torch_threads(),
    }
    second = asyncio.run(state_of_a_new_worker(start_method))
    print(json.dumps({"first": first, "parent": parent, "second": second}))


if __name__ == "__main__":
    main()
