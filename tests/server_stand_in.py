"""A stand-in for vLLM's OpenAI server, for :class:`~envkit.adapters.vllm.servers.LocalServers` tests that check
how servers are started (their environment, arguments, logs) without vLLM.

``LocalServers`` runs ``PYTHON -m vllm.entrypoints.openai.api_server ARGS``, and probes ``PYTHON -c ...`` (whether it
can import envkit). :func:`stand_in_servers` gives it an interpreter that runs the probe on this test's Python and,
for the server, a script: ``prelude`` (any Python; ``argv`` and ``port`` are set), then an HTTP server that answers
every GET with 200 (healthy) on ``--port``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from envkit.adapters.vllm.servers import LocalServers

_HEAD = """
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
"""

_HEALTHY = """
class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def stand_in_servers(folder: Path, prelude: str, count: int = 1, **options: Any) -> LocalServers:
    """``LocalServers`` of ``count`` stand-in servers (scripts and logs under ``folder``); ``options`` are passed on."""
    script = folder / "stand_in.py"
    script.write_text(_HEAD + prelude + "\n" + _HEALTHY)
    python = folder / "python"
    probe = f'if [ "$1" = "-c" ]; then exec {sys.executable} "$@"; fi'  # has_envkit's probe: this test's Python
    python.write_text(f'#!/bin/sh\n{probe}\nshift 2\nexec {sys.executable} {script} "$@"\n')  # drop `-m module`
    python.chmod(0o755)
    defaults: dict[str, Any] = {"max_loras": 2, "max_lora_rank": 8, "timeout_s": 60}
    return LocalServers("model", count, python=str(python), log_dir=folder / "logs", **{**defaults, **options})
