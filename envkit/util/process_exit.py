"""Ending a process that was one of several ``torch.distributed`` processes over gloo, without an abort at exit.

DDP keeps its gloo process group alive for the life of the model (``destroy_process_group`` unregisters it but cannot
stop gloo's worker threads: they end only when the group is freed, and the model's autograd hooks keep it), so those
threads outlive the script. When one of them still touches Python (it drops the last reference to a tensor Python
made for the last collective, or runs a future's callback) after the interpreter has begun finalizing, CPython ends
that thread in the middle of a C++ destructor and the process aborts: ``terminate called without an active
exception``, exit -6, after every result was written. Measured with torch 2.13: a 2-process DDP run with a pending
Python callback aborts 3 times out of 3 after ``destroy_process_group``, and exits 0 every time through
:func:`exit_without_finalizing`.

Freeing the group before then can deadlock instead: its destructor joins gloo's worker threads while the freeing
thread holds the GIL, and a worker still dropping a finished collective's tensors (a barrier's work keeps the
``gather_object`` before it) waits for the GIL. A run that hands what owns the group (the DDP-wrapped model) to
:func:`keep_until_exit` never frees it: measured with ``envkit train --eval-strategy steps`` over two processes,
3 runs in 30 hung in ``~ProcessGroupGloo`` when ``envkit train`` returned, and none in 40 after.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import Any, NoReturn


def in_several_processes() -> bool:
    """Whether this process was started as one of several ``torch.distributed`` processes (``accelerate launch``,
    ``torchrun``: ``WORLD_SIZE`` above 1) and has imported ``torch.distributed``."""
    try:
        several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False
    return several and "torch.distributed" in sys.modules


_KEPT_UNTIL_EXIT: list[Any] = []


def keep_until_exit(owner: Any) -> None:
    """Keep ``owner`` (something that owns a gloo process group, e.g. a DDP-wrapped model) referenced for the rest of
    the process, so that the group is never freed while a gloo worker thread may still need the GIL (see the module);
    :func:`exit_without_finalizing` then ends the process without freeing it."""
    _KEPT_UNTIL_EXIT.append(owner)


def end_process_group(accelerator: Any, owner: Any) -> None:
    """End a training run's process group: tear it down before the interpreter does (a gloo thread touching Python
    during finalization aborts the rank; see the module), and, with several processes, keep ``owner`` (what holds the
    group: the DDP-wrapped model) until the process ends (:func:`keep_until_exit`: freeing it can deadlock). A no-op
    in one process. ``accelerator``: accelerate's ``Accelerator`` of the run."""
    accelerator.state.destroy_process_group()
    if accelerator.num_processes > 1:
        keep_until_exit(owner)


def exit_without_finalizing(code: int) -> NoReturn:
    """End the process with ``code`` as a normal exit would (wait for non-daemon threads, run the ``atexit``
    handlers, flush stdout and stderr), then skip interpreter finalization (``os._exit``), the one phase in which a
    gloo thread touching Python aborts the process."""
    current = threading.current_thread()
    for thread in threading.enumerate():
        if thread is not current and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):  # closed, or replaced without a flush()
            stream.flush()
    os._exit(code)
