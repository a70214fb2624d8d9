"""Sharing a CPU-only machine between local vLLM servers and training.

vLLM-CPU binds each server's OpenMP threads to cores (by default every core but one), and torch runs one OpenMP
thread per core in the trainer. On the same cores, each of the trainer's parallel regions waits at its barrier for a
thread the server has preempted: measured on 2 cores with one local server, `envkit train --async`'s training loop
took 174 s with torch's default threads and 40 s with one thread beside the server (8 steps of 16 samples, tiny model;
benchmarks/README.md, "Asynchronous vs synchronous training"). So when envkit starts the servers on a machine without
CUDA it splits the cores between them (:func:`split_cpus`): each server's OpenMP threads are bound to its own cores
(``VLLM_CPU_OMP_THREADS_BIND``) and the training processes run on the rest (:func:`pin_training`). A user who sets
``OMP_NUM_THREADS`` or ``VLLM_CPU_OMP_THREADS_BIND`` has chosen: envkit then leaves threads and cores alone. Servers
given by URL on this machine (a loopback address) are not envkit's to bind: :func:`shared_machine_warning` says so.

Not handled: logical CPUs are split as they are numbered (two hyperthreads of one physical core may land on both
sides), and a cgroup CPU quota smaller than the affinity mask is not read.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

USER_CHOICE = ("OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND")
"""Environment variables by which the user places threads themselves (see :func:`user_placed_threads`)."""

LOOPBACK = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}


@dataclass(frozen=True)
class CpuSplit:
    """Which cores training uses and which each local server's OpenMP threads are bound to (no core in both)."""

    training: tuple[int, ...]
    servers: tuple[tuple[int, ...], ...]

    def server_bind(self, index: int) -> str:
        """Server ``index``'s ``VLLM_CPU_OMP_THREADS_BIND`` value (vLLM's list syntax, e.g. ``"0,1"``)."""
        return ",".join(str(core) for core in self.servers[index])

    def training_cores(self, local_rank: int, local_processes: int) -> tuple[int, ...]:
        """The cores of one training process: a disjoint share when there are enough, else all training cores."""
        share = len(self.training) // max(local_processes, 1)
        if share < 1:
            return self.training
        return self.training[local_rank * share : (local_rank + 1) * share]

    def training_threads(self, local_processes: int) -> int:
        """Torch threads per training process: its cores, or one when processes outnumber the training cores (they
        share them, and more threads than cores would stall at OpenMP barriers)."""
        return max(1, len(self.training) // max(local_processes, 1))

    def as_dict(self) -> dict[str, list]:
        """The split as plain data (``eval_summary.json``, benchmark figures)."""
        return {"training": list(self.training), "servers": [list(cores) for cores in self.servers]}

    def describe(self, local_processes: int = 1) -> str:
        """One line for the log."""
        threads = self.training_threads(local_processes)
        servers = ", ".join(f"server {i + 1} on cores {list(cores)}" for i, cores in enumerate(self.servers))
        return (
            f"no CUDA: {servers}; training on cores {list(self.training)} ({threads} thread(s) per process) — set "
            "OMP_NUM_THREADS or VLLM_CPU_OMP_THREADS_BIND to place them yourself"
        )


def available_cpus() -> list[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def user_placed_threads() -> bool:
    """Whether the user placed the threads (then envkit does not): ``VLLM_CPU_OMP_THREADS_BIND`` is set, or
    ``OMP_NUM_THREADS`` in a single-process run. Launchers of several processes (``accelerate launch``, ``torchrun``)
    set ``OMP_NUM_THREADS`` themselves, so under one (``WORLD_SIZE`` above 1) it does not count as a choice."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return True
    try:
        several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        several = False
    return "OMP_NUM_THREADS" in os.environ and not several


def split_cpus(cpus: Sequence[int], servers: int) -> CpuSplit | None:
    """Split ``cpus`` between training and ``servers`` local servers: training gets ``len(cpus) // (servers + 1)``
    cores (at least one, the last ones), the servers the rest in contiguous shares (sharing cores round-robin when
    there are more servers than cores left). ``None`` when there is nothing to split (one core, or no server)."""
    cores = sorted(set(cpus))
    if servers < 1 or len(cores) < 2:
        return None
    training_count = max(1, len(cores) // (servers + 1))
    training, rest = tuple(cores[-training_count:]), cores[:-training_count]
    if servers <= len(rest):
        share, extra = divmod(len(rest), servers)
        groups, start = [], 0
        for index in range(servers):
            size = share + (1 if index < extra else 0)
            groups.append(tuple(rest[start : start + size]))
            start += size
    else:
        groups = [(rest[index % len(rest)],) for index in range(servers)]
    return CpuSplit(training=training, servers=tuple(groups))


def local_split(servers: int, *, cuda: bool) -> CpuSplit | None:
    """The split for ``servers`` servers started on this machine beside training: ``None`` with CUDA, when the user
    placed the threads (:func:`user_placed_threads`) or when there is nothing to split."""
    if cuda or user_placed_threads():
        return None
    return split_cpus(available_cpus(), servers)


def pin_training(split: CpuSplit, local_rank: int = 0, local_processes: int = 1) -> int:
    """Run this process (every thread it has, and so every thread it starts) on its training cores and set torch's
    thread count to match; returns that count."""
    import torch

    cores = split.training_cores(local_rank, local_processes)
    threads = split.training_threads(local_processes)
    if hasattr(os, "sched_setaffinity"):
        # sched_setaffinity applies to one thread on Linux: set it for each of this process's threads.
        tasks = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["0"]
        for task in tasks:
            try:
                os.sched_setaffinity(int(task), cores)
            except OSError:  # a thread that ended meanwhile
                continue
    torch.set_num_threads(threads)
    return threads


def shared_machine_warning(urls: Sequence[str]) -> str | None:
    """A warning when servers given by URL run on this machine, which has no CUDA, and nobody placed the threads:
    the servers and training then fight over the same cores (see the module). ``None`` otherwise."""
    local = [url for url in urls if (urlparse(url).hostname or "") in LOOPBACK]
    if not local or user_placed_threads():
        return None
    cores = len(available_cpus())
    return (
        f"vLLM server(s) {', '.join(local)} run on this machine and share its {cores} cores with training, which slows "
        "both (OpenMP threads preempting each other): bind each server (VLLM_CPU_OMP_THREADS_BIND=0 when starting it) "
        "and give training the other cores (OMP_NUM_THREADS=1 taskset -c 1 envkit train ...), or let "
        "`--vllm-servers N` start and place them"
    )
