"""Envs for the process and Ray worker tests, importable by spec in a worker (``EnvFactory("worker_envs:Faulty")``):
the workers get the parent's ``sys.path``, which holds tests/. Kept light (no helpers, no torch) so a worker builds
its first env in milliseconds."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from pathlib import Path

import envkit


class CounterEnv(envkit.ToolEnv):
    """Add numbers with a tool until the total reaches the target, then say so (tests/helpers.py's, trimmed)."""

    max_turns = 6

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.target = int(self.np_random.integers(5, 50))
        self.total = 0
        return [
            {"role": "system", "content": "You keep a running total with tools."},
            {"role": "user", "content": f"Bring the total to {self.target}, then tell me."},
        ], {"target": self.target}

    @envkit.tool
    def add(self, amount: int) -> str:
        """Add an amount to the running total.

        Args:
            amount: The whole number to add (may be negative).
        """
        self.total += amount
        return f"total is now {self.total}"

    def on_text(self, message):
        return None

    def score(self) -> float:
        return 1.0 if self.total == self.target else 0.0

    def oracle(self):
        if self.total != self.target:
            call = {"type": "function", "function": {"name": "add", "arguments": {"amount": self.target - self.total}}}
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return {"role": "assistant", "content": f"Done: the total is {self.target}."}


class Faulty(CounterEnv):
    """CounterEnv whose ``step`` misbehaves on the task seeds in ``seeds`` (or per seed: ``faults``). A fault is
    ``"hang"`` (sleeps for an hour), ``"exit"`` (``os._exit(1)``, as a crashing native extension), ``"sigkill"``
    (kills its own process), ``"raise"`` (a ValueError) or ``"odd-error"`` (an exception that does not pickle).
    ``delay``: seconds of sleep in every step. ``record``: a file each step appends ``pid start end`` to (wall-clock
    seconds around its sleep), so a test can see which steps ran at the same time."""

    def __init__(
        self,
        fault: str = "hang",
        seeds: tuple[int, ...] | list[int] = (),
        delay: float = 0.0,
        faults: dict[int, str] | None = None,
        record: str | None = None,
    ) -> None:
        super().__init__()
        self.faults = {**(faults or {}), **dict.fromkeys(seeds, fault)}  # task seed -> fault
        self.delay = delay
        self.record = record

    def reset(self, *, seed=None, options=None):
        self.task_seed = seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        start = time.time()
        if self.delay:
            time.sleep(self.delay)
        if self.record:
            with open(self.record, "a") as out:  # one short O_APPEND write per step: lines never interleave
                out.write(f"{os.getpid()} {start} {time.time()}\n")
        fault = self.faults.get(self.task_seed)
        if fault == "hang":
            time.sleep(3600)
        elif fault == "exit":
            os._exit(1)
        elif fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault == "raise":
            raise ValueError(f"step failed on seed {self.task_seed}")
        elif fault == "odd-error":
            raise OddError(self.task_seed, "no pickle")
        return super().step(action)


class StartsAHelper(CounterEnv):
    """CounterEnv that starts a helper process at construction (as a game server or a sandbox would; its pid is
    ``info["helper"]`` of the reset) and whose ``step`` crashes its worker (``os._exit(1)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.helper = subprocess.Popen(["sleep", "600"])

    def reset(self, *, seed=None, options=None):
        messages, info = super().reset(seed=seed, options=options)
        return messages, {**info, "helper": self.helper.pid}

    def step(self, action):
        os._exit(1)

    def close(self):
        self.helper.kill()
        self.helper.wait()


BUILT: set[int] = set()
"""Ids of the :class:`SlowToBuild` envs of this process not closed yet."""


class SlowToBuild(CounterEnv):
    """CounterEnv whose construction takes ``build_s`` seconds (a container or a server starting), counted in
    :data:`BUILT` until closed; with ``markers``, it writes ``started`` and ``built`` files in that folder."""

    def __init__(self, build_s: float = 0.0, markers: str | None = None) -> None:
        super().__init__()
        if markers:
            Path(markers, "started").touch()
        time.sleep(build_s)
        BUILT.add(id(self))
        if markers:
            Path(markers, "built").touch()

    def close(self) -> None:
        BUILT.discard(id(self))


def others_built(env: envkit.Env) -> int:
    """The :class:`SlowToBuild` envs alive in ``env``'s process besides ``env`` (for ``session.call``)."""
    return len(BUILT - {id(env)})


def global_draws(env: envkit.Env) -> tuple[int, int, int]:
    """Draws from ``random``'s, numpy's and torch's global generators in ``env``'s process (for ``session.call``)."""
    import random

    import numpy
    import torch

    return random.getrandbits(62), int(numpy.random.randint(0, 2**62)), int(torch.randint(0, 2**62, (1,)))


class OddError(Exception):
    """An exception whose constructor does not take its message back: it does not survive pickling."""

    def __init__(self, seed: int, why: str) -> None:
        super().__init__(f"odd failure on seed {seed} ({why})")
        self.seed = seed


class WhoAmI(CounterEnv):
    """Reports the process it lives in (``info["pid"]`` of the reset)."""

    def reset(self, *, seed=None, options=None):
        messages, info = super().reset(seed=seed, options=options)
        return messages, {**info, "pid": os.getpid()}


class Environ(CounterEnv):
    """Reports the environment variables named ``ENVKIT_TEST_*`` of the process it lives in (``info["environ"]``)."""

    def reset(self, *, seed=None, options=None):
        messages, info = super().reset(seed=seed, options=options)
        return messages, {**info, "environ": {k: v for k, v in os.environ.items() if k.startswith("ENVKIT_TEST_")}}


class LongCounter(CounterEnv):
    """CounterEnv that runs for up to 1,000 turns (the per-step bytes test steps it hundreds of times)."""

    max_turns = 1000


class Forgetful(LongCounter):
    """Keeps only its opening and the last four messages of its transcript (as an env that compacts its history
    does): earlier messages the caller already has are dropped."""

    def step(self, action):
        outcome = super().step(action)
        if len(self.messages) > 8:
            self.messages = [*self.messages[:2], *self.messages[-4:]]
        return outcome


class Spinner(envkit.ToolEnv):
    """Tools that never return (a pure-Python loop, one C call holding the GIL), one that echoes, one that reports the
    kernel limits of the process the env runs in. Each spinning call first writes its process id to ``SPIN_DIR``."""

    max_turns = 50

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "Spin, or echo."}], {}

    @envkit.tool
    def spin(self, kind: str) -> str:
        """Never return.

        Args:
            kind: ``python`` (a pure-Python loop) or ``c`` (one big-integer power: a C call holding the GIL).
        """
        Path(os.environ["SPIN_DIR"], kind).write_text(f"{os.getpid()}\n")
        if kind == "c":
            nine = 9
            return str(nine**nine**nine)
        while True:
            pass

    @envkit.tool
    def echo(self, text: str) -> str:
        """Say it back.

        Args:
            text: What to say back.
        """
        return text

    @envkit.tool
    def limits(self) -> dict:
        """The CPU-time and address-space limits (soft) of this process; -1: none."""
        return {"cpu": resource.getrlimit(resource.RLIMIT_CPU)[0], "memory": resource.getrlimit(resource.RLIMIT_AS)[0]}

    def score(self) -> float:
        return 0.0


class ProcessState(CounterEnv):
    """Reports the process state it lives in (``info["state"]``): umask, ``RLIMIT_NOFILE``, CPU affinity, niceness,
    torch's thread count."""

    def reset(self, *, seed=None, options=None):
        messages, info = super().reset(seed=seed, options=options)
        mask = os.umask(0)
        os.umask(mask)
        state = {
            "umask": mask,
            "nofile": list(resource.getrlimit(resource.RLIMIT_NOFILE)),
            "cpus": sorted(os.sched_getaffinity(0)),
            "niceness": os.getpriority(os.PRIO_PROCESS, 0),
            "torch_threads": _torch_threads(),
        }
        return messages, {**info, "state": state}


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()
