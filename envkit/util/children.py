"""The one owner of every process envkit starts: none outlives the process that started it.

What ends a child, however its parent ends:

* a normal exit, an exception, Ctrl-C: the code that started it stops it in a ``finally:``, and :func:`stop_all`
  (registered with ``atexit`` when the first child starts) stops any left;
* SIGTERM (a scheduler's cancel, ``kill``, ``accelerate``'s teardown): the ``envkit`` command runs inside
  :func:`sigterm_exits`, which turns SIGTERM into :class:`Terminated` (a ``SystemExit``), so the same ``finally:``
  blocks and ``atexit`` handlers run. Nothing here changes signal handling at import;
* SIGKILL, the OOM killer, a crash: nothing runs in the parent, so each child watches a *lifeline* (a socket whose
  other end only the parent holds: the kernel closes it when the parent dies, whatever killed it) and, on Linux,
  also gets a parent-death signal (``prctl(PR_SET_PDEATHSIG)``) from the kernel.

Commands (:func:`start`: vLLM servers, probes) run under a *guard*: this very file run as a script
(``python -I children.py --guard FD GRACE -- COMMAND...``, standard library only, ~20 ms to start). The guard starts
the command in a process group of its own, so everything the command starts (vLLM's engine and worker processes) is
stopped with it: when the parent stops it (SIGTERM), when the lifeline closes, or when the command exits (what it
left behind is killed), the guard sends SIGTERM to the group, SIGKILL after ``grace_s``, and exits as the command did.
The command also gets SIGKILL from the kernel if the guard itself is killed (Linux).

Env worker processes (:mod:`envkit.workers.processes`, started by ``multiprocessing``) use the same parts from inside:
:func:`watch_lifeline`, :func:`set_parent_death_signal`, a process group of their own (:func:`own_group`,
:func:`end_own_group`, :func:`kill_group`) and :class:`ResourceLimits`.

A parent-death signal is sent when the *thread* that started the process ends, not the process: it is only set where
that thread lives as long as the parent (the guard's main thread, a fork server's), never on a process started from a
short-lived thread; the lifeline covers every case. A process forked from the parent (``os.fork``, multiprocessing's
``"fork"`` start method) inherits the parent's end of each lifeline and keeps it open while it lives.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import math
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

__all__ = [
    "DEFAULT_GRACE_S",
    "Child",
    "ResourceLimits",
    "Terminated",
    "end_own_group",
    "guarded",
    "kill_group",
    "live_children",
    "own_group",
    "set_parent_death_signal",
    "sigterm_exits",
    "start",
    "stop_all",
    "watch_lifeline",
]

DEFAULT_GRACE_S = 10.0
"""How long a stopped command may take to exit after SIGTERM before its group gets SIGKILL."""

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_START_TIMEOUT_S = 60.0  # for the guard to start and report its command's pid (it takes ~20 ms)


# ---- parts every child uses -----------------------------------------------------------------------------------------
def set_parent_death_signal(signum: int = signal.SIGKILL) -> bool:
    """Have the kernel send ``signum`` to this process when the thread that started it ends (Linux
    ``prctl(PR_SET_PDEATHSIG)``).

    Args:
        signum: The signal to receive.

    Returns:
        Whether it is set (False on other systems, where the lifeline alone watches the parent).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def watch_lifeline(fd: int, on_gone: Callable[[], Any], name: str = "envkit-lifeline") -> threading.Thread:
    """Call ``on_gone()`` on a daemon thread once ``fd`` (this process's end of a lifeline: the parent never writes to
    its end) reads end-of-file or fails, which happens when the parent dies, however it died.

    Args:
        fd: The lifeline's file descriptor here.
        on_gone: What to do once the parent is gone (it usually ends this process).
        name: The watching thread's name.

    Returns:
        The started thread.
    """

    def watch() -> None:
        with contextlib.suppress(BaseException):
            while os.read(fd, 4096):
                pass
        on_gone()

    thread = threading.Thread(target=watch, name=name, daemon=True)
    thread.start()
    return thread


def own_group() -> bool:
    """Make this process the leader of a new process group (so :func:`kill_group` reaches what it starts too).

    Returns:
        Whether it is one now.
    """
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    return os.getpgid(0) == os.getpid()


def end_own_group() -> None:
    """SIGKILL this process and everything in its process group, when it leads one (:func:`own_group`); otherwise
    only this process (a group it does not lead is its parent's)."""
    if os.getpgid(0) == os.getpid():
        with contextlib.suppress(OSError):
            os.killpg(0, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_group(pid: int, signum: int = signal.SIGKILL) -> bool:
    """Send ``signum`` to the process group that ``pid`` leads.

    Call it only while ``pid`` is known not to be reaped (a reaped pid can be reused).

    Args:
        pid: A process that leads its own group (:func:`own_group`).
        signum: The signal.

    Returns:
        False when there is no such group (``pid`` never made one, or it and all it started are gone).
    """
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


@dataclass(frozen=True)
class ResourceLimits:
    """Kernel limits for a process that runs code it does not trust to stop (an env executing model input).

    Args:
        cpu_s: CPU seconds the process may use past the start of its latest call (``RLIMIT_CPU``, renewed by
            :meth:`renew_cpu` at each call): a call that keeps its process busy that long gets SIGXCPU (and no core
            dump), however it is stuck, even holding the GIL. None: no limit.
        memory_bytes: Address space of the process (``RLIMIT_AS``): past it, allocations fail (``MemoryError``).
            None: no limit.

    A process the limited one starts inherits both as they stand at its start; the CPU limit is then a budget for
    its whole life, renewed for no call of its own. A long-lived helper an env starts (a game server) should lift it
    (``resource.prlimit(pid, RLIMIT_CPU, (hard, hard))``), as envkit's Java games do for their JVM; a helper stuck in
    a call is still ended by the call's deadline, which ends the worker's process group.
    """

    cpu_s: float | None = None
    memory_bytes: int | None = None

    def apply(self) -> None:
        """Set the limits on this process (call it first thing in the child)."""
        import resource

        if self.cpu_s is not None or self.memory_bytes is not None:
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGXCPU's default action would write a core file
        if self.memory_bytes is not None:
            _, hard = resource.getrlimit(resource.RLIMIT_AS)
            bound = self.memory_bytes if hard == resource.RLIM_INFINITY else min(self.memory_bytes, hard)
            resource.setrlimit(resource.RLIMIT_AS, (bound, bound))
        self.renew_cpu()

    def renew_cpu(self) -> None:
        """Allow ``cpu_s`` more CPU seconds from now (call it when a call starts)."""
        if self.cpu_s is None:
            return
        import resource

        usage = resource.getrusage(resource.RUSAGE_SELF)
        soft = math.ceil(usage.ru_utime + usage.ru_stime + self.cpu_s)
        _, hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


# ---- SIGTERM as a clean exit ----------------------------------------------------------------------------------------
class Terminated(SystemExit):
    """SIGTERM arrived while :func:`sigterm_exits` was in effect: raised in the main thread, so ``finally:`` blocks
    and ``atexit`` handlers run. Its ``code`` is 143 (128 + SIGTERM), as a shell reports a process SIGTERM ended."""


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """While in effect, SIGTERM raises :class:`Terminated` in the main thread; a second SIGTERM ends the process at
    once (the default action). The handler before is put back at the end. A no-op off the main thread.

    The ``envkit`` command runs inside it; no import installs it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated(128 + signum)

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# ---- commands under a guard -----------------------------------------------------------------------------------------
class Child:
    """A command started by :func:`start`, running under its guard (see the module docstring).

    ``pid`` is the command's own process id (it leads its process group); :meth:`poll`, :meth:`wait` and
    ``returncode`` are the command's exit status as the guard reports it (negative: the signal that ended it).
    """

    def __init__(self, guard: subprocess.Popen[Any], lifeline: socket.socket, pid: int, grace_s: float) -> None:
        self.guard = guard
        """The guard's process."""
        self.pid = pid
        """The command's process id (and process group id)."""
        self.grace_s = grace_s
        self._lifeline = lifeline

    @property
    def returncode(self) -> int | None:
        """The command's exit status once it has ended (and the guard with it), else None."""
        return self.guard.returncode

    def poll(self) -> int | None:
        """The exit status if the command has ended, else None (never blocks)."""
        code = self.guard.poll()
        if code is not None:
            self._forget()
        return code

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the command (and the guard) to end; its exit status.

        Raises:
            subprocess.TimeoutExpired: Still running after ``timeout`` seconds.
        """
        code = self.guard.wait(timeout)
        self._forget()
        return code

    def stop(self) -> int | None:
        """Stop the command and everything it started: SIGTERM, SIGKILL after ``grace_s`` (done by the guard; done
        here if the guard does not answer). Blocks until they are gone; idempotent.

        Returns:
            The command's exit status (None if even SIGKILL left the guard unreaped).
        """
        if self.guard.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.guard.send_signal(signal.SIGTERM)
            try:
                self.guard.wait(self.grace_s + 5.0)
            except subprocess.TimeoutExpired:
                self.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.guard.wait(10.0)
        self._forget()
        return self.guard.returncode

    def kill(self) -> None:
        """SIGKILL the command's process group and the guard at once (never blocks)."""
        if self.guard.poll() is None:  # the guard is not reaped, so its command's group id is still the command's
            kill_group(self.pid)
            with contextlib.suppress(ProcessLookupError):
                self.guard.kill()

    def _forget(self) -> None:
        with _LOCK:
            _LIVE.discard(self)
        with contextlib.suppress(OSError):
            self._lifeline.close()

    def __repr__(self) -> str:
        return f"<envkit child {self.pid} (guard {self.guard.pid})>"


_LIVE: set[Child] = set()
_LOCK = threading.Lock()
_AT_EXIT = False


def start(
    command: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    stdin: int | IO[Any] | None = None,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    preexec_fn: Callable[[], Any] | None = None,
    grace_s: float = DEFAULT_GRACE_S,
) -> Child:
    """Start ``command`` under a guard (see the module docstring): it cannot outlive this process.

    Args:
        command: The program and its arguments.
        env: Its environment (default: this process's).
        cwd: Its working directory.
        stdin: As ``subprocess.Popen``'s.
        stdout: As ``subprocess.Popen``'s.
        stderr: As ``subprocess.Popen``'s.
        preexec_fn: Run in the guard before it starts (what it sets, e.g. CPU affinity, the command inherits).
        grace_s: Seconds between SIGTERM and SIGKILL when it is stopped.

    Returns:
        The running :class:`Child`.

    Raises:
        OSError: The guard could not start the command (its message says why).
    """
    global _AT_EXIT
    ours, theirs = socket.socketpair()
    try:
        guard = subprocess.Popen(
            [sys.executable, "-I", os.path.abspath(__file__), "--guard", str(theirs.fileno()), repr(grace_s), "--"]
            + [os.fspath(part) for part in command],
            env=env,
            cwd=cwd,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,  # no terminal's signals: the owner decides when it stops
            preexec_fn=preexec_fn,
        )
    except BaseException:
        ours.close()
        raise
    finally:
        theirs.close()
    try:
        ours.settimeout(_START_TIMEOUT_S)
        report = b""
        while not report.endswith(b"\n"):
            chunk = ours.recv(64)
            if not chunk:
                break
            report += chunk
        ours.settimeout(None)
    except BaseException:
        guard.kill()
        guard.wait()
        ours.close()
        raise
    if not report.startswith(b"pid ") or not report.endswith(b"\n"):
        guard.wait()
        ours.close()
        why = report.decode(errors="replace").strip() or f"the guard exited with code {guard.returncode}"
        raise OSError(f"cannot start {command[0]}: {why}")
    child = Child(guard, ours, int(report.split()[1]), grace_s)
    with _LOCK:
        _LIVE.add(child)
        if not _AT_EXIT:
            atexit.register(stop_all)
            _AT_EXIT = True
    return child


def guarded(command: Sequence[str], *, grace_s: float = DEFAULT_GRACE_S) -> list[str]:
    """``command`` wrapped in a guard, for a library that starts the process itself with pipes of its own (the MCP
    SDK's stdio servers): the command line to give it instead. The guard runs ``command`` in a process group of its
    own and stops that group when this process dies, however it dies (see :func:`_watch_parent`), or when the
    library stops the guard. What the library sees is unchanged: the command's stdin, stdout and exit status.

    Args:
        command: The program and its arguments.
        grace_s: Seconds between SIGTERM and SIGKILL when it is stopped.

    Returns:
        The command line that starts the guard.
    """
    return [
        sys.executable,
        "-I",
        os.path.abspath(__file__),
        "--watch-parent",
        str(os.getpid()),
        repr(grace_s),
        "--",
        *(os.fspath(part) for part in command),
    ]


def live_children() -> list[Child]:
    """The children started here that have not been seen to end."""
    with _LOCK:
        return list(_LIVE)


def stop_all(children: Sequence[Child] | None = None) -> None:
    """Stop ``children`` (default: every live child) together: SIGTERM to all at once, then wait for each
    (:meth:`Child.stop`). Registered with ``atexit`` when the first child starts.

    Args:
        children: The children to stop.
    """
    children = live_children() if children is None else list(children)
    for child in children:
        if child.guard.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                child.guard.send_signal(signal.SIGTERM)
    for child in children:
        child.stop()


# ---- the guard (this file run as a script: standard library only) ---------------------------------------------------
def _guard(argv: list[str]) -> int:
    """``--guard FD GRACE -- COMMAND...``: run COMMAND in a process group of its own until it exits, this process is
    told to stop (SIGTERM, SIGINT, SIGHUP) or the lifeline FD closes; then stop the group; exit as COMMAND did."""
    fd, grace_s, command = int(argv[0]), float(argv[1]), argv[3:]
    line = socket.socket(fileno=fd)
    done = threading.Event()
    try:
        process, exited = _start_guarded(command, done)
    except OSError as error:
        line.sendall(f"{type(error).__name__}: {error}\n".encode())
        return 127
    line.sendall(f"pid {process.pid}\n".encode())
    watch_lifeline(fd, done.set)
    return _stop_guarded(process, done, exited, grace_s)


def _watch_parent(argv: list[str]) -> int:
    """``--watch-parent PID GRACE -- COMMAND...``: the guard of a command that another library starts with its own
    pipes (an MCP SDK's stdio server: :func:`guarded`). No lifeline can be passed through that library, so the guard
    watches its parent instead: a parent-death signal from the kernel, and the parent pid checked every second (the
    guard is re-parented when PID dies). COMMAND gets the guard's stdin and stdout; the guard then lets go of its
    own copies, so the library sees the pipes close when the command exits."""
    parent, grace_s, command = int(argv[0]), float(argv[1]), argv[3:]
    done = threading.Event()
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != parent:  # it died before the signal was armed
        return 128 + signal.SIGTERM
    try:
        process, exited = _start_guarded(command, done)
    except OSError as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr, flush=True)
        return 127
    with open(os.devnull, "r+b") as null:
        os.dup2(null.fileno(), 0)
        os.dup2(null.fileno(), 1)
    return _stop_guarded(process, done, exited, grace_s, parent=parent)


def _start_guarded(command: list[str], done: threading.Event) -> tuple[subprocess.Popen[bytes], threading.Event]:
    """Start COMMAND in a group of its own; the event it returns is set when COMMAND exits, ``done`` when it exits or
    the guard is told to stop."""
    exited = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda *_: done.set())
    process = subprocess.Popen(command, preexec_fn=_command_preexec)

    def wait() -> None:
        if hasattr(os, "waitid"):  # without reaping: the pid stays the group's until the group is killed below
            os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
        else:
            process.wait()
        exited.set()
        done.set()

    threading.Thread(target=wait, daemon=True).start()
    return process, exited


def _stop_guarded(
    process: subprocess.Popen[bytes], done: threading.Event, exited: threading.Event, grace_s: float, parent: int = 0
) -> int:
    """Wait for ``done``; stop COMMAND's group (SIGTERM, SIGKILL after ``grace_s``); exit as COMMAND did."""
    while not done.wait(1.0):  # a timeout, so that signal handlers run promptly
        if parent and os.getppid() != parent:
            break
    if not exited.is_set():
        kill_group(process.pid, signal.SIGTERM)
        exited.wait(grace_s)
    kill_group(process.pid, signal.SIGKILL)  # the command, or what it left running after it exited
    code = process.wait()
    if code < 0:  # end as the command did, so the owner sees the same status
        with contextlib.suppress(OSError, ValueError):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        return 128 - code
    return code


def _command_preexec() -> None:
    """In the guard's child before it runs the command: a process group of its own, SIGKILL if the guard dies."""
    os.setpgid(0, 0)
    set_parent_death_signal(signal.SIGKILL)


if __name__ == "__main__" and sys.argv[1:2] == ["--guard"]:
    sys.exit(_guard(sys.argv[2:]))
if __name__ == "__main__" and sys.argv[1:2] == ["--watch-parent"]:
    sys.exit(_watch_parent(sys.argv[2:]))
