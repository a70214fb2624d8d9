"""The Java side of the ``textworld-express:`` and ``scienceworld:`` families: one JVM per env, started through py4j
from the JAR its PyPI package bundles, with a one-line error naming the fix when no Java runtime is installed."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
from typing import Any

from envkit.registry import EnvSpecError

JAVA_FIX = (
    "install a Java runtime (17 or newer), e.g. `sudo apt-get install default-jre-headless` on Debian/Ubuntu, or "
    "put `java` on PATH / set JAVA_HOME"
)
"""What the one-line error for a missing Java runtime tells the user to do."""


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
