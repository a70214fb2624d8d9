"""The envkit command line: help, list, play, and one-line errors with exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from envkit.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_console_script_help_lists_the_subcommands():
    result = subprocess.run(
        [str(Path(sys.executable).parent / "envkit"), "--help"], capture_output=True, text=True, check=True
    )
    assert "play" in result.stdout and "list" in result.stdout


def test_play_runs_the_oracle_and_prints_the_score(capsys):
    assert main(["play", f"{ROOT / 'examples' / 'capitals.py'}:CapitalsEnv", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "lookup_capital" in out and "score 1.000" in out


def test_unknown_env_is_one_line_and_exit_2(capsys):
    assert main(["play", "no-such-env"]) == 2
    err = capsys.readouterr().err
    assert "error: unknown env 'no-such-env'" in err and "Traceback" not in err


def test_bad_json_config_is_one_line_and_exit_2(capsys):
    assert main(["play", f"{ROOT / 'examples' / 'capitals.py'}:CapitalsEnv", "--config", "{nope"]) == 2
    assert "--config is not valid JSON" in capsys.readouterr().err


def test_no_command_prints_help_and_exit_2(capsys):
    assert main([]) == 2
    assert "usage: envkit" in capsys.readouterr().out


def test_play_with_reset_options(capsys):
    assert (
        main(["play", "hotel-booking", "--seed", "7", "--options", '{"tier": "hard", "kind": "hidden_confirm"}']) == 0
    )
    out = capsys.readouterr().out
    assert "How many guests" in out and "score 1.000" in out


def test_bad_constructor_config_or_options_is_one_line_and_exit_2(capsys):
    assert main(["play", "hotel-booking", "--config", '{"tier": "impossible"}']) == 2
    assert "unknown tier 'impossible'" in capsys.readouterr().err
    assert main(["play", "hotel-booking", "--options", '{"tier": "impossible"}']) == 2
    assert "unknown tier 'impossible'" in capsys.readouterr().err
