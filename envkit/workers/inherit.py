"""What a worker process takes from its parent as it starts, whatever the start method: the parent's state at that
moment (:class:`ParentState`).

A spawned worker inherits its environment variables, umask, resource limits, CPU affinity and niceness from the
parent when it starts. A worker forked by multiprocessing's fork server inherits the *server's*, frozen when the
process's first pool started it: a variable set, a limit raised or a set of cores chosen after that (an API key read
from the environment, ``RLIMIT_NOFILE`` raised for an env that opens many sockets, training pinned to its cores)
would be missed, silently, by every later worker. Each worker adopts the state its parent captured as it asked for
the worker, so both start methods give the same.

What the fork server computed from its own state as it imported its preloads is another matter: torch fixes its
thread count when it loads (from ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS`` and the CPUs it may use, by a rule of its
own). A forked worker whose threading settings differ from the server's asks a fresh interpreter what torch would
choose there, and sets that (:func:`match_torch_threads`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import subprocess
import sys
import threading

LIMITS = tuple(getattr(resource, name) for name in sorted(dir(resource)) if name.startswith("RLIMIT_"))
"""Every resource limit this platform names (``resource.RLIMIT_*``)."""


@dataclasses.dataclass(frozen=True)
class ParentState:
    """A process's state as a worker started now should inherit it (:meth:`capture` in the parent,
    :meth:`adopt` first thing in the worker). Per-thread settings (CPU affinity, niceness) are the main thread's:
    the threads it starts inherit them."""

    environment: dict[str, str]
    """The environment variables."""
    umask: int | None
    """The file-mode creation mask (``None`` where the platform cannot read it without changing it)."""
    limits: dict[int, tuple[int, int]]
    """Each resource limit's ``(soft, hard)``."""
    cpus: frozenset[int] | None
    """The CPUs the main thread may run on (``None`` where the platform has no affinity)."""
    niceness: int | None
    """The main thread's nice value."""

    @classmethod
    def capture(cls) -> ParentState:
        """This process's state now."""
        main = threading.main_thread().native_id or 0
        cpus = None
        if hasattr(os, "sched_getaffinity"):
            with contextlib.suppress(OSError):
                cpus = frozenset(os.sched_getaffinity(main))
        niceness = None
        with contextlib.suppress(OSError):
            niceness = os.getpriority(os.PRIO_PROCESS, main)
        return cls(
            environment=dict(os.environ),
            umask=_umask(),
            limits={limit: resource.getrlimit(limit) for limit in LIMITS},
            cpus=cpus,
            niceness=niceness,
        )

    def adopt(self) -> None:
        """Make this process's state the captured one, as far as the kernel lets an unprivileged process (raising a
        hard limit or lowering a nice value may be refused: that one setting stays the fork server's). Call it before
        the process starts threads: affinity and niceness are set for the calling thread, which new threads copy."""
        for name in set(os.environ) - set(self.environment):
            del os.environ[name]
        os.environ.update(self.environment)
        if self.umask is not None:
            os.umask(self.umask)
        for limit, wanted in self.limits.items():
            if resource.getrlimit(limit) != wanted:
                with contextlib.suppress(OSError, ValueError):
                    resource.setrlimit(limit, wanted)
        if self.cpus is not None and hasattr(os, "sched_setaffinity"):
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self.cpus)
        if self.niceness is not None:
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, 0, self.niceness)


def _umask() -> int | None:
    """The umask, read from ``/proc/self/status`` (Linux 4.7+): ``os.umask`` can only read it by changing it, which
    another thread creating a file at that moment would see."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return None


THREADING_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_")
"""Environment variables the OpenMP, MKL and OpenBLAS runtimes read once, when torch loads them: with the CPUs a
process may use, what fixes torch's thread count."""


def threading_settings(state: ParentState) -> tuple[tuple[tuple[str, str], ...], frozenset[int] | None]:
    """What in ``state`` fixes torch's thread count when torch loads: the threading runtimes' variables
    (:data:`THREADING_PREFIXES`) and the CPUs."""
    variables = tuple(sorted((k, v) for k, v in state.environment.items() if k.startswith(THREADING_PREFIXES)))
    return variables, state.cpus


THREADS_QUESTION_TIMEOUT_S = 30.0
"""How long :func:`match_torch_threads` waits for the fresh interpreter's answer (about 2 s; an import of torch on a
loaded machine may take ten times that): well inside a worker's start timeout, so a question that hangs keeps the
server's count instead of failing the worker's start."""


def match_torch_threads(server: ParentState, timeout_s: float = THREADS_QUESTION_TIMEOUT_S) -> None:
    """In a worker the fork server forked, once it adopted its parent's state (``server``: its state before, the
    fork server's): where torch was loaded by the server and the threading settings now differ from the server's,
    set torch's thread count to the one a fresh interpreter chooses under them, as a spawned worker's torch would
    (asked of one, about 2 s: torch's rule, not a copy of it). Nothing to do otherwise, or where the question fails
    or takes more than ``timeout_s`` (the server's count is kept)."""
    torch = sys.modules.get("torch")
    if torch is None or threading_settings(ParentState.capture()) == threading_settings(server):
        return
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError, IndexError):
        chosen = subprocess.run(
            [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
        torch.set_num_threads(int(chosen.stdout.split()[-1]))
