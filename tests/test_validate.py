"""envkit validate: every deliberately broken env is caught by the right check; built-ins and seed-style pass."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import broken_envs as broken
import pytest

import envkit
from envkit.cli import main
from envkit.validate import FAIL, PASS, SKIP, WARN, ConstructionError, validate_env, validate_seed_style

ROOT = Path(__file__).resolve().parents[1]


def statuses(env_cls, episodes=4):
    report = validate_env(env_cls, target=env_cls.__name__, episodes=episodes)
    return {c.id: c.status for c in report.checks}, report


def test_a_correct_env_passes_every_check():
    found, report = statuses(broken.GoodText)
    assert set(found.values()) == {PASS}, report.summary()
    assert [c.id for c in report.checks] == list(range(1, 14))


@pytest.mark.parametrize(
    ("env_cls", "check", "status"),
    [
        (broken.BadSignature, 1, FAIL),
        (broken.NoStep, 1, FAIL),
        (broken.Unseeded, 2, FAIL),
        (broken.BadMessages, 2, FAIL),
        (broken.WrongOracle, 3, FAIL),
        (broken.NoopWins, 4, FAIL),
        (broken.NondeterministicFeedback, 5, FAIL),
        (broken.SharedState, 6, FAIL),
        (broken.CrashOnEmpty, 7, FAIL),
        (broken.CrashingTool, 7, FAIL),
        (broken.ScoreOutOfRange, 8, FAIL),
        (broken.ScoreNaN, 8, FAIL),
        (broken.NeverTruncates, 9, FAIL),
        (broken.BadSchema, 10, FAIL),
        (broken.FlatReward, 11, FAIL),
        (broken.Unpicklable, 12, WARN),
        (broken.SlowStep, 13, WARN),
    ],
)
def test_each_broken_env_is_caught_by_its_check(env_cls, check, status):
    found, report = statuses(env_cls)
    assert found[check] == status, [(c.id, c.status, c.reason) for c in report.checks]
    reason = next(c for c in report.checks if c.id == check)
    assert reason.reason and (reason.hint or status == PASS)


def test_fuzz_failure_shows_the_action_and_the_exception():
    _, report = statuses(broken.CrashOnEmpty)
    fuzz = next(c for c in report.checks if c.id == 7)
    assert "IndexError" in fuzz.reason and "step()" in fuzz.reason
    assert any('"content": ""' in line for line in fuzz.details["faults"])


def test_construction_failure_is_reported_as_such():
    def explode():
        raise RuntimeError("no database")

    with pytest.raises(ConstructionError, match="no database"):
        validate_env(explode, target="explode")


@pytest.mark.parametrize("name", ["hotel-booking", "guess-number", "arithmetic"])
def test_every_builtin_env_passes(name):
    cls = envkit.resolve(name)
    report = validate_env(cls, target=name, episodes=8)
    assert not report.failed and {c.status for c in report.checks} == {PASS}, report.summary()
    assert report.seconds < 30


def test_seed_style_class_passes():
    from seed_style_arithmetic import SeedArithmetic

    report = validate_seed_style(SeedArithmetic, {"cases": 8}, target="SeedArithmetic")
    assert [c.status for c in report.checks] == [PASS] * 4, report.to_dict()


def test_seed_style_scoring_garbage_badly_is_caught():
    from seed_style_arithmetic import SeedArithmetic

    class Fragile(SeedArithmetic):
        def score_episode(self, model, tokenizer, completion, case_idx):
            return float(completion.split()[-1])  # raises on "", returns 42.0 for "The answer is 42."

    report = validate_seed_style(Fragile, {}, target="Fragile")
    assert next(c for c in report.checks if c.id == 3).status == FAIL


def test_cli_exit_codes_and_json(capsys):
    assert main(["validate", "guess-number", "--episodes", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["counts"]["PASS"] == 13 and len(data["checks"]) == 13
    assert main(["validate", "broken_envs:WrongOracle", "--episodes", "3"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "validation FAILED" in out
    assert main(["validate", "nope"]) == 2
    assert "unknown env 'nope'" in capsys.readouterr().err
    assert main(["validate", "hotel-booking", "--config", '{"tier": "legendary"}']) == 2
    assert "unknown tier 'legendary'" in capsys.readouterr().err


def test_cli_seed_style_flags(capsys):
    code = main(
        [
            "validate",
            "--rl-env-module",
            "seed_style_arithmetic",
            "--rl-env-class",
            "SeedArithmetic",
            "--rl-env-config",
            '{"cases": 4}',
        ]
    )
    assert code == 0, capsys.readouterr()
    assert main(["validate", "--rl-env-module", "seed_style_arithmetic"]) == 2
    assert "go together" in capsys.readouterr().err
    assert main(["validate", "--rl-env-module", "m", "--rl-env-class", "C", "--rl-env-config", "{bad"]) == 2
    assert "--rl-env-config is not valid JSON" in capsys.readouterr().err


def test_console_script_on_a_file_env_without_traceback(tmp_path):
    env_file = tmp_path / "mine.py"
    env_file.write_text(
        "import envkit\nclass Mine(envkit.Env):\n    def __init__(self):\n        raise ValueError('x')\n"
    )
    result = subprocess.run(
        [str(Path(sys.executable).parent / "envkit"), "validate", f"{env_file}:Mine"], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr and "ValueError: x" in result.stderr


def test_tasks_that_differ_only_in_hidden_state_pass_variety():
    from envkit.envs.guess_number import GuessNumberEnv

    class FixedRange(GuessNumberEnv):
        def __init__(self):
            super().__init__(low=1, high=32)

    report = validate_env(FixedRange, target="FixedRange", episodes=8)
    check = next(c for c in report.checks if c.id == 2)
    assert check.status == PASS and "hidden task state" in check.reason


def test_a_task_that_never_varies_fails_variety():
    class Constant(broken.GoodText):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed, options=options)
            self.word = "apple"
            return [{"role": "user", "content": "Say the code word apple."}], {}

    found, _ = statuses(Constant)
    assert found[2] == FAIL


def test_a_step_that_never_returns_fails_latency_and_skips_the_rest():
    started = time.perf_counter()
    report = validate_env(broken.HangsOnEmpty, target="HangsOnEmpty", episodes=3, call_timeout_s=0.5)
    assert time.perf_counter() - started < 10  # one timeout, not one per remaining episode
    by_id = {c.id: c for c in report.checks}
    assert [c.id for c in report.checks] == list(range(1, 14)) and report.failed
    assert (
        by_id[13].status == FAIL and "step()" in by_id[13].reason and "did not return within 0.5 s" in by_id[13].reason
    )
    assert "[empty, seed 0]" in by_id[13].reason  # which policy, which seed
    assert by_id[1].status == PASS  # checked before the hang
    assert all(by_id[i].status == SKIP and "hung" in by_id[i].reason for i in range(2, 13))


def test_cli_call_timeout(capsys):
    assert main(["validate", "broken_envs:HangsOnEmpty", "--episodes", "2", "--call-timeout", "0.3", "--json"]) == 1
    latency = json.loads(capsys.readouterr().out)["checks"][-1]
    assert latency["status"] == FAIL and "did not return within 0.3 s" in latency["reason"]
    assert main(["validate", "guess-number", "--call-timeout", "0"]) == 2
    assert "--call-timeout must be a positive number" in capsys.readouterr().err
