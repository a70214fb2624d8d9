"""What the ``textworld-express:`` and ``scienceworld:`` families share: one JVM per env, started through py4j from
the JAR its PyPI package bundles, with a one-line error naming the fix when no Java runtime is installed
(:class:`JavaGame`); the env side around it (:class:`JavaGameEnv`: the official split, the turn limit, the system
prompt, the opening, the gold-path oracle, closing and copying); and how a reply names its command
(:func:`command_of`)."""

from __future__ import annotations

import contextlib
import hashlib
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


class JavaGame:
    """A JVM running a game's JAR, reached through a py4j gateway (the packages' own wrappers start theirs the same
    way); :attr:`jvm` is py4j's view of it. :meth:`close` ends the JVM, and so does this Python process's exit (py4j's
    ``die_on_exit``: the JVM exits when its stdin closes).

    Args:
        jar: The game's JAR.
        spec: The env spec, for error messages.
        heap: The JVM's maximum heap (``-Xmx``), e.g. ``"512m"``; ``None`` leaves Java's default (a quarter of the
            machine's memory, which a long-lived JVM grows into).
    """

    _start_lock = threading.Lock()

    def __init__(self, jar: str, spec: str, heap: str | None = None) -> None:
        from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway

        java = java_executable()
        if java is None:
            raise EnvSpecError(f"{spec} runs a Java game, and no Java runtime was found: {JAVA_FIX}")
        options = [f"-Xmx{heap}"] if heap else []
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
        self.gateway = JavaGateway(
            gateway_parameters=GatewayParameters(auto_field=True, port=port), java_process=process
        )
        self.jvm: Any = self.gateway.jvm

    def close(self) -> None:
        """Shut the gateway and end the JVM (idempotent)."""
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
        self.variation = -1
        self.task_description = ""

    def _start_jvm(self, jar: str) -> Any:
        """Start the env's JVM on ``jar`` (with the constructor's ``java_heap``); py4j's view of it."""
        self.java = JavaGame(jar, self.envkit_spec, heap=self._config["java_heap"])
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
        """End the env's JVM."""
        java = getattr(self, "java", None)
        if java is not None:
            java.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        """A copy with a JVM of its own, rebuilt from the spec and the episode so far (the game is deterministic given
        its seed and commands)."""
        actions = [m for m in self.messages if m.get("role") == "assistant"]
        return rebuild(self.envkit_spec, self._config, self._task_seed, self._options, actions)
