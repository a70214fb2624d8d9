"""Where a command writes, checked before anything loads and without creating anything: a folder that cannot be
created, or one that cannot be written to, is a user's mistake that would otherwise end the command in a traceback
once the model had loaded (the trainer creates its output folder when it is built)."""

from __future__ import annotations

import os
from pathlib import Path


class OutputPathError(ValueError):
    """An output path a command cannot write to; the message (one line) names the flag, the path and why."""


def check_output_folder(path: str | os.PathLike[str], flag: str) -> Path:
    """Check that the folder ``path`` can be written to, or created (its nearest existing ancestor is a writable
    folder); raise :class:`OutputPathError` naming ``flag`` when not. Nothing is created. Returns the folder."""
    folder = Path(path)
    if folder.exists():
        if not folder.is_dir():
            raise OutputPathError(f"{flag} {folder}: a file is there, not a folder")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise OutputPathError(f"{flag} {folder}: the folder is not writable")
        return folder
    ancestor = folder.absolute().parent
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputPathError(f"{flag} {folder}: cannot create the folder ({ancestor} is a file)")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise OutputPathError(f"{flag} {folder}: cannot create the folder ({ancestor} is not writable)")
    return folder


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
    Nothing is created. Returns the path."""
    file = Path(path)
    if file.is_dir():
        raise OutputPathError(f"{flag} {file}: a folder is there; give a file name")
    check_output_folder(file.absolute().parent, flag)
    if file.exists() and not os.access(file, os.W_OK):
        raise OutputPathError(f"{flag} {file}: the file is not writable")
    return file
