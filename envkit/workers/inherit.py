"""What a worker process takes from its parent as it starts, whatever the start method: the parent's state at that
moment (:class:`ParentState`).

A spawned worker inherits its environment variables, umask, resource limits, CPU affinity and niceness from the
parent when it starts. A worker forked by multiprocessing's fork server inherits the *server's*, frozen when the
process's first pool started it: a variable set, a limit raised or a set of cores chosen after that (an API key read
from the environment, ``RLIMIT_NOFILE`` raised for an env that opens many sockets, training pinned to its cores)
would be missed, silently, by every later worker. Each worker adopts the state its parent captured as it asked for
the worker, so both start methods give the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
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
