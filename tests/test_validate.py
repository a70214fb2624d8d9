"""envkit validate: every deliberately broken env is caught by the right check; built-ins and seed-style pass."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import broken_envs as broken
import pytest
from helpers import ENGINE_DEADLINE_S

import envkit
from envkit.cli.app import main
from envkit.testing import shared_tokenizer_dir
from envkit.validate import ENV, FAIL, PASS, SKIP, WARN, ConstructionError, checks, validate_env, validate_seed_style

ROOT = Path(__file__).resolve().parents[1]
ENV_IDS = sorted(spec.id for spec in checks(ENV))


def shared_tokenizer(name):
    """The folder of a real tokenizer in ../shared/tokenizers, or skip the test."""
    path = shared_tokenizer_dir(name)
    if path is None:
        pytest.skip(f"../shared/tokenizers/{name} not present (a clone outside the envkit workspace)")
    return str(path)


def statuses(env_cls, episodes=4):
    report = validate_env(env_cls, target=env_cls.__name__, episodes=episodes)
    return {c.id: c.status for c in report.checks}, report


def check_14(report):
    return next(c for c in report.checks if c.id == 14)


def test_a_correct_env_passes_every_check():
    found, report = statuses(broken.GoodText)
    assert set(found.values()) == {PASS}, report.summary()
    assert [c.id for c in report.checks] == ENV_IDS == list(range(1, len(ENV_IDS) + 1))


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
        (broken.AnswerContainedInText, 15, FAIL),
        (broken.JudgeSamplesOnEveryRead, 16, FAIL),
        (broken.JudgeSeededPerInstance, 16, FAIL),
        (broken.RegexAnswer, 17, FAIL),
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
    assert data["ok"] and data["counts"]["PASS"] == len(ENV_IDS) and len(data["checks"]) == len(ENV_IDS)
    assert data["checks"][13]["name"] == "transcripts through the chat template"
    assert data["checks"][14]["name"] == "answers padded with distractors"
    assert data["template"] == "envkit bundled ChatML"
    assert main(["validate", "broken_envs:WrongOracle", "--episodes", "3"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "validation FAILED" in out
    assert main(["validate", "nope"]) == 2
    assert "unknown env 'nope'" in capsys.readouterr().err
    assert main(["validate", "hotel-booking", "--env-config", '{"tier": "legendary"}']) == 2
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
    # An envkit env's episode flags were ignored for a seed-style class (validated on its build_dataset rows).
    seed_style = ["validate", "--rl-env-module", "seed_style_arithmetic", "--rl-env-class", "SeedArithmetic"]
    for flags in (["--episodes", "50"], ["--seed", "7"], ["--call-timeout", "5"]):
        assert main([*seed_style, *flags]) == 2
        assert capsys.readouterr().err == (
            f"error: {flags[0]} drives an envkit env's episodes; a seed-style class is validated on its build_dataset "
            "rows\n"
        )


def test_the_env_only_flags_are_named_with_the_parsers_own_defaults():
    from envkit.cli.app import build_parser
    from envkit.cli.commands import ENV_ONLY_DEFAULTS

    validate = build_parser()._subparsers._group_actions[0].choices["validate"]
    assert {name: validate.get_default(name) for name in ENV_ONLY_DEFAULTS} == ENV_ONLY_DEFAULTS


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


def without_oracle(env_cls):
    """``env_cls`` with ``oracle()`` back to envkit.Env's (None: no oracle)."""
    return type(f"{env_cls.__name__}NoOracle", (env_cls,), {"oracle": envkit.Env.oracle})


def test_without_an_oracle_variety_is_not_read_from_the_random_policys_own_draws():
    """The random policy draws its actions from the episode seed, so its episodes differed on every seed whatever the
    env did: without an oracle, an env giving one task on every seed passed check 2 as "hidden task state". The no-op
    policies' episodes are read now; where they cannot show a task, check 2 warns (it cannot tell a hidden task from
    one task) and names the fixes."""
    from envkit.envs.guess_number import GuessNumberEnv

    class Constant(broken.GoodText):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed, options=options)
            self.word = "apple"
            return [{"role": "user", "content": "Say the code word apple."}], {}

    class FixedRange(GuessNumberEnv):
        def __init__(self):
            super().__init__(low=1, high=32)

    report = validate_env(without_oracle(Constant), target="Constant", episodes=8)
    check = next(c for c in report.checks if c.id == 2)
    assert check.status == WARN, check
    assert "seeds open alike and the no-op policies' episodes play out alike" in check.reason
    assert "add oracle(), or name each task in reset()'s info['task_id']" in check.hint
    # guess-number names its tasks (info["task_id"]): its ids tell the hidden numbers apart, oracle or not.
    report = validate_env(without_oracle(FixedRange), target="FixedRange", episodes=8)
    check = next(c for c in report.checks if c.id == 2)
    assert check.status == PASS and "task_id'] names 8 distinct tasks over 8 seeds" in check.reason, check


def test_the_quickstart_env_without_an_oracle_validates_with_warnings_not_a_failure(tmp_path):
    """The quickstart's first env has no oracle(): every scripted policy fails its tasks, as they fail any sound env's,
    and check 11 (group signal) reported FAIL "every policy gets the same score". Without an oracle it is not checked
    (WARN); check 2 reads three capitals over eight seeds as what it is, few distinct tasks."""
    quickstart = (ROOT / "docs" / "get-started" / "quickstart.md").read_text()
    code = quickstart.split("```python\n", 1)[1].split("```", 1)[0]
    assert "def oracle" not in code
    (tmp_path / "capitals.py").write_text(code)
    report = validate_env(lambda: envkit.make(f"{tmp_path / 'capitals.py'}:CapitalsEnv"), target="capitals", episodes=8)
    by_id = {c.id: c for c in report.checks}
    assert not report.failed, report.summary()
    assert by_id[11].status == WARN and by_id[11].reason.startswith("not checked: without an oracle"), by_id[11]
    assert by_id[2].status == WARN and "of seeds give distinct tasks" in by_id[2].reason, by_id[2]
    assert main(["validate", f"{tmp_path / 'capitals.py'}:CapitalsEnv"]) == 0


def test_a_step_that_never_returns_fails_latency_and_skips_the_rest():
    # Only the hung step may reach the deadline: seconds, against the milliseconds of every other call.
    broken.HangsOnEmpty.release.clear()
    broken.HangsOnEmpty.hung = 0
    try:
        report = validate_env(broken.HangsOnEmpty, target="HangsOnEmpty", episodes=3, call_timeout_s=ENGINE_DEADLINE_S)
    finally:
        broken.HangsOnEmpty.release.set()
    assert broken.HangsOnEmpty.hung == 1  # one timeout, not one per remaining episode
    by_id = {c.id: c for c in report.checks}
    assert [c.id for c in report.checks] == ENV_IDS and report.failed
    assert by_id[13].status == FAIL and "step()" in by_id[13].reason
    assert f"did not return within {ENGINE_DEADLINE_S:g} s" in by_id[13].reason
    assert "[empty, seed 0]" in by_id[13].reason  # which policy, which seed
    assert by_id[1].status == PASS  # checked before the hang
    assert all(by_id[i].status == SKIP and "hung" in by_id[i].reason for i in ENV_IDS if i not in (1, 13))


def test_cli_call_timeout(capsys):
    broken.HangsOnEmpty.release.clear()
    try:  # only the hung step may reach the deadline: seconds, against the milliseconds of every other call
        argv = ["validate", "broken_envs:HangsOnEmpty", "--episodes", "2", "--call-timeout", "5", "--json"]
        assert main(argv) == 1
    finally:
        broken.HangsOnEmpty.release.set()
    latency = next(c for c in json.loads(capsys.readouterr().out)["checks"] if c["id"] == 13)
    assert latency["status"] == FAIL and "did not return within 5 s" in latency["reason"]
    for value in ("0", "inf", "nan"):  # inf: an OverflowError reported as the env's constructor failing
        assert main(["validate", "guess-number", "--call-timeout", value]) == 2
        assert f"--call-timeout must be a positive number of seconds, got {value}\n" in capsys.readouterr().err


# ---- check 14: every transcript through the chat template ---------------------------------------------------------
TRANSCRIPT_BUGS = [
    (broken.UnknownRoleOnTurn3, FAIL),
    (broken.DictContentOnTurn3, FAIL),
    (broken.SilentRetry, WARN),
    (broken.ControlTokenInToolOutput, WARN),
]


@pytest.mark.parametrize(("env_cls", "status"), TRANSCRIPT_BUGS)
def test_transcript_bugs_pass_the_other_checks_and_are_caught_by_check_14(env_cls, status):
    found, report = statuses(env_cls)
    assert found.pop(14) == status, check_14(report)
    assert set(found.values()) == {PASS}, [(c.id, c.status, c.reason) for c in report.checks]


def test_a_message_the_template_drops_is_named_by_policy_seed_turn_and_role():
    _, report = statuses(broken.UnknownRoleOnTurn3)
    check = check_14(report)
    assert check.reason.startswith("the 'observation' message of turn 3 [empty, seed 0]: role 'observation'")
    assert "'content': str" in check.hint
    assert check.details["problems_count"] > 1  # every policy that reaches turn 3 hits it


def test_dict_content_fails_with_the_template_error():
    _, report = statuses(broken.DictContentOnTurn3)
    reason = check_14(report).reason
    assert "the 'user' message of turn 3" in reason and "cannot render it (TypeError" in reason
    assert "content is dict, not str" in reason


def test_a_silent_step_that_does_not_end_the_episode_warns():
    _, report = statuses(broken.SilentRetry)
    check = check_14(report)
    assert "turn 1 [empty, seed 0]: step() returned no messages and the episode went on" in check.reason
    assert "end the episode" in check.hint


def test_control_token_strings_in_env_text_warn_and_are_named():
    _, report = statuses(broken.ControlTokenInToolOutput)
    check = check_14(report)
    assert "the 'tool' message of turn 1 [oracle, seed 0] holds <|im_end|>" in check.reason


def test_the_default_template_ships_with_envkit(monkeypatch, tmp_path):
    """Without --tokenizer nothing is read from ../shared or the working directory, nor built by test helpers."""
    import envkit.testing

    def unavailable(*args, **kwargs):
        raise AssertionError("envkit validate must not use envkit.testing")

    monkeypatch.setattr(envkit.testing, "load_shared_tokenizer", unavailable)
    monkeypatch.setattr(envkit.testing, "build_tokenizer", unavailable)
    monkeypatch.chdir(tmp_path)
    found, report = statuses(broken.GoodText)
    assert set(found.values()) == {PASS}, [(c.id, c.reason) for c in report.checks]
    assert report.template == "envkit bundled ChatML"
    assert "characters (envkit bundled ChatML" in report.checks[9].reason


def test_cli_tokenizer_renders_transcripts_with_the_real_qwen_template(capsys):
    qwen = shared_tokenizer("qwen2.5-instruct")
    assert main(["validate", "broken_envs:UnknownRoleOnTurn3", "--episodes", "2", "--tokenizer", qwen, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    check = data["checks"][13]
    assert data["template"] == "qwen2.5-instruct" and check["id"] == 14 and check["status"] == FAIL
    assert "'observation' message of turn 3" in check["reason"]
    assert "the qwen2.5-instruct template drops it" in check["reason"]  # Qwen2.5 renders no unknown role
    assert main(["validate", "hotel-booking", "--episodes", "2", "--tokenizer", qwen, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {c["status"] for c in data["checks"]} == {PASS}
    assert "tokens (qwen2.5-instruct)" in data["checks"][9]["reason"]


def test_llama_template_json_encodes_tool_results_and_they_still_count_as_rendered(capsys):
    """Llama 3.2 renders a tool result as a JSON string in role ipython ("x = 1" with its quotes, newlines as \\n)."""
    llama = shared_tokenizer("llama-3.2-instruct")
    assert main(["validate", "arithmetic", "--episodes", "2", "--tokenizer", llama, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["template"] == "llama-3.2-instruct" and data["checks"][13]["status"] == PASS
    from envkit.models.loading import load_tokenizer

    report = validate_env(broken.ControlTokenInToolOutput, target="log", episodes=2, tokenizer=load_tokenizer(llama))
    # The multi-line log renders JSON-encoded; <|im_end|> is ChatML's control token, not Llama's: no warning.
    assert check_14(report).status == PASS, check_14(report)


def test_cli_tokenizer_must_be_a_loadable_folder(capsys, tmp_path):
    assert main(["validate", "guess-number", "--tokenizer", str(tmp_path / "missing")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["validate", "guess-number", "--tokenizer", str(tmp_path)]) == 2
    assert "cannot load a tokenizer" in capsys.readouterr().err


# ---- dependencies and seed-style robustness ------------------------------------------------------------------------
def test_jsonschema_is_a_runtime_dependency():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("jsonschema>=4.20") for d in project["dependencies"])
    assert not any(d.startswith("jsonschema") for d in project["optional-dependencies"]["dev"])


def test_seed_style_without_jsonschema_fails_the_check_without_a_traceback(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # a broken install: importing it raises ImportError
    argv = ["--rl-env-module", "seed_style_arithmetic", "--rl-env-class", "SeedArithmetic", "--rl-env-config", "{}"]
    assert main(["validate", *argv, "--json"]) == 1
    tools = json.loads(capsys.readouterr().out)["checks"][3]
    assert tools["status"] == FAIL and "jsonschema" in tools["reason"] and "reinstall envkit" in tools["hint"]


def test_seed_style_get_tools_that_raises_is_a_finding_not_a_crash(capsys):
    assert main(["validate", "--rl-env-module", "broken_envs", "--rl-env-class", "SeedToolsRaise", "--json"]) == 1
    tools = json.loads(capsys.readouterr().out)["checks"][3]
    assert tools["status"] == FAIL and "RuntimeError: no tool registry" in tools["reason"]


# ---- check 15: answers padded with distractors -------------------------------------------------------------------
def check_15(report):
    return next(c for c in report.checks if c.id == 15)


def test_an_answer_contained_in_the_text_is_caught_by_the_distractor_check_alone():
    found, report = statuses(broken.AnswerContainedInText)
    assert found.pop(15) == FAIL
    assert set(found.values()) == {PASS}, [(c.id, c.status, c.reason) for c in report.checks]
    check = check_15(report)
    assert "4/4 seeds score 1.0 when the oracle's final answer is padded" in check.reason
    assert "between" in check.reason and "distractors" in check.reason and "exactly one answer" in check.hint
    assert check.details["hacked_seeds"] == [0, 1, 2, 3]


def test_the_distractor_check_passes_an_exact_answer_and_says_what_it_scored():
    check = check_15(statuses(broken.GoodText)[1])
    assert check.status == PASS and "never 1.0" in check.reason
    assert check.details["seeds_checked"] == [0, 1, 2, 3] and max(check.details["scores"]) < 1.0


def test_hotel_booking_with_references_told_by_substring_is_caught():
    """The old hotel-booking check (a reference counted as told when it appeared anywhere) is the hack it catches."""
    from envkit.envs.hotel_booking import HotelBookingEnv

    class RefsBySubstring(HotelBookingEnv):
        def _refs_told(self):
            refs = {b.ref for b in self._created(self.world)} | self._cancelled(self.world)
            said = " ".join(str(m.get("content") or "") for m in self.messages if m["role"] == "assistant")
            return all(ref in said for ref in refs)

    check = check_15(validate_env(RefsBySubstring, target="RefsBySubstring", episodes=4))
    assert check.status == FAIL and "All done: your new booking reference is BK-" in check.reason


def test_the_distractor_policy_pads_a_final_tool_call_with_distractor_calls():
    """arithmetic answers with submit_answer(answer: float): the answer is sent between two distractor submissions."""
    from envkit.envs.arithmetic import ArithmeticEnv
    from envkit.validate import DistractorPolicy, Driver, oracle_policy

    driver = Driver(ArithmeticEnv)
    oracle = [driver.play("oracle", oracle_policy, seed) for seed in (0, 1)]
    policy = DistractorPolicy(oracle)
    run = driver.play("distractors", policy, 0)
    calls = run.actions[-1]["tool_calls"]
    answers = [c["function"]["arguments"]["answer"] for c in calls]
    assert len(answers) == 3 and answers[1] == oracle[0].actions[-1]["tool_calls"][0]["function"]["arguments"]["answer"]
    assert oracle[0].score == 1.0 and run.score == 0.0  # the last submission counts, and it is a distractor


def test_the_quickstart_capitals_example_wants_one_capital_not_a_list():
    """The quickstart's CapitalsEnv (examples/capitals.py) was won by listing every capital; now the answer must name
    exactly one."""
    spec = f"{ROOT / 'examples' / 'capitals.py'}:CapitalsEnv"
    capitals = sys.modules[type(envkit.make(spec)).__module__].CAPITALS
    for seed in range(5):
        for answer, expected in (("It is one of {every}.", 0.0), ("The capital is {right}.", 1.0)):
            env = envkit.make(spec)
            env.reset(seed=seed)
            env.step(env.oracle())  # lookup_capital
            right = env.messages[-1]["content"]
            assert env.score() == 0.0  # a tool result is not an answer
            env.step(answer.format(every=", ".join(capitals.values()), right=right))
            assert env.score() == expected, (seed, answer)
    report = validate_env(lambda: envkit.make(spec), target="capitals", episodes=8)
    assert check_15(report).status == PASS, check_15(report)

    class ContainsCapital(type(env)):  # the README's old score()
        def score(self):
            return float(capitals[self.country] in self.messages[-1]["content"])

    assert check_15(validate_env(ContainsCapital, target="old", episodes=8)).status == FAIL


def test_the_docs_capitals_score_is_the_example_file_s():
    readme = (ROOT / "docs" / "how-to" / "write-a-tool-env.md").read_text()
    block = readme.split("class CapitalsEnv(envkit.ToolEnv):", 1)[1].split("```", 1)[0]
    score = block[block.index("    def score") :].strip().splitlines()
    example = (ROOT / "examples" / "capitals.py").read_text()
    assert all(line in example for line in score), score
