"""envkit train's help and flags (issue 23 items 2, 4): the defaults --help shows are the ones a run uses, the env is
positional as in play/validate/eval/sft (--env its alias), a --rl-* flag and its GRPOConfig twin are one entry, --help
stays short (TRL's other flags behind --help-all), and --eval-tasks works for seed-style classes."""

from __future__ import annotations

import json
import os
import re

import pytest
from test_train import SEED_FAST

from envkit.cli.app import build_parser, main

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def _entries(text: str) -> dict[str, str]:
    """Each help entry's text (continuation lines joined), keyed by its first flag."""
    entries: dict[str, str] = {}
    key = None
    for line in text.splitlines():
        if re.match(r"  (-|ENV)", line):
            key = line.split()[0].rstrip(",")
            key = "--env" if key == "ENV" else key
            entries[key] = line.strip()
        elif key is not None and line.startswith(" " * 10) and line.strip():
            entries[key] += " " + line.strip()
        else:
            key = None
    return entries


def _plain(value: object) -> str:
    """A parsed GRPOConfig value as the help writes it (enums by their value)."""
    return str(getattr(value, "value", value))


def _help(capsys, *flags: str) -> str:
    assert main(["train", *flags]) == 0
    return capsys.readouterr().out


# (flag, the GRPOConfig field, TRL's own default, envkit's): the five the issue names
ENVKIT_DEFAULTS = [
    ("--learning-rate", "learning_rate", "1e-06", "1e-05"),
    ("--beta", "beta", "0.0", "0.1"),
    ("--max-completion-length", "max_completion_length", "512", "128"),
    ("--save-strategy", "save_strategy", "steps", "no"),
    ("--output-dir", "output_dir", "None", "runs/envkit-train"),
]


POST_INIT_CHANGES = ("report_to", "dataloader_pin_memory", "pad_to_multiple_of")
"""GRPOConfig fields its own __post_init__ rewrites from the value given (report_to "none" becomes [], pin memory off
without a GPU, pad_to_multiple_of "auto" resolved)."""


@pytest.mark.parametrize("flag", ["--help", "--help-all", "-h"])
def test_help_shows_the_defaults_a_run_uses(flag, capsys):
    from envkit.adapters.trl.train import parse

    entries = _entries(_help(capsys, flag))
    _, config = parse(["guess-number", "--model", "m"])
    for option, field, trl_default, ours in ENVKIT_DEFAULTS:
        assert _plain(getattr(config, field)) == ours  # what a run uses
        assert f"(default: {ours})" in entries[option], entries[option]
        assert f"(default: {trl_default})" not in entries[option]
    # every entry that names a GRPOConfig default names the parsed one
    checked = 0
    for option, text in entries.items():
        found = re.search(r"\(default: ([^()]*)\)$", text)
        name = option.removeprefix("--").replace("-", "_")
        if found and hasattr(config, name) and name not in POST_INIT_CHANGES:
            assert found.group(1) == _plain(getattr(config, name)), (option, text)
            checked += 1
    assert checked >= (30 if flag == "--help-all" else 15)


def test_help_is_short_and_trls_flags_are_behind_help_all(capsys):
    short = _help(capsys, "--help")
    full = _help(capsys, "--help-all")
    assert len(short.splitlines()) < 120, len(short.splitlines())  # 1,175 lines before
    assert short.index("envkit flags") < short.index("TRL GRPOConfig flags") < short.index("--help-all")
    assert "--adam-beta1" not in short and "--adam-beta1" in full
    assert len(full.splitlines()) > len(short.splitlines()) + 300
    assert "--max_steps" not in full  # one spelling per flag (the underscore one still parses)


def test_twin_flags_are_one_entry(capsys):
    from envkit.adapters.trl.config import RL_TWINS

    text = _help(capsys, "--help-all")
    entries = _entries(text)
    for flag, twin in RL_TWINS.items():
        flag, twin = "--" + flag.replace("_", "-"), "--" + twin.replace("_", "-")
        assert entries[twin].startswith(f"{twin}, {flag} "), entries[twin]
        assert flag not in entries  # no entry of its own
        assert len(re.findall(rf"^  {re.escape(twin)}[ ,]", text, re.M)) == 1
    assert entries["--env-config"].startswith("--env-config, --rl-env-config JSON")
    assert "KL coefficient β" in entries["--beta"] and "(default: 0.1)" in entries["--beta"]


def test_train_is_a_subcommand_of_envkits_parser(capsys):
    parser = build_parser()
    args, rest = parser.parse_known_args(["train", "guess-number", "--model", "m", "--max-steps", "-1"])
    assert args.command == "train" and rest == ["guess-number", "--model", "m", "--max-steps", "-1"]
    assert "train" in parser.format_help()
    from rich.console import Console

    from envkit.cli.app import COMMANDS

    args.train_argv = ["--help"]  # train's flags reach envkit.adapters.trl.train through the subcommand's own entry
    assert COMMANDS["train"][1](args, Console()) == 0
    assert "envkit flags" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["guess-number", "--model", "m"],
        ["--model", "m", "guess-number"],
        ["--env", "guess-number", "--model", "m"],
        ["--env=guess-number", "--model", "m"],
        ["--no-lora", "guess-number", "--model", "m"],
        ["--max-steps", "-1", "guess-number", "--model", "m"],
        ["--lora-target-modules", "q_proj", "v_proj", "--model", "m", "guess-number"],
    ],
)
def test_env_is_positional_with_env_as_its_alias(argv):
    from envkit.adapters.trl.train import parse

    args, _ = parse(argv)
    assert args.env == "guess-number" and args.model == "m"
    assert args.no_lora == ("--no-lora" in argv)


def test_env_positional_beats_the_yaml_env_and_twice_on_the_command_line_is_one_line(tmp_path, capsys):
    from envkit.adapters.trl.train import parse

    path = tmp_path / "t.yaml"
    path.write_text("env: hotel-booking\n")
    assert parse(["guess-number", "--model", "m", "--config", str(path)])[0].env == "guess-number"
    assert main(["train", "guess-number", "--env", "hotel-booking", "--model", "m"]) == 2
    err = capsys.readouterr().err
    assert "the env is given twice" in err and err.count("\n") == 1, err


def test_seed_style_eval_tasks_evaluates_and_reports_the_overlap(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "seed"
    argv = [
        "train",
        "--rl-env-module",
        "seed_style_arithmetic",
        "--rl-env-class",
        "SeedArithmetic",
        "--rl-env-config",
        '{"cases": 8, "use_tools": false}',
        "--model",
        str(tiny_model_dir),
        "--output-dir",
        str(out),
        *SEED_FAST,
        "--eval-tasks",
        "4",
        "--disable-tqdm",
        "true",
    ]
    assert main(argv) == 0
    summary = json.loads((out / "eval_summary.json").read_text())
    # build_dataset's rows are the training tasks: every eval task is one of them, and it says so
    assert summary["eval_tasks_seen_in_training"] == 4
    assert 0.0 <= summary["before"]["mean_score"] <= 1.0 and 0.0 <= summary["after"]["mean_score"] <= 1.0
    assert summary["before"]["episodes"] == 4, summary["before"]
    text = capsys.readouterr().out
    assert "eval (4 of 4 tasks seen in training) before training" in text
    assert "which all train" in text


def test_seed_style_eval_tasks_default_is_zero_and_envkit_envs_32():
    from envkit.adapters.trl.train import DEFAULT_EVAL_TASKS, check_seed_style_flags, parse

    assert DEFAULT_EVAL_TASKS == 32
    args, _ = parse(["--rl-env-module", "seed_style_arithmetic", "--rl-env-class", "SeedArithmetic", "--model", "m"])
    assert args.eval_tasks is None  # run() resolves it: 0 for a seed-style class, 32 for an envkit env
    check_seed_style_flags(parse(["--rl-env-module", "m", "--rl-env-class", "C", "--eval-tasks", "3"])[0])
