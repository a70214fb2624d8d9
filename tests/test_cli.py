"""The envkit command line: help, list, play, and one-line errors with exit code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from envkit.cli.app import main

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


# ---- --config FILE.yaml (the command's options) and --env-config JSON (the env's constructor arguments) -------------
JSON_DEPRECATION = "--config with JSON is deprecated; use --env-config"


def _yaml(tmp_path, text: str, name: str = "options.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_play_config_yaml_sets_the_options_and_the_command_line_wins(tmp_path, capsys):
    options = _yaml(
        tmp_path, "env: hotel-booking\nseed: 3\nmax-chars: 2000\noptions: {tier: hard, kind: hidden_confirm}\n"
    )
    assert main(["play", "--config", options, "--seed", "7"]) == 0
    captured = capsys.readouterr()
    assert "How many guests" in captured.out and "score 1.000" in captured.out  # the file's options reached reset
    assert "G-7186" in captured.out and "G-3164" not in captured.out  # seed 7's guest, not the file's seed 3
    assert JSON_DEPRECATION not in captured.err
    assert main(["play", "--config", options]) == 0  # ENV from the file: no positional needed
    assert "G-3164" in capsys.readouterr().out


def test_play_env_config_and_the_deprecated_json_config(capsys):
    assert main(["play", "hotel-booking", "--env-config", '{"tier": "impossible"}']) == 2
    captured = capsys.readouterr()
    assert "unknown tier 'impossible'" in captured.err and JSON_DEPRECATION not in captured.err
    assert main(["play", "hotel-booking", "--env-config", '{"tier": "hard"}']) == 0
    assert JSON_DEPRECATION not in capsys.readouterr().err
    # The old JSON --config: still works for one release, with one warning line.
    assert main(["play", "hotel-booking", "--seed", "7", "--config", '{"tier": "hard"}']) == 0
    captured = capsys.readouterr()
    assert "score 1.000" in captured.out
    assert [line for line in captured.err.splitlines() if line] == [f"warning: {JSON_DEPRECATION}"]


def test_validate_config_yaml_and_env_config(tmp_path, capsys):
    import json

    options = _yaml(tmp_path, "env: guess-number\nepisodes: 3\njson: true\nenv_config: {low: 1, high: 32}\n")
    assert main(["validate", "--config", options]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["target"] == "guess-number" and captured.err == ""
    bad = _yaml(tmp_path, "env: hotel-booking\nenv-config: {tier: legendary}\n", "bad.yaml")
    assert main(["validate", "--config", bad]) == 2  # the file's env-config reaches the constructor
    assert "unknown tier 'legendary'" in capsys.readouterr().err
    assert main(["validate", "hotel-booking", "--env-config", '{"tier": "legendary"}']) == 2
    assert "unknown tier 'legendary'" in capsys.readouterr().err
    assert main(["validate", "hotel-booking", "--config", '{"tier": "legendary"}']) == 2
    err = capsys.readouterr().err
    assert JSON_DEPRECATION in err and "unknown tier 'legendary'" in err


def test_eval_config_yaml_supplies_required_options_and_the_command_line_wins(tiny_model_dir, tmp_path, capsys):
    import json

    options = _yaml(
        tmp_path,
        f"env: guess-number\nmodel: {tiny_model_dir}\ntasks: 3\nmax_new_tokens: 8\nmax-turns: 2\njson: true\n"
        "env_config: {low: 1, high: 32}\n",
    )
    assert main(["eval", "--config", options, "--tasks", "2"]) == 0  # --model comes from the file
    assert json.loads(capsys.readouterr().out)["episodes"] == 2
    assert main(["eval", "--config", options, "--env-config", '{"low": 5, "high": 1}']) == 2
    assert "cannot build" in capsys.readouterr().err


def test_sft_config_yaml_and_env_config(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "warm"
    options = _yaml(
        tmp_path,
        f"env: guess-number\nmodel: {tiny_model_dir}\noutput-dir: {out}\nepisodes: 4\nsteps: 10\n"
        "env_config: {low: 1, high: 32}\n",
    )
    assert main(["sft", "--config", options, "--steps", "2"]) == 0
    printed = capsys.readouterr().out
    assert "4 oracle episodes" in printed and f"saved to {out}" in printed and (out / "model.safetensors").is_file()
    bad = _yaml(tmp_path, f"env: hotel-booking\nmodel: {tiny_model_dir}\noutput-dir: {out}\n", "bad.yaml")
    assert main(["sft", "--config", bad, "--env-config", '{"tier": "impossible"}']) == 2
    assert "unknown tier 'impossible'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["sft", "rft", "train"])
def test_an_output_folder_that_is_the_model_folder_is_refused_before_anything_loads(command, tiny_model_dir, capsys):
    """Saving there would overwrite the model the run starts from; ``sft --output-dir MODEL`` did, silently."""
    before = sorted((p.name, p.stat().st_mtime_ns) for p in Path(tiny_model_dir).iterdir())
    argv = [command, "arithmetic", "--model", str(tiny_model_dir), "--output-dir", str(tiny_model_dir)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: --output-dir {tiny_model_dir} is the --model folder: saving there would overwrite the model this "
        "run starts from; give another folder\n"
    )
    assert sorted((p.name, p.stat().st_mtime_ns) for p in Path(tiny_model_dir).iterdir()) == before


@pytest.mark.parametrize("argv", [["list", "--names"], ["train", "--help-all"]])
def test_a_reader_that_stops_reading_ends_the_command_quietly(argv):
    """``envkit list | head -1``: the reader closes the pipe before the command writes; it ended in a
    BrokenPipeError traceback, and ends quietly now, with SIGPIPE's conventional code."""
    import subprocess
    import sys

    process = subprocess.Popen(
        [sys.executable, "-m", "envkit.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    process.stdout.close()  # before the interpreter has even started the command
    err = process.stderr.read()
    assert process.wait(timeout=300) == 141 and err == "", err


def test_bad_config_files_are_one_line_and_exit_2(tmp_path, capsys):
    cases = [
        (["play", "--config", _yaml(tmp_path, "env: hotel-booking\nbogus: 1\n", "a.yaml")], "unknown keys in"),
        (["play", "--config", _yaml(tmp_path, "env: hotel-booking\nseed: x\n", "b.yaml")], "seed: invalid int value"),
        # The scalar rule envkit train's --config uses too: the same words for the same mistake.
        (
            ["play", "--config", _yaml(tmp_path, "env: hotel-booking\nseed: 2.5\n", "f.yaml")],
            "seed: must be a whole number",
        ),
        (["validate", "--config", _yaml(tmp_path, "- 1\n", "c.yaml")], "must hold a YAML mapping"),
        (["validate", "--config", _yaml(tmp_path, "json: maybe\n", "d.yml")], "json: must be true or false"),
        (["eval", "--config", _yaml(tmp_path, "backend: nope\n", "e.yaml")], "backend: must be one of"),
        (["sft", "--config", str(tmp_path / "missing.yaml")], "cannot read --config"),
        # An empty value is YAML's null: a traceback deep inside before (None + 1), for an option that has a value.
        (["eval", "--config", _yaml(tmp_path, "env: arithmetic\nmodel: m\nseed:\n", "n.yaml")], "seed: needs a value"),
        (["validate", "--config", _yaml(tmp_path, "env: arithmetic\nepisodes:\n", "v.yaml")], "episodes: needs a val"),
        # YAML reads an unquoted date as a date, which no JSON object holds: a TypeError traceback before.
        (
            ["validate", "--config", _yaml(tmp_path, "env: arithmetic\nenv_config:\n  when: 2024-01-02\n", "t.yaml")],
            "env_config: must hold JSON values only (text, numbers, true/false, null, lists, mappings): quote a date",
        ),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)


def test_an_options_file_is_read_as_yaml_whatever_its_name_ends_with(tmp_path, capsys):
    """``--config opts.txt`` was taken for the deprecated JSON text: its options were never read (``--model`` was
    "required"), or the path was "not valid JSON". Any value not starting with ``{`` is a file of options now."""
    assert _parsed(["eval", "--config", _yaml(tmp_path, "env: arithmetic\nmodel: m\ntasks: 3\n", "o.txt")]).tasks == 3
    as_json = _yaml(tmp_path, '{"env": "arithmetic", "model": "m", "seed": 4}', "o.json")
    assert _parsed(["eval", "--config", as_json]).seed == 4
    missing = tmp_path / "missing.txt"
    assert main(["eval", "arithmetic", "--model", "m", "--config", str(missing)]) == 2
    assert capsys.readouterr().err == f"error: cannot read --config {missing}: No such file or directory\n"


def test_a_command_line_mistake_is_one_line_naming_the_commands_help(capsys):
    """argparse printed its usage block, then ``envkit eval: error: …``, and exited the process (SystemExit out of
    ``main``); every command now says one line, as ``envkit train`` does, and ``main`` returns 2."""
    cases = [
        (["eval", "arithmetic"], "the following arguments are required: --model (see envkit eval --help)"),
        (["eval", "arithmetic", "--model", "m", "--tasks", "x"], "argument --tasks: invalid int value: 'x' (see "),
        (["validate", "arithmetic", "--bogus"], "unrecognized arguments: --bogus (see envkit validate --help)"),
        (["model", "tiny"], "the following arguments are required: DIR (see envkit model tiny --help)"),
        (["nosuch"], "argument COMMAND: invalid choice: 'nosuch' (choose from 'list', "),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"error: {message}") and err.count("\n") == 1, (argv, err)


def test_options_that_are_one_or_the_other_stay_so_when_a_config_file_gives_one(tmp_path, capsys):
    """argparse checks a mutually exclusive group on the command line only: ``interactive: true`` in the file and
    ``--model DIR`` typed played the model without a word. The same option from both places is not a conflict (the
    command line wins), nor are two options that set one value (serve-env's --expose-oracle / --no-oracle)."""
    interactive = _yaml(tmp_path, "interactive: true\n", "i.yaml")
    assert main(["play", "arithmetic", "--config", interactive, "--model", "m"]) == 2
    assert (
        capsys.readouterr().err
        == f"error: interactive in --config {interactive} and --model are one or the other: give one\n"
    )
    both = _yaml(tmp_path, "interactive: true\nmodel: m\n", "b.yaml")
    assert main(["play", "arithmetic", "--config", both]) == 2
    assert "are one or the other: give one" in capsys.readouterr().err
    assert (
        _parsed(["play", "arithmetic", "--config", _yaml(tmp_path, "model: m\n", "m.yaml"), "--model", "n"]).model
        == "n"
    )
    exposed = _yaml(tmp_path, "env: arithmetic\nexpose_oracle: true\n", "e.yaml")
    assert _parsed(["serve-env", "--config", exposed, "--no-oracle"]).expose_oracle is False


def test_validate_writes_only_its_error_line_to_a_stderr_that_is_no_terminal(capsys):
    """The progress bar (transient) ended with a bare newline before ``error:`` in a log or a pipe."""
    assert main(["validate", "arithmetic", "--env-config", '{"bogus": 1}']) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: constructing the env failed: TypeError: ") and err.count("\n") == 1, repr(err)


def _parsed(argv: list[str]):
    """argv as ``main`` parses it (``--config FILE.yaml`` applied first), without running the command."""
    from envkit.cli.app import build_parser
    from envkit.util.options import apply_options_file

    parser = build_parser()
    return parser.parse_args(apply_options_file(parser, argv))


def test_env_config_and_rl_env_config_together_are_one_usage_error(tmp_path, capsys):
    message = "error: --env-config and --rl-env-config are the same option; give one\n"
    both = ["--env-config", '{"tier": "hard"}', "--rl-env-config", '{"tier": "easy"}']
    assert main(["validate", "hotel-booking", *both]) == 2
    assert capsys.readouterr().err == message
    options = _yaml(tmp_path, "env: hotel-booking\nenv_config: {tier: hard}\n")  # one from the file, one typed
    assert main(["validate", "--config", options, "--rl-env-config", '{"tier": "easy"}']) == 2
    assert capsys.readouterr().err == message


def test_yaml_env_config_is_merged_key_by_key_with_the_command_lines(tmp_path):
    from envkit.cli.commands import env_config_from_args

    options = _yaml(tmp_path, "env: guess-number\nenv_config: {low: 1, high: 32}\n")
    args = _parsed(["validate", "--config", options, "--env-config", '{"high": 8, "extra": true}'])
    assert env_config_from_args(args) == {"low": 1, "high": 8, "extra": True}  # the command line wins key by key
    assert env_config_from_args(_parsed(["validate", "--config", options])) == {"low": 1, "high": 32}
    alias = _yaml(tmp_path, "env: guess-number\nrl-env-config: {low: 1, high: 32}\n", "alias.yaml")
    args = _parsed(["validate", "--config", alias, "--rl-env-config", '{"high": 8}'])
    assert env_config_from_args(args) == {"low": 1, "high": 8}


def test_eval_base_url_on_the_command_line_replaces_the_files_list(tmp_path):
    options = _yaml(tmp_path, "env: guess-number\nmodel: m\nbase_url: [http://a:1, http://b:2]\n")
    assert _parsed(["eval", "--config", options]).base_url == ["http://a:1", "http://b:2"]
    assert _parsed(["eval", "--config", options, "--base-url", "http://c:3"]).base_url == ["http://c:3"]
    argv = ["eval", "--config", options, "--base-url", "http://c:3", "--base-url", "http://d:4"]
    assert _parsed(argv).base_url == ["http://c:3", "http://d:4"]
    assert _parsed(["eval", "guess-number", "--model", "m"]).base_url is None


def test_play_takes_the_rl_env_config_alias(capsys):
    from envkit.cli.commands import env_config_from_args

    args = _parsed(["play", "hotel-booking", "--rl-env-config", '{"tier": "hard"}'])
    assert env_config_from_args(args) == {"tier": "hard"}
    assert main(["play", "hotel-booking", "--rl-env-config", '{"tier": "impossible"}']) == 2
    assert "unknown tier 'impossible'" in capsys.readouterr().err


def test_serve_env_takes_the_rl_env_config_alias_and_a_yaml_config(tmp_path, capsys, monkeypatch):
    from envkit.cli.commands import env_config_from_args

    pytest.importorskip("openenv", reason="openenv is not installed: pip install -e '.[openenv]'")
    options = _yaml(tmp_path, "env: hotel-booking\nport: 0\nmax-sessions: 3\nenv_config: {tier: hard}\n")
    args = _parsed(["serve-env", "--config", options, "--env-config", '{"kind": "hidden_confirm"}'])
    assert (args.env, args.port, args.max_sessions) == ("hotel-booking", 0, 3)
    assert env_config_from_args(args) == {"tier": "hard", "kind": "hidden_confirm"}
    assert env_config_from_args(_parsed(["serve-env", "hotel-booking", "--rl-env-config", '{"tier": "hard"}'])) == {
        "tier": "hard"
    }
    # serve-env builds its app with _env_config's result (stopped here before it listens).
    import envkit.adapters.openenv.server as openenv_server
    from envkit.registry import EnvSpecError

    seen = []

    def fake_app(env, config, **kwargs):
        seen.append((env, config))
        raise EnvSpecError("stopped before listening")

    monkeypatch.setattr(openenv_server, "create_envkit_app", fake_app)
    assert main(["serve-env", "--config", options, "--rl-env-config", '{"tier": "easy"}']) == 2
    assert "the same option" in capsys.readouterr().err and seen == []
    assert main(["serve-env", "--config", options]) == 2
    assert seen == [("hotel-booking", {"tier": "hard"})] and "stopped before listening" in capsys.readouterr().err


def test_merge_env_config_is_the_one_rule_for_env_config_and_its_alias():
    from envkit.registry import EnvSpecError, merge_env_config

    # The --config file's mapping, then the command line's JSON over it, key by key.
    assert merge_env_config({"env_config": '{"tier": "easy"}'}, {"env_config": {"tier": "hard", "seed": 3}}) == {
        "tier": "easy",
        "seed": 3,
    }
    assert merge_env_config({"rl_env_config": '{"tier": "easy"}'}) == {"tier": "easy"}
    assert merge_env_config() == {}
    # One option under two names: both, from anywhere, is an error that names the fix.
    for command_line, config_file in (
        ({"env_config": "{}", "rl_env_config": "{}"}, None),
        ({"rl_env_config": "{}"}, {"env_config": {}}),
        (None, {"env_config": {}, "rl_env_config": {}}),
    ):
        with pytest.raises(EnvSpecError, match="same option; give one"):
            merge_env_config(command_line, config_file)
    with pytest.raises(EnvSpecError, match="--env-config must be a mapping"):
        merge_env_config(config_file={"env_config": [1, 2]})
    with pytest.raises(EnvSpecError, match="--rl-env-config is not valid JSON"):
        merge_env_config({"rl_env_config": "{tier: hard"})


def test_every_flag_of_every_subcommand_is_read_by_the_command_line():
    """A flag parsed and never read is a setting a user believes in and nothing honours. Every destination of every
    subcommand's parser must be read somewhere in envkit/cli or envkit/util (``args.NAME``, ``getattr(args, NAME)``,
    or the names ENV_CONFIG_NAMES reads for the env config); ``envkit train`` parses its own flags (its test:
    tests/test_train_help.py)."""
    import argparse
    import ast

    from envkit.cli.app import build_parser
    from envkit.util.options import ENV_CONFIG_NAMES

    read = set(ENV_CONFIG_NAMES)
    for source in [*(ROOT / "envkit" / "cli").glob("*.py"), *(ROOT / "envkit" / "util").glob("*.py")]:
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "args":
                read.add(node.attr)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr" and len(node.args) > 1:
                read.add(getattr(node.args[1], "value", None))  # a name given as a constant

    def parsers(parser: argparse.ArgumentParser, name: str = "envkit"):
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    yield from parsers(sub, f"{name} {sub_name}")

    unread = [
        f"{name} {'/'.join(action.option_strings) or action.dest}"
        for name, parser in parsers(build_parser())
        for action in parser._actions
        if not isinstance(action, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction))
        and action.dest not in read
    ]
    assert unread == []
