"""Where a command writes is checked before anything loads: an output path that cannot be written to used to end
eval, sft, rft and train in a traceback once the model had loaded (the trainer creates its folder when it is built).
(``envkit view`` checks its page itself: tests/test_view.py.)"""

from __future__ import annotations

import os

import pytest

from envkit.cli.app import main
from envkit.util.paths import OutputPathError, check_output_file, check_output_folder


@pytest.fixture
def blocked(tmp_path):
    """A path whose parent is a file: no folder can be created there, whoever runs the test (root included)."""
    (tmp_path / "a-file").write_text("")
    return tmp_path / "a-file" / "out"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["eval", "arithmetic", "--model", "/no/such/model", "--out", "{path}/episodes.jsonl"], "--out"),
        (["sft", "arithmetic", "--model", "/no/such/model", "--output-dir", "{path}"], "--output-dir"),
        (["rft", "arithmetic", "--model", "/no/such/model", "--output-dir", "{path}"], "--output-dir"),
        (["train", "--env", "arithmetic", "--model", "/no/such/model", "--output-dir", "{path}"], "--output-dir"),
    ],
)
def test_an_output_path_that_cannot_be_written_is_one_line_before_the_model_loads(argv, flag, blocked, capsys):
    argv = [a.format(path=blocked) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    # The model folder does not exist: an error naming it would mean the model was loaded first.
    assert err.startswith(f"error: {flag} {blocked}") and "cannot create the folder" in err and "is a file" in err, err
    assert err.count("\n") == 1


def test_output_paths_are_checked_without_creating_anything(tmp_path):
    assert check_output_folder(tmp_path / "runs" / "a", "--output-dir") == tmp_path / "runs" / "a"
    assert check_output_file(tmp_path / "evals" / "e.jsonl", "--out") == tmp_path / "evals" / "e.jsonl"
    assert list(tmp_path.iterdir()) == []  # a check, not a side effect: the command creates them when it writes
    with pytest.raises(OutputPathError, match="a folder is there; give a file name"):
        check_output_file(tmp_path, "--out")
    (tmp_path / "f").write_text("")
    with pytest.raises(OutputPathError, match="a file is there, not a folder"):
        check_output_folder(tmp_path / "f", "--output-dir")


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no file can be created")
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["eval", "arithmetic", "--model", "/no/such/model", "--out", "/proc/episodes.jsonl"], "cannot write in /proc"),
        (["sft", "arithmetic", "--model", "/no/such/model", "--output-dir", "/proc/out"], "(/proc is not writable)"),
        (["rft", "arithmetic", "--model", "/no/such/model", "--output-dir", "/proc/out"], "(/proc is not writable)"),
        (["train", "arithmetic", "--model", "/no/such/model", "--output-dir", "/proc/out"], "(/proc is not writable)"),
    ],
)
def test_a_folder_no_file_can_be_created_in_is_refused_for_root_too(argv, message, capsys):
    """``os.access`` says yes to root for /proc, so as root (a container's usual user) these passed the check and
    failed after the model loaded (FileNotFoundError from open or os.makedirs); the folder is probed by creating and
    removing a file now."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_the_write_probe_leaves_nothing_behind(tmp_path):
    (tmp_path / "runs").mkdir()
    check_output_folder(tmp_path / "runs", "--output-dir")
    check_output_file(tmp_path / "runs" / "e.jsonl", "--out")
    assert list((tmp_path / "runs").iterdir()) == []
