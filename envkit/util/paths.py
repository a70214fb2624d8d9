"""Where a command writes, checked before anything loads and without leaving anything behind: a folder that cannot
be created, or one that cannot be written to, is a user's mistake that would otherwise end the command in a traceback
once the model had loaded (the trainer creates its output folder when it is built). A folder's writability is probed
by creating and removing a temporary file in it: ``os.access`` says yes to root for any folder, ``/proc`` included,
and ML jobs often run as root in a container."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


class OutputPathError(ValueError):
    """An output path a command cannot write to; the message (one line) names the flag, the path and why."""


def check_output_folder(path: str | os.PathLike[str], flag: str) -> Path:
    """Check that the folder ``path`` can be written to, or created (its nearest existing ancestor is a writable
    folder); raise :class:`OutputPathError` naming ``flag`` when not. Nothing is left behind. Returns the folder."""
    folder = Path(path)
    if folder.exists():
        if not folder.is_dir():
            raise OutputPathError(f"{flag} {folder}: a file is there, not a folder")
        if not _can_write_in(folder):
            raise OutputPathError(f"{flag} {folder}: the folder is not writable")
        return folder
    ancestor = folder.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputPathError(f"{flag} {folder}: cannot create the folder ({ancestor} is a file)")
    if not _can_write_in(ancestor):
        raise OutputPathError(f"{flag} {folder}: cannot create the folder ({ancestor} is not writable)")
    return folder


def _can_write_in(folder: Path) -> bool:
    """Whether a file can be created in ``folder``: one is, and removed at once."""
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".envkit-write-check-"):
            return True
    except OSError:
        return False


def check_not_the_model(path: str | os.PathLike[str], model: str | None, flag: str) -> None:
    """Refuse an output folder that is the ``--model`` folder itself: saving would overwrite the model the run starts
    from (raise :class:`OutputPathError` naming ``flag``)."""
    if model and Path(model).expanduser().is_dir() and Path(path).expanduser().resolve() == Path(model).resolve():
        raise OutputPathError(
            f"{flag} {path} is the --model folder: saving there would overwrite the model this run starts from; "
            "give another folder"
        )


def check_output_file(path: str | os.PathLike[str], flag: str) -> Path:
    """Check that the file ``path`` can be written: not a folder, in a folder that can be written to or created (as
    :func:`check_output_folder`), and writable if it is there. Raise :class:`OutputPathError` naming ``flag``.
    Nothing is left behind. Returns the path."""
    file = Path(path)
    if file.is_dir():
        raise OutputPathError(f"{flag} {file}: a folder is there; give a file name")
    parent = file.absolute().parent
    if not parent.is_dir():
        check_output_folder(parent, flag)  # to be created: its nearest existing folder must take it
    elif not _can_write_in(parent):
        raise OutputPathError(f"{flag} {file}: cannot write in {parent}")
    if file.exists() and not os.access(file, os.W_OK):
        raise OutputPathError(f"{flag} {file}: the file is not writable")
    return file
