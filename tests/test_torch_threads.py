"""--torch-threads N|auto (eval, sft, train, play): the decision, and the flag reaching torch in a real eval run."""

from __future__ import annotations

import pytest
import torch

from envkit.adapters.trl.config import parse
from envkit.cli.app import main
from envkit.util.threads import TorchThreadsError, choose_torch_threads, parse_torch_threads


@pytest.fixture
def torch_threads():
    """Restore torch's thread count after a test that sets it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("setting", "load", "cores", "environ", "threads", "reason"),
    [
        ("auto", 11.2, 2, {}, 1, "load 11.2 on 2 cores"),  # busy: one thread waits at no barrier
        ("auto", 2.0, 2, {}, 1, "load 2.0 on 2 cores"),  # load == cores is busy already
        ("auto", 0.5, 2, {}, None, "torch's default"),
        ("auto", 30.0, 1, {}, None, "torch's default"),  # one core: one thread already
        ("auto", None, 4, {}, None, "no load average"),
        ("auto", 11.2, 2, {"OMP_NUM_THREADS": "2"}, 2, "OMP_NUM_THREADS"),  # the user's own choice is kept
        ("auto", 11.2, 2, {"OMP_NUM_THREADS": "x"}, 1, "load 11.2"),  # one torch ignores is ignored
        ("3", 11.2, 2, {"OMP_NUM_THREADS": "2"}, 3, "--torch-threads"),  # the flag wins over everything
        (4, 0.1, 8, {}, 4, "--torch-threads"),
    ],
)
def test_the_decision(setting, load, cores, environ, threads, reason):
    choice = choose_torch_threads(setting, load=load, cores=cores, environ=environ)
    assert choice.threads == threads
    assert reason in choice.reason
    assert choice.line(7).startswith(f"torch threads: {threads or 7} (")
    assert choice.line(7).endswith("; --torch-threads to choose)")


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_bad_values_are_refused(value):
    with pytest.raises(TorchThreadsError, match="--torch-threads must be auto or a positive integer"):
        parse_torch_threads(value)


def test_the_flag_reaches_torch_in_a_real_eval_run(tiny_model_dir, torch_threads, capsys):
    torch.set_num_threads(2)
    argv = ["eval", "arithmetic", "--model", str(tiny_model_dir), "--tasks", "1", "--max-new-tokens", "4"]
    assert main([*argv, "--torch-threads", "1"]) == 0
    assert torch.get_num_threads() == 1
    assert "torch threads: 1 (--torch-threads; --torch-threads to choose)" in capsys.readouterr().out
    assert main([*argv, "--torch-threads", "3", "--json"]) == 0
    assert torch.get_num_threads() == 3
    captured = capsys.readouterr()
    assert "torch threads: 3" in captured.err  # --json keeps stdout for the JSON
    assert "torch threads" not in captured.out


def test_a_bad_value_is_one_line(tiny_model_dir, torch_threads, capsys):
    code = main(["eval", "arithmetic", "--model", str(tiny_model_dir), "--tasks", "1", "--torch-threads", "many"])
    assert code == 2
    err = capsys.readouterr().err
    assert err == "error: --torch-threads must be auto or a positive integer, got 'many'\n"


def test_train_and_sft_and_play_take_the_flag(tmp_path, capsys):
    args, _ = parse(["arithmetic", "--model", "m", "--output-dir", str(tmp_path), "--torch-threads", "2"])
    assert args.torch_threads == "2"
    assert parse(["arithmetic", "--model", "m", "--output-dir", str(tmp_path)])[0].torch_threads == "auto"
    for command in (["sft", "arithmetic", "--model", "m", "--output-dir", "o"], ["play", "arithmetic", "--model", "m"]):
        assert main([*command, "--torch-threads", "0"]) == 2
        assert "--torch-threads must be auto or a positive integer" in capsys.readouterr().err
