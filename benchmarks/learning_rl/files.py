"""Writing a record whole: the one way the benchmark writes a file another process, or a resumed run, may read."""

from __future__ import annotations

import os
from pathlib import Path


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` whole or not at all: into a temporary file of this process, renamed over ``path``.
    A file that marks a checkpoint or a phase complete must never be found half-written after a cut, and a file that
    two runs on one output folder share (an experiment's ``args.json``, the report) must never be read half-written by
    one while the other writes it (the temporary's name holds the process id, so two writers never share one)."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    temporary.replace(path)
