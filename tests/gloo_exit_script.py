"""Run by ``tests/test_process_exit.py`` as each of 2 gloo processes (``WORLD_SIZE=2``): DDP holds the process group
(so ``destroy_process_group`` cannot stop gloo's worker threads), and a collective's Python callback is still running
on a gloo thread, waking every 10 ms, when the script ends. ``HOW`` is ``return`` (a normal interpreter exit) or
``helper`` (:func:`envkit.util.process_exit.exit_without_finalizing`). Prints ``done`` without a newline (flushed only
by the exit) and an ``atexit`` handler writes ``OUT/atexit-RANK``.

Usage: ``python gloo_exit_script.py HOW OUT``
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from envkit.util.process_exit import exit_without_finalizing, in_several_processes


def main() -> None:
    how, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
    model(torch.ones(2, 4)).sum().backward()

    def wakes_for_two_seconds(future):
        for _ in range(200):  # each wake-up takes the GIL again
            time.sleep(0.01)
        return future.value()

    work = dist.all_reduce(torch.ones(4_000_000), async_op=True)  # large: still running when then() attaches
    work.get_future().then(wakes_for_two_seconds)
    dist.destroy_process_group()
    rank = os.environ["RANK"]
    atexit.register(lambda: (out / f"atexit-{rank}").write_text("ran"))
    print(f"done {rank} {in_several_processes()}", end="")
    if how == "helper":
        exit_without_finalizing(0)


if __name__ == "__main__":
    main()
