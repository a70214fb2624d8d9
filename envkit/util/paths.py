"""Where a command writes, checked before anything loads: a folder that cannot be created, or one that cannot be
written to, is a user's mistake that would otherwise end the command in a traceback once the model had loaded (the
trainer creates its output folder when it is built), or lose an evaluation's episodes at the first one."""

from __future__ import annotations

import os
from pathlib import Path


class OutputPathError(ValueError):
    """An output path a command cannot write to; the message (one line) names the flag, the path and why."""


def ensure_output_folder(path: str | os.PathLike[str], flag: str) -> Path:
    """Create the folder ``path`` (and its parents) if it is not there, and check that it can be written to; raise
    :class:`OutputPathError` naming ``flag`` when it cannot. Returns the folder."""
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise OutputPathError(f"{flag} {folder}: a file is there, not a folder") from None
    except OSError as error:
        raise OutputPathError(f"{flag} {folder}: cannot create the folder ({error.strerror or error})") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"{flag} {folder}: the folder is not writable")
    return folder


def ensure_output_file(path: str | os.PathLike[str], flag: str) -> Path:
    """Check that the file ``path`` can be written: its folder is created if it is not there (as
    :func:`ensure_output_folder`), and ``path`` must not be a folder. The file itself is not created. Raise
    :class:`OutputPathError` naming ``flag``. Returns the path."""
    file = Path(path)
    if file.is_dir():
        raise OutputPathError(f"{flag} {file}: a folder is there; give a file name")
    ensure_output_folder(file.parent, flag)
    if file.exists() and not os.access(file, os.W_OK):
        raise OutputPathError(f"{flag} {file}: the file is not writable")
    return file
