"""envkit play: you play an episode (--interactive: typed turns on stdin, tool calls as JSON or name(arg=value)),
a model plays one (--model DIR, through the rollout engine), and the typed-turn parser on its own."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import envkit
from envkit.cli.app import main
from envkit.cli.play import TurnError, parse_turn


def play(monkeypatch, capsys, typed: str, *argv: str) -> tuple[int, str, str]:
    """``envkit play ... --interactive`` with ``typed`` as its stdin: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(typed))
    code = main(["play", *argv, "--interactive"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_typed_tool_calls_play_arithmetic_to_a_score(monkeypatch, capsys):
    env = envkit.make("arithmetic")
    env.reset(seed=4)
    answer = round(env.answer, 6)
    calculator = json.dumps({"name": "calculator", "arguments": {"expression": env.expression}})
    code, out, err = play(
        monkeypatch, capsys, f"{calculator}\nsubmit_answer(answer={answer})\n", "arithmetic", "--seed", "4"
    )
    assert code == 0 and err == ""
    assert "tools: calculator(expression), submit_answer(answer)" in out
    assert f"[tool:calculator] {env.calculator(env.expression)}" in out  # the env's reply to the JSON call
    assert f'→ submit_answer({{"answer": {answer}}})' in out  # the call syntax, parsed to its literal value
    assert out.rstrip().endswith("score 1.000 after 2 turns · ending: done")


def test_malformed_lines_are_one_error_line_each_and_the_prompt_comes_back(monkeypatch, capsys):
    bad = [
        ('{"name": "calculator"', "not valid JSON"),
        ('{"arguments": {"expression": "1"}}', 'a JSON tool call is an object with a "name"'),
        ('{"name": "calculator", "arguments": "1 + 1"}', '"arguments" of calculator must be a JSON object'),
        ("nope(x=1)", "no tool named 'nope' (tools: calculator, submit_answer)"),
        ('calculator(expression=__import__("os").getcwd())', "is not a literal"),
        ("calculator(expression=)", "cannot read that call"),
        ("calculator(1, 2)", "calculator takes 1 argument (expression)"),
        ("calculator(**{'expression': '1'})", "name each argument"),
        (":bogus", "unknown command :bogus"),
    ]
    typed = "\n".join(line for line, _ in bad) + "\n:oracle\n:oracle\n"
    code, out, err = play(monkeypatch, capsys, typed, "arithmetic", "--seed", "2")
    assert code == 0 and "Traceback" not in out + err
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert len(errors) == len(bad)
    for line, (_, message) in zip(errors, bad, strict=True):
        assert message in line
    assert out.count("agent> ") == len(bad) + 2  # each bad line was answered by the prompt again
    assert out.rstrip().endswith("score 1.000 after 2 turns · ending: done")  # the env saw only the oracle's turns


def test_quit_and_end_of_input_stop_without_a_score(monkeypatch, capsys):
    code, out, _ = play(monkeypatch, capsys, ":oracle\n:quit\n:oracle\n", "arithmetic")
    assert code == 0 and "stopped after 1 turns (the episode had not ended)" in out and "score" not in out
    code, out, _ = play(monkeypatch, capsys, "", "arithmetic")
    assert code == 0 and "stopped after 0 turns" in out


class RaisesInStep(envkit.Env):
    """An env with a bug: its step raises on every turn."""

    def reset(self, *, seed=None, options=None):
        return [{"role": "user", "content": "say hi"}], {}

    def step(self, action):
        raise RuntimeError("no reply table for 'hi'")

    def score(self) -> float:
        return 0.0

    def oracle(self):
        return {"role": "assistant", "content": "hi"}


@pytest.mark.parametrize("interactive", [True, False])
def test_an_env_that_raises_while_played_is_one_line_naming_where_not_a_traceback(monkeypatch, capsys, interactive):
    target = f"{Path(__file__).resolve()}:RaisesInStep"
    if interactive:
        code, out, err = play(monkeypatch, capsys, "hi\n", target)
    else:
        code = main(["play", target])
        out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in out + err
    (line,) = [line for line in out.splitlines() if line.startswith("error:")]
    assert "RaisesInStep.step() raised RuntimeError: no reply table for 'hi' at " in line
    assert f"{Path(__file__).name}:" in line and "the episode stops here" in line


def test_the_console_script_reads_turns_from_a_pipe_on_hotel_booking():
    """The installed ``envkit`` in a subprocess, its stdin a pipe: text turns, a tool call, then the oracle."""
    envkit_bin = Path(sys.executable).parent / "envkit"
    typed = "Hello, which dates?\n:tools\nsearch_hotels(city='Nowhere')\n" + ":oracle\n" * 30
    done = subprocess.run(
        [str(envkit_bin), "play", "hotel-booking", "--seed", "1", "--human"],
        input=typed, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "[assistant] Hello, which dates?" in done.stdout and "search_hotels(" in done.stdout
    assert done.stdout.rstrip().splitlines()[-1].startswith("score ")
    assert "ending: done" in done.stdout.splitlines()[-1]


def test_parse_turn_reads_literals_and_never_evaluates():
    env = envkit.make("hotel-booking")
    env.reset(seed=0)
    tools = env.tools
    turn = parse_turn("search_hotels('Lisbon'); get_hotel_details(hotel_id='H1')", tools)
    calls = [c["function"] for c in turn["tool_calls"]]
    first = next(t for t in tools if t["function"]["name"] == "search_hotels")
    parameter = next(iter(first["function"]["parameters"]["properties"]))
    assert (
        calls[0] == {"name": "search_hotels", "arguments": {parameter: "Lisbon"}}
        and calls[1]["name"] == "get_hotel_details"
    )
    openai_form = {"type": "function", "function": {"name": "get_hotel_details", "arguments": {"hotel_id": "H1"}}}
    assert parse_turn(json.dumps([openai_form]), tools)["tool_calls"][0]["function"] == openai_form["function"]
    assert parse_turn(":say get_hotel_details(hotel_id='H1')", tools) == {
        "role": "assistant",
        "content": "get_hotel_details(hotel_id='H1')",
    }
    assert parse_turn("Sure (I think so)", tools) == {"role": "assistant", "content": "Sure (I think so)"}
    assert parse_turn("calculator(x=1)", []) == {"role": "assistant", "content": "calculator(x=1)"}  # no tools
    for hostile in (
        "get_hotel_details(hotel_id=open('/etc/passwd').read())",
        "get_hotel_details(hotel_id=(1).__class__)",
    ):
        with pytest.raises(TurnError, match="not a literal"):
            parse_turn(hostile, tools)
    with pytest.raises(TurnError, match=r"write tool calls as name\(arg=value"):
        parse_turn("get_hotel_details(hotel_id='H1'); x = list_bookings()", tools)


def test_a_model_plays_one_episode(tiny_model_dir, capsys):
    argv = ["play", "arithmetic", "--model", str(tiny_model_dir), "--seed", "3", "--max-new-tokens", "8"]
    assert main([*argv, "--max-turns", "2"]) == 0
    out = capsys.readouterr().out
    env = envkit.make("arithmetic")
    question = env.reset(seed=3)[0][1]["content"]
    assert out.index("[system]") < out.index(question.split()[0]) < out.index("[assistant]")
    assert "(turn 1: the model said " in out
    last = out.rstrip().splitlines()[-1]
    assert last.startswith("score 0.000 after ") and "ending: " in last


def test_a_model_folder_without_a_tokenizer_plays_with_tokenizer(tiny_model_dir, tmp_path, capsys):
    """``--tokenizer`` was read only after the model folder's own tokenizer had loaded: a folder holding the weights
    alone failed with "no tokenizer" though the flag named one."""
    weights = tmp_path / "weights-only"
    weights.mkdir()
    for name in ("config.json", "generation_config.json", "model.safetensors"):
        if (tiny_model_dir / name).exists():
            shutil.copy(tiny_model_dir / name, weights / name)
    argv = ["play", "arithmetic", "--model", str(weights), "--tokenizer", str(tiny_model_dir), "--max-new-tokens", "4"]
    assert main([*argv, "--max-turns", "1"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.rstrip().splitlines()[-1].startswith("score ")


@pytest.mark.parametrize(
    "flag",
    [
        ["--max-turns", "0"],
        ["--max-turns", "1"],
        ["--temperature", "0.5"],
        ["--tokenizer", "t"],
        ["--torch-threads", "3"],
    ],
)
def test_a_model_only_flag_without_a_model_is_refused_instead_of_ignored(flag, capsys):
    """The oracle played its whole episode under ``--max-turns 0`` (or 1), which only a model playing reads."""
    assert main(["play", "arithmetic", *flag]) == 2
    assert capsys.readouterr().err == (
        f"error: {flag[0]} is for a model playing (--model DIR); the oracle and --interactive ignore it\n"
    )


def test_the_model_only_flags_are_named_with_the_parsers_own_defaults():
    from envkit.cli.app import build_parser
    from envkit.cli.play import MODEL_ONLY_DEFAULTS

    play = build_parser()._subparsers._group_actions[0].choices["play"]
    assert {name: play.get_default(name) for name in MODEL_ONLY_DEFAULTS} == MODEL_ONLY_DEFAULTS


def test_max_chars_below_1_is_refused(capsys):
    """``--max-chars -5`` cut every message 5 characters from its end (a Python slice)."""
    assert main(["play", "arithmetic", "--max-chars", "-5"]) == 2
    assert capsys.readouterr().err == "error: --max-chars must be at least 1, got -5\n"


def test_a_model_playing_gets_at_least_one_turn(capsys):
    assert main(["play", "arithmetic", "--model", "/no/such/model", "--max-turns", "0"]) == 2
    assert capsys.readouterr().err == "error: --max-turns must be at least 1, got 0\n"


def test_model_and_interactive_are_one_or_the_other(capsys):
    assert main(["play", "arithmetic", "--model", "x", "--interactive"]) == 2
    assert "not allowed with argument --model (see envkit play --help)" in capsys.readouterr().err
    assert main(["play", "arithmetic", "--model", "/no/such/model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_a_sampling_flag_out_of_range_is_one_line_before_the_model_loads(capsys):
    """A negative --temperature used to play greedily without a word."""
    assert main(["play", "arithmetic", "--model", "/no/such/model", "--temperature", "-1"]) == 2
    err = capsys.readouterr().err
    assert err == "error: --temperature must be 0 (greedy) or more, got -1\n"
