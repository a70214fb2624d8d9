"""Seed-style classes (build_dataset / score_episode / get_tools) get the whole toolkit (issue 23 item 4): envkit play
and eval take --rl-env-module/--rl-env-class, train's tool loop runs on envkit's bundled ChatML template, and validate
fails a score that gives the maximum to an empty completion."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import accelerate_launch

import envkit
from envkit.cli.app import main

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
ROOT = Path(__file__).resolve().parents[1]
SEED_FLAGS = ["--rl-env-module", "seed_style_arithmetic", "--rl-env-class", "SeedArithmetic"]


def test_seed_style_class_runs_as_an_env_scored_by_score_episode():
    """The seed: spec the CLI uses: row seed % rows, its prompt the opening, get_tools()'s functions the tools, the
    score score_episode's value on the text after the opening."""
    from seed_style_arithmetic import SeedArithmetic

    cases = SeedArithmetic(cases=4).cases
    env = envkit.make("seed:seed_style_arithmetic:SeedArithmetic", cases=4)
    opening, info = env.reset(seed=6)  # row 2
    a, b = cases[2]
    assert opening == [{"role": "user", "content": f"What is {a} + {b}? Answer with the number."}]
    assert info == {"case_idx": 2} and [t["function"]["name"] for t in env.tools] == ["add"]
    call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
    new, _, done, _, info = env.step({"role": "assistant", "content": "", "tool_calls": [call]})
    assert new[0]["content"] == str(float(a + b)) and info["tool_errors"] == 0 and not done
    _, reward, done, _, _ = env.step({"role": "assistant", "content": f"It is {a + b}."})
    assert done and reward == 1.0 and env.score() == 1.0
    env.reset(seed=2)
    env.step({"role": "assistant", "content": "No idea."})
    assert env.score() == 0.0
    assert envkit.make("seed:seed_style_arithmetic:SeedArithmetic", cases=4, use_tools=False).tools == []


def test_play_takes_the_rl_env_flags(capsys):
    assert main(["play", "--rl-env-module", "capitals", "--rl-env-class", "CapitalsEnv", "--seed", "3"]) == 0
    assert "score 1.000" in capsys.readouterr().out
    assert main(["play", *SEED_FLAGS, "--rl-env-config", '{"cases": 4}', "--seed", "1"]) == 0
    out = capsys.readouterr().out
    from seed_style_arithmetic import SeedArithmetic

    a, b = SeedArithmetic(cases=4).cases[1]
    assert f"What is {a} + {b}?" in out and "seed-style: no oracle" in out and "tools: add" in out


def test_eval_takes_a_seed_style_class(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "episodes.jsonl"
    argv = ["eval", *SEED_FLAGS, "--rl-env-config", '{"cases": 4}', "--model", str(tiny_model_dir)]
    argv += ["--tasks", "2", "--samples", "2", "--max-new-tokens", "4", "--max-turns", "2", "--out", str(out), "--json"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    metrics = json.loads(printed[printed.index("{") :])
    assert metrics["env"] == "seed:seed_style_arithmetic:SeedArithmetic" and metrics["episodes"] == 4
    episodes = [json.loads(line) for line in out.read_text().splitlines()]
    from seed_style_arithmetic import SeedArithmetic

    a, b = SeedArithmetic(cases=4).cases[0]
    first = next(e for e in episodes if e["task_seed"] == 0)
    assert first["messages"][0]["content"] == f"What is {a} + {b}? Answer with the number."
    assert all(e["error"] is None for e in episodes), [e["error"] for e in episodes]


SEED_TRAIN = [
    "--max-steps",
    "1",
    "--rl-max-new-tokens",
    "8",
    "--per-device-train-batch-size",
    "4",
    "--rl-num-generations",
    "2",
]


def test_seed_style_tools_train_on_envkits_bundled_template(tiny_model_dir, tmp_path, capsys):
    """The tiny model's tokenizer carries envkit's bundled ChatML template, which TRL cannot name: envkit sets its
    response template, and TRL's tool loop runs (it stopped with 'needs a response parser' before)."""
    out = tmp_path / "seed-tools"
    argv = ["train", *SEED_FLAGS, "--rl-env-config", '{"cases": 4}', "--model", str(tiny_model_dir)]
    code = main([*argv, "--output-dir", str(out), *SEED_TRAIN])
    assert code == 0, capsys.readouterr().err
    log = json.loads((out / "log_history.json").read_text())
    assert any("tools/call_frequency" in entry for entry in log)  # TRL's tool loop ran
    assert any("rewards/score_episode_reward/mean" in entry for entry in log)
    from transformers import AutoTokenizer

    from envkit.adapters.trl.seed_style import BUNDLED_RESPONSE_TEMPLATE

    assert AutoTokenizer.from_pretrained(str(out)).response_template == BUNDLED_RESPONSE_TEMPLATE


def test_eval_of_a_trained_seed_style_model_on_its_own_rows_says_it_is_not_held_out(tiny_model_dir, tmp_path, capsys):
    """A seed-style class trains on all of its build_dataset rows and its task seed s plays row s % rows: envkit eval
    of the trained model with the same constructor config warns that every task is a training row, from any --seed;
    with another config (other rows) it does not. Before, the training record named the class without its seed:
    prefix and the eval said nothing."""
    out = tmp_path / "seed-run"
    config = ["--rl-env-config", '{"cases": 4}']
    argv = ["train", *SEED_FLAGS, *config, "--model", str(tiny_model_dir), "--output-dir", str(out), *SEED_TRAIN]
    assert main(argv) == 0, capsys.readouterr().err
    summary = json.loads((out / "eval_summary.json").read_text())
    assert summary["env"] == "seed:seed_style_arithmetic:SeedArithmetic" and summary["env_config"] == {"cases": 4}
    assert summary["training"]["train_tasks"] is None
    capsys.readouterr()

    evaluate = ["eval", *SEED_FLAGS, "--model", str(out), "--tasks", "2", "--max-new-tokens", "8", "--max-turns", "2"]
    assert main([*evaluate, *config, "--seed", "1000000"]) == 0
    err = capsys.readouterr().err
    assert f"warning: the 2 task seeds are build_dataset rows {out} trained on" in err
    assert main([*evaluate, "--rl-env-config", '{"cases": 6}', "--seed", "1000000"]) == 0
    assert "build_dataset rows" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": "", "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]},
        {
            "role": "assistant",
            "content": "Adding.",
            "tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "add", "arguments": {"a": 3}}],
        },
        {"role": "assistant", "content": "The answer is 3."},
    ],
)
def test_bundled_response_template_parses_what_the_bundled_template_renders(message):
    """transformers' parse_response with envkit's response template gives back the message the template rendered."""
    import copy

    from envkit.adapters.trl.seed_style import set_bundled_response_template
    from envkit.validate.template import bundled_tokenizer

    tokenizer = copy.deepcopy(bundled_tokenizer())
    assert set_bundled_response_template(tokenizer) and not set_bundled_response_template(tokenizer)
    conversation = [{"role": "user", "content": "Add 1 and 2."}]
    prefix = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    rendered = tokenizer.apply_chat_template([*conversation, message], tokenize=False)
    parsed = tokenizer.parse_response(rendered[len(prefix) :], prefix=prefix)
    expected = {"role": "assistant"} | ({"content": message["content"]} if message["content"] else {})
    if "tool_calls" in message:
        expected["tool_calls"] = [{"type": "function", "function": call} for call in message["tool_calls"]]
    assert parsed == expected


def test_validate_fails_a_seed_style_score_that_maxes_an_empty_completion(tmp_path, capsys):
    module = tmp_path / "lenient_seed.py"
    module.write_text(
        "from seed_style_arithmetic import SeedArithmetic\n\n\n"
        "class Lenient(SeedArithmetic):\n"
        "    def score_episode(self, model, tokenizer, completion, case_idx):\n"
        "        if not completion.strip():\n"
        "            return 1.0\n"
        "        return super().score_episode(model, tokenizer, completion, case_idx)\n"
    )
    assert main(["validate", f"{module}:Lenient", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    failed = [check for check in report["checks"] if check["status"] == "FAIL"]
    assert [check["name"] for check in failed] == ["score_episode"], failed
    assert "gives the maximum (1.0) to a completion that answers nothing" in failed[0]["reason"]
    assert main(["validate", *SEED_FLAGS, "--json"]) == 0  # the example's score checks the answer


# ---- a faulty score_episode fails its episode: no reward, counted, stopped past --max-error-rate --------------------
@pytest.mark.parametrize(
    ("fault", "named"),
    [
        ("nan", "returned nan, outside [0, 1]"),
        ("high", "returned 1.5, outside [0, 1]"),
        ("text", "returned 'correct', not a number"),
        ("raise", "ConnectionError: the grading service is down"),
    ],
)
def test_a_faulty_score_is_no_reward_and_counts_as_a_failed_episode(fault, named):
    """A score that is NaN, outside [0, 1], not a number, or raised gives its completion no reward (``None``: what
    GRPOTrainer leaves out of the group's mean and deviation), never a number envkit made up; the step's share of
    them is logged as ``envkit/error_rate`` and the first is said once."""
    from collections import defaultdict
    from types import SimpleNamespace

    from seed_style_faulty import EveryOtherScoreFails

    from envkit.adapters.trl.seed_style import score_episode_reward

    instance = EveryOtherScoreFails(fault=fault)
    said: list[str] = []
    reward = score_episode_reward(instance, None, max_error_rate=0.5, log=said.append)
    reward.trainer = SimpleNamespace(model=None, _metrics={"train": defaultdict(list)})
    a, b = instance.cases[1]
    rewards = reward([f"It is {a + b}."] * 4, [1, 1, 1, 1])
    assert rewards == [1.0, None, 1.0, None]
    reward([f"It is {a + b}."] * 4, [1, 1, 1, 1])
    assert reward.trainer._metrics["train"]["envkit/error_rate"] == [0.5, 0.5]
    assert len(said) == 1 and named in said[0] and "case_idx 1" in said[0], said


def test_more_faulty_scores_than_max_error_rate_stop_naming_the_first():
    from seed_style_faulty import EveryOtherScoreFails

    from envkit.adapters.trl import ErrorRateExceeded
    from envkit.adapters.trl.seed_style import score_episode_reward

    reward = score_episode_reward(EveryOtherScoreFails(fault="raise"), None, max_error_rate=0.25, log=lambda _: None)
    with pytest.raises(ErrorRateExceeded, match=r"^2 of 4 episodes failed \(error rate 0\.50 > --max-error-rate 0\.25"):
        reward(["x"] * 4, [0, 1, 2, 3])
    assert score_episode_reward(EveryOtherScoreFails(), None, max_error_rate=None)(["x"] * 2, [0, 1]) == [0.0, None]


FAULTY_FLAGS = ["--rl-env-module", "seed_style_faulty", "--rl-env-class", "EveryOtherScoreFails"]


def test_training_a_seed_style_class_whose_score_is_nan_counts_those_episodes(tiny_model_dir, tmp_path, capsys):
    """Through TRL: the NaN scores (half of each step's) are counted in envkit/error_rate and left out of the logged
    reward; past --max-error-rate the run stops in one line naming the first error (a traceback from inside TRL
    before, for a score_episode that raised)."""
    out = tmp_path / "nan"
    argv = ["train", *FAULTY_FLAGS, "--model", str(tiny_model_dir), *SEED_TRAIN, "--eval-tasks", "0"]
    code = main([*argv, "--output-dir", str(out), "--max-steps", "2", "--disable-tqdm", "true"])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    assert captured.out.count("EveryOtherScoreFails.score_episode failed (") == 1, captured.out[-3000:]
    assert "All reward functions returned None" not in captured.out + captured.err  # TRL's, at every step
    steps = [entry for entry in json.loads((out / "log_history.json").read_text()) if "reward" in entry]
    assert [entry["envkit/error_rate"] for entry in steps] == [0.5, 0.5]
    assert all(0.0 <= entry["rewards/score_episode_reward/mean"] <= 1.0 for entry in steps)

    stop = ["--rl-env-config", '{"fault": "raise"}', "--max-error-rate", "0.25"]
    code = main([*argv, "--output-dir", str(tmp_path / "raise"), *stop])
    err = capsys.readouterr().err
    assert code == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: training stopped: 2 of 4 episodes failed at step 0 (error rate 0.50 > ")
    assert "ConnectionError: the grading service is down — fix EveryOtherScoreFails.score_episode" in last
    assert "Traceback" not in err


def test_a_score_episode_failing_on_one_process_of_two_stops_both(tiny_model_dir, tmp_path):
    """Two training processes (DDP over gloo on CPU): every score_episode call on the second fails. The failures are
    counted over both processes' episodes (4 of 8 at step 0), so both stop there with the same line and return;
    counted per process, the second would stop alone and the first wait for it in DDP's next collective."""
    out = tmp_path / "ddp"
    one_fails = ["--rl-env-module", "seed_style_faulty", "--rl-env-class", "FailsOnOneProcess"]
    train = [*one_fails, "--model", str(tiny_model_dir), "--output-dir", str(out), *SEED_TRAIN, "--eval-tasks", "0"]
    command = accelerate_launch("ddp_train_script.py", str(tmp_path), *train, "--max-error-rate", "0.25")
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=str(ROOT / "tests"))
    assert result.returncode != 0
    stops = [line for line in result.stderr.splitlines() if line.startswith("error: training stopped: ")]
    assert len(stops) == 2 and stops[0] == stops[1], result.stderr[-3000:]
    assert stops[0].startswith("error: training stopped: 4 of 8 episodes failed at step 0 (error rate 0.50 > ")
    assert "ConnectionError: the grading service is down on this process" in stops[0]
    for rank in (0, 1):  # each process's envkit train returned (ddp_train_script.py records it)
        assert (tmp_path / f"kept-rank{rank}.json").exists()


def test_the_eval_holds_score_episode_to_the_same_rule():
    """As an env (envkit eval, play, the held-out eval), a score outside [0, 1] is an error that names the value and
    the fix for a seed-style class (its config goes to the class: there is no reward_range to declare)."""
    env = envkit.make("seed:seed_style_faulty:EveryOtherScoreFails", fault="high")
    env.reset(seed=0)
    assert env.step({"role": "assistant", "content": "No idea."})[1] == 0.0  # the end's score: the first call
    with pytest.raises(ValueError, match=r"score_episode returned 1\.5, outside \[0, 1\]") as raised:
        env.score()
    assert "scale its score into that range" in str(raised.value) and "reward_range" not in str(raised.value)
