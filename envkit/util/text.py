"""Text for messages that must stay on one line: an error quoted inside a log line or a one-line exit."""

from __future__ import annotations


def one_line(value: object, limit: int | None = None) -> str:
    """``str(value)`` on one line: every run of white space, newlines included, made one space. Longer than ``limit``
    characters, it is cut to ``limit`` at most, ending in "…" (white space before it dropped). An exception whose
    message is empty gives its type's name (``TimeoutError()`` says nothing else)."""
    text = " ".join(str(value).split())
    if not text and isinstance(value, BaseException):
        text = type(value).__name__
    if limit is not None and len(text) > limit:
        text = text[: max(limit - 1, 0)].rstrip() + "…"
    return text
