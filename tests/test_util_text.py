"""envkit.util.text.one_line: an error quoted inside a one-line message."""

from __future__ import annotations

from envkit.util.text import one_line


def test_white_space_and_newlines_become_one_space():
    assert one_line("Traceback:\n  File 'x'\n\tValueError:   bad") == "Traceback: File 'x' ValueError: bad"


def test_a_long_text_is_cut_to_its_limit_ending_in_an_ellipsis():
    assert one_line("x" * 10, 10) == "x" * 10
    assert one_line("x" * 11, 10) == "x" * 9 + "…"
    assert len(one_line("word " * 500, 300)) == 300
    assert one_line("two words", 5) == "two…"  # no space before the ellipsis


def test_an_exception_without_a_message_gives_its_type_name():
    assert one_line(TimeoutError()) == "TimeoutError"
    assert one_line(ValueError("bad\nvalue")) == "bad value"
    assert one_line("") == ""
