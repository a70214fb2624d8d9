"""How many threads torch computes with: the ``--torch-threads N|auto`` setting of eval, sft, train and play.

On a machine other jobs keep busy, torch's default (one thread per core) is much slower than one thread: its threads
meet at a barrier after every operation, and each barrier waits for the thread whose core another job holds (measured
on a 2-core machine at load 10-12: generation 6.4x faster, an SFT step 7-8 s against 2 s, on one thread). ``auto``
therefore takes one thread when the 1-minute load average is at least the core count, else torch's default; an
``OMP_NUM_THREADS`` set in the environment is kept.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

AUTO = "auto"

TORCH_THREADS_HELP = (
    "threads torch computes with: N, or auto (default): 1 when the machine is busy (1-minute load average >= its "
    "cores), else torch's default; OMP_NUM_THREADS, when set, is kept. Choose N on a machine shared with jobs that "
    "start after yours (auto looks once, at the start), or to leave cores to other work"
)
"""The flag's help, one text for every command that takes it."""


def add_torch_threads_flag(parser: argparse.ArgumentParser) -> None:
    """Add ``--torch-threads`` to a command's parser (eval, sft, play; train's field uses the same help and default).

    Args:
        parser: The command's parser. The value is checked when applied (:func:`apply_torch_threads`), so a bad one
            is the command's one-line error.
    """
    parser.add_argument("--torch-threads", default=AUTO, metavar="{N,auto}", help=TORCH_THREADS_HELP)


class TorchThreadsError(ValueError):
    """A ``--torch-threads`` value that is neither ``auto`` nor a positive integer."""


@dataclass(frozen=True)
class ThreadChoice:
    """What ``--torch-threads`` decided.

    Attributes:
        threads: Threads to set, or None to leave torch's default.
        reason: Why, for the one line printed at the start (e.g. ``load 11.2 on 2 cores``).
    """

    threads: int | None
    reason: str

    def line(self, default: int | None = None) -> str:
        """The one line a command prints: ``torch threads: 1 (load 11.2 on 2 cores; --torch-threads to choose)``.

        Args:
            default: torch's own thread count, shown when :attr:`threads` is None.

        Returns:
            The line, without a newline.
        """
        shown = self.threads if self.threads is not None else default
        return f"torch threads: {shown} ({self.reason}; --torch-threads to choose)"


def parse_torch_threads(value: str | int) -> str | int:
    """Check a ``--torch-threads`` value (an argparse ``type``).

    Args:
        value: ``auto`` or a positive integer (as text or int).

    Returns:
        ``"auto"`` or the integer.

    Raises:
        TorchThreadsError: Neither (its message is one line naming the fix).
    """
    text = str(value).strip().lower()
    if text == AUTO:
        return AUTO
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise TorchThreadsError(f"--torch-threads must be auto or a positive integer, got {value!r}")
    return number


def choose_torch_threads(
    setting: str | int, *, load: float | None, cores: int, environ: Mapping[str, str]
) -> ThreadChoice:
    """Decide the thread count from the setting, the machine's load and the environment.

    Args:
        setting: ``auto`` or a positive integer (see :func:`parse_torch_threads`).
        load: The 1-minute load average (None where the platform has none).
        cores: CPU cores this process may use.
        environ: The environment (``OMP_NUM_THREADS`` set there wins over ``auto``, never over a number).

    Returns:
        The :class:`ThreadChoice`.
    """
    setting = parse_torch_threads(setting)
    if setting != AUTO:
        return ThreadChoice(int(setting), "--torch-threads")
    omp = environ.get("OMP_NUM_THREADS", "").strip()
    if omp:
        try:
            return ThreadChoice(parse_torch_threads(omp), "OMP_NUM_THREADS")  # type: ignore[arg-type]
        except TorchThreadsError:
            pass  # torch ignores it too
    if load is None:
        return ThreadChoice(None, "torch's default; no load average here")
    if cores > 1 and load >= cores:
        return ThreadChoice(1, f"load {load:.1f} on {cores} cores: busy, 1 thread waits less")
    return ThreadChoice(None, f"torch's default; load {load:.1f} on {cores} cores")


def machine_load() -> tuple[float | None, int]:
    """The 1-minute load average (None where ``os.getloadavg`` is missing) and the cores this process may use."""
    try:
        load: float | None = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return load, cores


def apply_torch_threads(setting: str | int, say: Callable[[str], None] | None = print) -> ThreadChoice:
    """Decide (:func:`choose_torch_threads` on this machine) and set torch's thread count; call before a model loads.

    Args:
        setting: ``auto`` or a positive integer.
        say: Where the one line goes (None: nowhere).

    Returns:
        The :class:`ThreadChoice` applied.

    Raises:
        TorchThreadsError: A bad ``setting``.
    """
    import torch

    load, cores = machine_load()
    choice = choose_torch_threads(setting, load=load, cores=cores, environ=os.environ)
    if choice.threads is not None:
        torch.set_num_threads(choice.threads)
    if say is not None:
        say(choice.line(torch.get_num_threads()))
    return choice
