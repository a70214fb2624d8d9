"""A process of a multi-process gloo run ends without the abort at interpreter exit (``terminate called without an
active exception``) through :func:`envkit.util.process_exit.exit_without_finalizing`, and still runs its ``atexit``
handlers and flushes its output; the ``envkit`` console script and ``python -m envkit.cli`` end that way when they are
one of several processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import free_port

from envkit.util.process_exit import in_several_processes

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

pytestmark = pytest.mark.slow


def _two_ranks(how: str, out: Path) -> list[subprocess.CompletedProcess]:
    port = str(free_port())
    processes = [
        subprocess.Popen(
            [sys.executable, str(HERE / "gloo_exit_script.py"), how, str(out)],
            env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "RANK": str(r), "WORLD_SIZE": "2"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in (0, 1)
    ]
    results = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=120)
        results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return results


def test_a_gloo_process_exits_cleanly_through_the_helper_where_a_normal_exit_aborts(tmp_path):
    plain, helped = tmp_path / "return", tmp_path / "helper"
    plain.mkdir()
    helped.mkdir()
    # The failure it prevents, reproduced: a normal exit aborts while the gloo thread runs Python.
    for result in _two_ranks("return", plain):
        assert result.returncode != 0, result.stderr[-2000:]
        assert "terminate called without an active exception" in result.stderr, result.stderr[-2000:]
    for rank, result in enumerate(_two_ranks("helper", helped)):
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout == f"done {rank} True"  # flushed, and the process knew it was one of several
        assert (helped / f"atexit-{rank}").read_text() == "ran"


def test_one_process_is_not_several(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not in_several_processes()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert not in_several_processes()
    monkeypatch.setenv("WORLD_SIZE", "2")
    import torch.distributed  # noqa: F401

    assert in_several_processes()


# What pip's generated console script does with the entry point, plus an object whose __del__ runs only in
# interpreter finalization: "finalized" on stdout says the process went through it.
CONSOLE_SCRIPT = """
import importlib, os, sys
import torch.distributed

class Witness:
    def __del__(self, write=os.write):
        write(1, b"finalized")

witness = Witness()
module, _, name = sys.argv[1].partition(":")
sys.argv = ["envkit"]
sys.exit(getattr(importlib.import_module(module), name)())
"""


def _console_entry_point() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    found = re.search(r'^envkit\s*=\s*"([^"]+)"', section, re.MULTILINE)
    assert found, section
    return found.group(1)


@pytest.mark.parametrize("world_size", ["1", "2"])
def test_the_console_script_ends_one_of_several_processes_without_finalizing(world_size):
    entry = _console_entry_point()
    result = subprocess.run(
        [sys.executable, "-c", CONSOLE_SCRIPT, entry],
        env={**os.environ, "WORLD_SIZE": world_size},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr[-2000:]  # `envkit` alone: the help, exit code 2 (usage)
    assert "usage: envkit" in result.stdout  # flushed before os._exit
    assert result.stdout.endswith("finalized") == (world_size == "1"), (entry, result.stdout[-200:])


def test_main_returns_its_exit_code_in_several_processes(monkeypatch, capsys):
    import torch.distributed  # noqa: F401

    from envkit.cli import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main([]) == 2  # in-process callers get the code back; only the console script ends the process
    assert "usage: envkit" in capsys.readouterr().out
