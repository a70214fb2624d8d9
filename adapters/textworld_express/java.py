"""What the ``textworld-express:`` and ``scienceworld:`` families share: a JVM per env, started through py4j from the
JAR its PyPI package bundles, with a one-line error naming the fix when no Java runtime is installed
(:class:`JavaGame`), and, for a game that allows it (:attr:`JavaGameEnv.hands_on_jvm`), handed on when the env closes
to the next env of the same game (:data:`JVM_IDLE_SECONDS`); the env side around it (:class:`JavaGameEnv`: the
official split, the turn limit, the system prompt, the opening, the gold-path oracle, closing and copying); and how a
reply names its command (:func:`command_of`).

Why hand JVMs on: a JVM starts in about 0.4 s, but its first game object and first load take 2–5 s more (class
loading, then code the JIT has not compiled yet), and the engine and ``envkit validate`` build a fresh env for every
episode. On a JVM that played an episode, the next env builds its game in about 0.2 s and plays it faster
(``benchmarks/jvm_reuse.py``). Each env gets a game object of its own, loaded afresh. TextWorldExpress's episodes play
the same on a handed-on JVM as on a new one (its tests check it); ScienceWorld's do not (a JVM that loaded other games
lists some rooms' objects in another order), so its envs do not hand theirs on.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import math
import os
import re
import shutil
import subprocess
import threading
from typing import Any, ClassVar

from envkit.core.env import Env
from envkit.core.messages import Message
from envkit.registry import EnvSpecError

from .._adapted import SpecBuilt, rebuild

SPLITS = ("train", "dev", "test")
"""The official splits (folds) the games' task seeds draw from."""

JAVA_FIX = (
    "install a Java runtime (17 or newer), e.g. `sudo apt-get install default-jre-headless` on Debian/Ubuntu, or "
    "put `java` on PATH / set JAVA_HOME"
)
"""What the one-line error for a missing Java runtime tells the user to do."""

JVM_IDLE_SECONDS = 300.0
"""How long the JVM of a closed env waits, unused, for the next env of the same game (the same JAR, ``java`` and heap)
before it ends; ``0`` ends it with its env. Envs built while it waits take it instead of starting one."""

JVM_RETIRE_MIB = 512
"""A closed env's JVM resident in more memory than this (MiB) ends instead of waiting for the next env: a JVM grows
over many episodes into the heap Java allows it (a quarter of the machine's memory by default), so a long-lived one is
kept near what a one-episode JVM uses (TextWorldExpress's: 55–84 MiB)."""

OUT_OF_MEMORY_EXIT = 3
"""The exit code of a JVM that ran out of heap: every game JVM runs with ``-XX:+ExitOnOutOfMemoryError``, so one that
runs out ends there and then, instead of answering on with whatever the error left half-updated (and being handed on
to the next env)."""


class JavaOutOfMemory(RuntimeError):
    """A game's JVM ran out of heap during a call and exited (the message names the heap and the fix)."""


_ACTION_LINE = re.compile(r"^\s*action\s*:\s*(.*?)\s*$", re.IGNORECASE | re.MULTILINE)


def command_of(action: Message | str) -> str:
    """The game command in an assistant reply: the text after its last ``Action:`` line, else the whole content,
    stripped (``""`` for a reply with no text content).

    Args:
        action: The assistant message (or its text).
    """
    content = action.get("content") if isinstance(action, dict) else action
    if not isinstance(content, str):
        return ""
    lines = _ACTION_LINE.findall(content)
    return lines[-1] if lines else content.strip()


def java_executable() -> str | None:
    """The ``java`` that py4j would start: ``$JAVA_HOME/bin/java`` when that exists, else ``java`` on PATH; ``None``
    when there is neither."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("java")


logger = logging.getLogger(__name__)

JAVA_OPTION_VARIABLES = ("JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS")
"""Environment variables every JVM the ``java`` launcher starts reads options from, game JVMs included."""

_options_warned: set[tuple[str, str]] = set()


def _warn_about_inherited_java_options(spec: str) -> None:
    """Say, once per setting, that a game JVM starts with options from the environment: the options a JVM compiles
    with change what ScienceWorld plays (measured: ``-XX:TieredStopAtLevel=1`` gave other gold paths and scores, and
    different ones from run to run), so a seed's episode may not be the one it is elsewhere."""
    for name in JAVA_OPTION_VARIABLES:
        value = os.environ.get(name)
        if value and (name, value) not in _options_warned:
            _options_warned.add((name, value))
            logger.warning(
                "%s: the game's JVM starts with %s=%r from the environment; JVM options can change the games' play "
                "(ScienceWorld's with -XX:TieredStopAtLevel=1), so a seed may not play as it does elsewhere: unset "
                "%s for the games' usual play",
                spec,
                name,
                value,
                name,
            )


def _lift_inherited_cpu_limit(pid: int) -> None:
    """Give the JVM ``pid`` no CPU-time limit short of the hard one. In a worker under kernel limits (``envkit
    serve-env``'s ``--cpu-limit``, :class:`~envkit.util.children.ResourceLimits`) the JVM inherits the worker's soft
    ``RLIMIT_CPU``, which the worker renews per call for itself only: for the JVM it is a lifetime budget, and a JVM
    that plays episode after episode was killed by SIGXCPU once it had used it. A JVM stuck in a call is still ended
    by the call's deadline, which ends its worker's process group."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if soft != hard:
        with contextlib.suppress(OSError, ValueError):  # it has exited already
            resource.prlimit(pid, resource.RLIMIT_CPU, (hard, hard))


def _java_or_fail(spec: str) -> str:
    """:func:`java_executable`, or the one-line error naming the fix for ``spec`` when there is none."""
    java = java_executable()
    if java is None:
        raise EnvSpecError(f"{spec} runs a Java game, and no Java runtime was found: {JAVA_FIX}")
    return java


@functools.cache
def _counting_gateway() -> type:
    """py4j's ``JavaGateway`` with a client that counts the calls in flight (its ``counting_client``): a JVM is handed
    on only when none of its env's calls still runs. A call the JVM could not answer because it ran out of heap (its
    connection closed, or py4j's bare error answer, then exit code :data:`OUT_OF_MEMORY_EXIT`) raises
    :class:`JavaOutOfMemory` with the client's ``out_of_memory`` message; a bare error from a JVM that goes on waits
    up to 2 s for that exit code before py4j raises it as usual. Built on first use: py4j comes with the
    games' packages."""
    from py4j.java_gateway import GatewayClient, JavaGateway
    from py4j.protocol import ERROR as BARE_ERROR
    from py4j.protocol import Py4JNetworkError

    class CountingClient(GatewayClient):  # type: ignore[misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.calls_in_flight = 0
            self._count_lock = threading.Lock()
            self.java_process: subprocess.Popen[bytes] | None = None
            self.out_of_memory = "the game's JVM ran out of memory"

        def send_command(self, command: str, retry: bool = True, binary: bool = False) -> Any:
            with self._count_lock:
                self.calls_in_flight += 1
            try:
                response = super().send_command(command, retry, binary)
            except Py4JNetworkError:
                if self._exit_code() == OUT_OF_MEMORY_EXIT:
                    raise JavaOutOfMemory(self.out_of_memory) from None
                raise
            finally:
                with self._count_lock:
                    self.calls_in_flight -= 1
            # A JVM that runs out of heap in a call may first answer it with py4j's bare error (no exception to
            # return) and exit a moment later; py4j would raise that as "An error occurred while calling None.None".
            if response == BARE_ERROR and self._exit_code() == OUT_OF_MEMORY_EXIT:
                raise JavaOutOfMemory(self.out_of_memory)
            return response

        def _exit_code(self) -> int | None:
            """The JVM's exit code, waiting a moment for it (its socket closes as it exits); None while it runs. Once
            it has exited, the client counts as disconnected: py4j's finalizers of the JVM's objects then send
            nothing, instead of each logging a connection error with its traceback."""
            if self.java_process is None:
                return None
            try:
                code = self.java_process.wait(timeout=2)
            except subprocess.TimeoutExpired:
                return None
            self.is_connected = False
            return code

    class CountingGateway(JavaGateway):  # type: ignore[misc]
        def _create_gateway_client(self) -> CountingClient:
            self.counting_client = CountingClient(gateway_parameters=self.gateway_parameters)
            return self.counting_client

    return CountingGateway


class JavaGame:
    """A JVM running a game's JAR, reached through a py4j gateway (the packages' own wrappers start theirs the same
    way); :attr:`jvm` is py4j's view of it. :meth:`open` takes a waiting JVM of the same game or starts one;
    :meth:`release` hands it on or ends it; :meth:`close` ends it, and so does this Python process's exit (py4j's
    ``die_on_exit``: the JVM exits when its stdin closes).

    Args:
        jar: The game's JAR.
        spec: The env spec, for error messages.
        heap: The JVM's maximum heap (``-Xmx``), e.g. ``"512m"``; ``None`` leaves Java's default (a quarter of the
            machine's memory, which a long-lived JVM grows into).
    """

    _start_lock = threading.Lock()

    def __init__(self, jar: str, spec: str, heap: str | None = None) -> None:
        from py4j.java_gateway import GatewayParameters, launch_gateway

        java = _java_or_fail(spec)
        _warn_about_inherited_java_options(spec)
        self.key = (java, jar, heap)
        self.reusable = True  # whether release() may hand it on (see open())
        self.owner = os.getpid()  # a forked child's copy must not end the parent's JVM
        options = ["-XX:+ExitOnOutOfMemoryError", *([f"-Xmx{heap}"] if heap else [])]
        with self._start_lock:  # py4j reads the port from the child's stdout: one start at a time is simplest
            try:
                port, process = launch_gateway(
                    classpath=jar,
                    javaopts=options,
                    die_on_exit=True,
                    cwd=os.path.dirname(jar),
                    java_path=java,
                    return_proc=True,
                )
            except (OSError, ValueError) as error:  # ValueError: the JVM exited before printing its port
                raise EnvSpecError(f"{spec}: {java} could not start the game ({error}): {JAVA_FIX}") from None
        self.process: subprocess.Popen[bytes] = process
        _lift_inherited_cpu_limit(process.pid)
        self.gateway: Any = _counting_gateway()(
            gateway_parameters=GatewayParameters(auto_field=True, port=port), java_process=process
        )
        client = self.gateway.counting_client
        client.java_process = process
        client.out_of_memory = (
            f"{spec}: the game's JVM ran out of memory (its heap: {f'-Xmx{heap}' if heap else 'Java default'}) and "
            "exited: give the env a larger java_heap (e.g. java_heap='1g')"
        )
        self.jvm: Any = self.gateway.jvm

    @classmethod
    def open(cls, jar: str, spec: str, heap: str | None = None, *, reusable: bool = True) -> JavaGame:
        """A JVM for a new env: with ``reusable``, one of the same game waiting after its env closed
        (:data:`JVM_IDLE_SECONDS`), else a new one, which :meth:`release` may hand on; without, a new one that
        :meth:`release` ends. Other arguments as the constructor's."""
        if not reusable:
            game = cls(jar, spec, heap)
            game.reusable = False
            return game
        return _IDLE.take((_java_or_fail(spec), jar, heap)) or cls(jar, spec, heap)

    def idle(self) -> bool:
        """Whether the JVM is alive with no call in flight (what handing it on needs)."""
        gateway = self.gateway
        if gateway is None or self.process.poll() is not None:
            return False
        return gateway.counting_client.calls_in_flight == 0

    def resident_mib(self) -> float | None:
        """The JVM's resident memory in MiB (Linux's ``/proc``); ``None`` where that cannot be read."""
        try:
            with open(f"/proc/{self.process.pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except (OSError, ValueError, IndexError):
            pass
        return None

    def release(self) -> None:
        """Hand the JVM on to the next env of the same game (it waits :data:`JVM_IDLE_SECONDS`), or end it: when it
        is not :attr:`reusable`, busy or dead, resident in more than :data:`JVM_RETIRE_MIB`, or waiting is off."""
        handed_on = self.reusable and JVM_IDLE_SECONDS > 0 and self.idle()
        if handed_on and (self.resident_mib() or 0) <= JVM_RETIRE_MIB:
            _IDLE.put(self, JVM_IDLE_SECONDS)
        else:
            self.close()

    def answers(self) -> bool:
        """Whether the JVM answers a call (a JVM whose gateway died while its process lives does not)."""
        try:
            self.jvm.java.lang.System.nanoTime()
        except Exception:
            return False
        return True

    def close(self) -> None:
        """Shut the gateway and end the JVM (idempotent; nothing in a process forked from the one that started it)."""
        if getattr(self, "owner", os.getpid()) != os.getpid():
            return
        gateway, self.gateway = getattr(self, "gateway", None), None
        if gateway is not None:
            with contextlib.suppress(Exception):
                gateway.shutdown()
        process = getattr(self, "process", None)
        if process is not None and process.poll() is None:
            # py4j's own thread waits on the process (and reaps it): end it without waiting here.
            with contextlib.suppress(OSError):
                process.terminate()

    def __del__(self) -> None:
        self.close()


class _IdleJVMs:
    """The JVMs of closed envs, waiting for the next env of their game; each ends when its wait runs out. A process
    forked from this one starts with none (the parent's JVMs stay the parent's)."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._waiting: dict[tuple[str, str, str | None], list[tuple[JavaGame, threading.Timer | None]]] = {}

    def _own(self) -> None:
        """In a forked child, start afresh without ending anything: the JVMs are the parent's, and the lock may have
        been held at the fork (the child's one thread resets it before any other can start)."""
        if self._pid != os.getpid():
            self._pid, self._lock, self._waiting = os.getpid(), threading.Lock(), {}

    def put(self, game: JavaGame, seconds: float) -> None:
        """Keep ``game`` for the next :meth:`take` of its key, for at most ``seconds`` (``inf``: until taken or the
        process ends); a game already waiting is left as it is."""
        timer = threading.Timer(seconds, self._expire) if math.isfinite(seconds) else None
        if timer is not None:
            timer.args = (game, timer)  # an old timer that fires late must not end the game parked again
        self._own()
        with self._lock:
            waiting = self._waiting.setdefault(game.key, [])
            if any(entry[0] is game for entry in waiting):
                return
            waiting.append((game, timer))
        if timer is not None:
            timer.daemon = True
            timer.start()

    def take(self, key: tuple[str, str, str | None]) -> JavaGame | None:
        """The most recently parked JVM for ``key`` that is alive and answers, or ``None``; the others end."""
        self._own()
        while True:
            with self._lock:
                waiting = self._waiting.get(key)
                if not waiting:
                    return None
                game, timer = waiting.pop()
            if timer is not None:
                timer.cancel()
            if game.idle() and game.answers():
                return game
            game.close()

    def _expire(self, game: JavaGame, timer: threading.Timer) -> None:
        with self._lock:
            waiting = self._waiting.get(game.key, [])
            still = [entry for entry in waiting if entry != (game, timer)]
            if len(still) == len(waiting):
                return  # taken meanwhile
            self._waiting[game.key] = still
        game.close()

    def end_all(self) -> int:
        """End every waiting JVM now; how many there were."""
        self._own()
        with self._lock:
            entries = [entry for waiting in self._waiting.values() for entry in waiting]
            self._waiting = {}
        for game, timer in entries:
            if timer is not None:
                timer.cancel()
            game.close()
        return len(entries)


_IDLE = _IdleJVMs()


def end_idle_jvms() -> int:
    """End every JVM waiting for an env now (instead of after :data:`JVM_IDLE_SECONDS`); how many there were."""
    return _IDLE.end_all()


class JavaGameEnv(SpecBuilt, Env):
    """The env side of a game in a JVM of its own: what ``textworld-express:GAME`` and ``scienceworld:TASK`` envs
    share.

    A subclass's ``__init__`` calls this one with its constructor's arguments, checks its own, then starts the game
    with :meth:`_start_jvm`; its ``reset`` picks the episode's game with :meth:`_choose` and returns
    :meth:`_opening`; it implements ``step``, ``score`` and :meth:`_gold_path` (what :meth:`oracle` follows).

    Args:
        split: The official split the task seeds draw from: one of :data:`SPLITS`.
        max_turns: Assistant turns before the episode is truncated (:attr:`max_turns` by default).
        system_prompt: Replaces :attr:`default_system_prompt`; ``""`` sends no system message.
        java_heap: The JVM's maximum heap (``"256m"``); ``None`` for Java's default.
        game_config: The subclass's own constructor arguments, remembered with these (for copies and pickles).

    Raises:
        EnvSpecError: ``split`` is not one of :data:`SPLITS`.
    """

    max_turns: ClassVar[int] = 100
    default_system_prompt: ClassVar[str] = ""
    """The system message sent when the constructor's ``system_prompt`` is ``None``."""
    hands_on_jvm: ClassVar[bool] = True
    """Whether a closed env's JVM waits for the next env of the game (:meth:`JavaGame.release`): only for a game
    whose episodes play the same on a JVM that played others as on a new one."""

    def __init__(
        self, split: str, max_turns: int | None, system_prompt: str | None, java_heap: str | None, **game_config: Any
    ) -> None:
        super().__init__()
        self._remember(
            {
                "split": split,
                **game_config,
                "max_turns": max_turns,
                "system_prompt": system_prompt,
                "java_heap": java_heap,
            }
        )
        if split not in SPLITS:
            raise EnvSpecError(f"{self.envkit_spec}: split must be one of {', '.join(SPLITS)}, got {split!r}")
        self.split = split
        if max_turns is not None:
            self.max_turns = int(max_turns)  # type: ignore[misc]
        self.system_prompt = self.default_system_prompt if system_prompt is None else system_prompt
        self.java: JavaGame | None = None
        self.server: Any = None
        """The game's own object in the JVM (set by the subclass); ``None`` once the env is closed."""
        self.variation = -1
        self.task_description = ""

    def _start_jvm(self, jar: str) -> Any:
        """The env's JVM on ``jar`` (with the constructor's ``java_heap``): a closed env's, or a new one; py4j's view of
        it."""
        self.java = JavaGame.open(jar, self.envkit_spec, self._config["java_heap"], reusable=self.hands_on_jvm)
        return self.java.jvm

    def _choose(self, seed: int | None, options: dict[str, Any] | None, games: list[int]) -> None:
        """Record the episode's task seed (a random one when ``seed`` is None) and make its game,
        ``games[seed % len(games)]``, the :attr:`variation` played."""
        if seed is None:
            seed = int(self.np_random.integers(len(games)))
        self._started(seed, options)
        self.variation = games[int(seed) % len(games)]

    def _opening(self, observation: str, info: dict[str, Any], task: str) -> tuple[list[Message], dict[str, Any]]:
        """``reset``'s return: the system prompt, then the task description and ``observation`` as one user message;
        ``info`` with the split, the variation and ``task_id`` (a hash of ``task``, the string naming the game)."""
        opening: list[Message] = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        opening.append({"role": "user", "content": f"{self.task_description}\n\n{observation.strip()}"})
        task_id = hashlib.sha256(task.encode()).hexdigest()[:16]
        return opening, {**info, "split": self.split, "variation": self.variation, "task_id": task_id}

    def _gold_path(self, played: list[str]) -> list[str]:
        """The game's gold action sequence for the current episode, whose commands so far are ``played``."""
        raise NotImplementedError

    def oracle(self) -> Message | None:
        """The next command of the game's gold path, while the episode has followed it; else ``None``."""
        if self.done:
            return None
        played = [command_of(m) for m in self.messages if m.get("role") == "assistant"]
        gold = self._gold_path(played)
        if len(played) >= len(gold) or played != gold[: len(played)]:
            return None
        return {"role": "assistant", "content": gold[len(played)]}

    def close(self) -> None:
        """Let go of the env's JVM: with :attr:`hands_on_jvm` it waits for the next env of the same game, else it ends
        (:meth:`JavaGame.release`). Idempotent; the env cannot be played after."""
        java, self.java = getattr(self, "java", None), None
        self.server = None
        if java is not None:
            java.release()

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A copy with a JVM of its own, rebuilt from the spec and the episode so far (the game is deterministic given
        its seed and commands)."""
        actions = [m for m in self.messages if m.get("role") == "assistant"]
        return rebuild(self.envkit_spec, self._config, self._task_seed, self._options, actions)
