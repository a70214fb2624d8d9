"""bfcl-multi-turn: BFCL v4's multi-turn tasks played turn by turn, executed without ``eval``, scored as BFCL scores.

The whole agreement suite (every task, ``pytest -m bfcl``) is tests/test_bfcl_agreement.py; here a few tasks of each
category go through the same comparison with BFCL's own checker, plus what the env does at its edges.
"""

from __future__ import annotations

import importlib.util
import json
import time

import gymnasium as gym
import pytest

pytest.importorskip("bfcl_eval", reason="BFCL is not installed: pip install --no-deps bfcl-eval==2026.3.23 mpmath")

from test_bfcl_agreement import disagreements

import envkit
from envkit.backends.oracle import OracleBackend
from envkit.envs.bfcl import BfclMultiTurnEnv, data
from envkit.rollout import RolloutEngine, SamplingParams
from envkit.workers import EnvFactory


def calls(*pairs: tuple[str, dict]) -> dict:
    """An assistant reply making these calls."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in pairs],
    }


def play_oracle(env: BfclMultiTurnEnv, until_turn: int | None = None) -> None:
    """Let the oracle play (up to the start of turn ``until_turn``)."""
    while not env.done and (until_turn is None or env.turn < until_turn):
        env.step(env.oracle())


def test_registered_by_name_and_with_gymnasium():
    assert type(envkit.make("bfcl-multi-turn")) is BfclMultiTurnEnv
    env = gym.make("envkit/BfclMultiTurn-v0", split="miss_param")
    observation, info = env.reset(seed=3)
    assert info["task_id"] == "multi_turn_miss_param_3" and observation[-1]["role"] == "user"


def test_splits_train_on_base_and_hold_out_the_other_categories():
    assert [len(BfclMultiTurnEnv(split=s).tasks) for s in ("train", "test", "all")] == [200, 600, 800]
    assert {t.category for t in BfclMultiTurnEnv().tasks} == {"base"}
    assert {t.category for t in BfclMultiTurnEnv(split="test").tasks} == {"miss_func", "miss_param", "long_context"}
    with pytest.raises(ValueError, match=r"^unknown split 'dev'; choose from train, test, all, base"):
        BfclMultiTurnEnv(split="dev")


def test_a_conversation_goes_turn_by_turn_and_the_oracle_scores_one():
    env = BfclMultiTurnEnv()
    opening, info = env.reset(seed=0)
    task = env.task
    assert info["task_id"] == "multi_turn_base_0" and opening == task.turns[0]  # the user's first turn, no system
    assert env.tools == task.tools and {"cd", "mv", "post_tweet"} <= {t["function"]["name"] for t in env.tools}
    reply = env.oracle()
    assert [c["function"]["name"] for c in reply["tool_calls"]] == ["cd", "mkdir", "mv"]  # turn 0's ground truth
    observation, reward, terminated, _, info = env.step(reply)
    assert [m["role"] for m in observation] == ["tool"] * 3 and json.loads(observation[0]["content"]) == {
        "current_working_directory": "document"
    }
    assert (reward, terminated, info["turn"]) == (0.0, False, 0)
    observation, *_ = env.step("Moved it.")  # a reply without calls ends the turn: the user's next turn follows
    assert observation == task.turns[1] and env.turn == 1
    play_oracle(env)
    assert (env.ending, env.score()) == (envkit.Ending.DONE, 1.0)
    assert env.score_components() == {
        "turns_completed": 1.0,
        "answered": 1.0,
        "state": 1.0,
        "response": 1.0,
        "turns_passed": 1.0,
        "force_quit": 0.0,
    }


@pytest.mark.parametrize("category", data.CATEGORIES)
def test_a_few_tasks_score_as_bfcls_own_checker(category):
    env = BfclMultiTurnEnv(split=category)
    for task in data.load_category(category)[:2]:
        count, differ = disagreements(env, task)
        assert differ == [] and count >= 5


def test_a_wrong_argument_fails_the_state_check_of_its_turn_only():
    env = BfclMultiTurnEnv()
    env.reset(seed=0)
    env.step(
        calls(
            ("cd", {"folder": "document"}),
            ("mkdir", {"dir_name": "tmp"}),
            ("mv", {"source": "final_report.pdf", "destination": "tmp"}),
        )
    )
    env.step("Done.")
    play_oracle(env)
    assert env.score() == 0.0
    parts = env.score_components()
    assert parts["answered"] == 1.0 and parts["state"] < 1.0 and parts["turns_completed"] == 1.0


def test_a_held_out_function_is_announced_in_a_user_message_and_the_tool_list_never_changes():
    from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

    env = BfclMultiTurnEnv(split="miss_func")
    env.reset(seed=0)
    task, tools = env.task, env.tools
    ((turn, missed),) = task.missed_functions.items()
    assert not {m["name"] for m in missed} & {t["function"]["name"] for t in tools}
    play_oracle(env, until_turn=turn)
    assert env.messages[-1] == {
        "role": "user",
        "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(functions=missed),
    }
    play_oracle(env)
    assert env.score() == 1.0 and env.tools == tools


def test_calls_are_looked_up_and_never_evaluated():
    env = BfclMultiTurnEnv()
    env.reset(seed=0)  # GorillaFileSystem and TwitterAPI
    code = "__import__('os').system('touch /tmp/envkit-bfcl-pwned')"
    observation, *_ = env.step(
        calls(
            ("touch", {"file_name": "note.txt"}),
            ("echo", {"content": code, "file_name": "note.txt"}),
            ("cat", {"file_name": "note.txt"}),
            ("__import__", {"name": "os"}),
            ("_load_scenario", {"scenario": {}}),
            ("exec", {}),
        )
    )
    texts = [m["content"] for m in observation]
    assert texts[:2] == ["None", "None"] and json.loads(texts[2]) == {"file_content": code}  # stored as text
    assert texts[3:] == [
        "Error during execution: name '__import__' is not defined",
        "Error during execution: name '_load_scenario' is not defined",
        "Error during execution: name 'exec' is not defined",
    ]


def test_a_reply_whose_calls_do_not_all_decode_runs_none_of_them_and_ends_the_turn():
    env = BfclMultiTurnEnv()
    env.reset(seed=0)
    reply = calls(("mkdir", {"dir_name": "new"}))
    reply["tool_calls"].append({"type": "function", "function": {"name": "ls", "arguments": "{not json"}})
    observation, *_ = env.step(reply)
    assert [m["role"] for m in observation] == ["tool", "tool", "user"] and env.turn == 1
    assert "new" not in env.apis.instances["GorillaFileSystem"]._current_dir.contents
    assert env.score_components()["answered"] == 0.0


def test_bfcls_step_limit_quits_the_task_before_the_last_turn_and_is_scored_in_the_last():
    env = BfclMultiTurnEnv()
    env.reset(seed=0)
    for _ in range(21):  # BFCL's inference quits after a turn's 21st calling reply
        _, _, terminated, truncated, info = env.step(calls(("pwd", {})))
    assert (terminated, truncated, info["ending"], env.score()) == (False, True, "max_steps", 0.0)
    assert env.score_components()["force_quit"] == 1.0

    env.reset(seed=0)
    play_oracle(env, until_turn=len(env.task.turns) - 1)
    env.step(env.oracle())
    for _ in range(20):  # a call of no known function: decoded, run, changes nothing
        _, _, terminated, truncated, _ = env.step(calls(("no_such_function", {})))
    assert (terminated, truncated, env.score()) == (True, False, 1.0)  # BFCL checks a task quit in its last turn


def test_an_episode_the_engine_cuts_scores_zero():
    env = BfclMultiTurnEnv()
    env.reset(seed=0)
    play_oracle(env, until_turn=len(env.task.turns) - 1)
    env.step(env.oracle())  # the last turn's calls are made, but the turn is never closed
    env.end("max_turns")
    assert env.score() == 0.0 and env.score_components()["turns_completed"] < 1.0


def test_math_calls_that_would_run_for_hours_are_refused_at_once():
    env = BfclMultiTurnEnv(split="all")
    env.reset(options={"task_id": next(t.id for t in env.tasks if "MathAPI" in t.involved_classes)})
    start = time.perf_counter()
    observation, *_ = env.step(
        calls(
            ("power", {"base": 9, "exponent": 999_999_999}), ("logarithm", {"value": 8, "base": 2, "precision": 10**9})
        )
    )
    assert time.perf_counter() - start < 5
    assert all("refused by envkit" in m["content"] for m in observation)
    observation, *_ = env.step(calls(("power", {"base": 2, "exponent": 10})))
    assert json.loads(observation[0]["content"]) == {"result": 1024}


def test_a_logarithms_precision_shows_in_its_result_and_leaves_mpmaths_precision_as_it_was():
    import mpmath

    env = BfclMultiTurnEnv(split="all")
    env.reset(options={"task_id": "multi_turn_base_15"})  # MathAPI
    before = mpmath.mp.dps
    observation, *_ = env.step(calls(("logarithm", {"value": 10, "base": 3, "precision": 40})))
    assert observation[0]["content"] == "{'result': mpf('2.095903274289384604296567522021401250607531')}"  # BFCL's text
    assert mpmath.mp.dps == before


def test_the_oracle_through_the_rollout_engine_is_token_exact(local_tokenizer):
    factory = EnvFactory("bfcl-multi-turn", {"split": "all"})
    seeds = [0, 200, 400, 600]  # one task of each category
    engine = RolloutEngine(factory, OracleBackend(factory, local_tokenizer, seeds), local_tokenizer, concurrency=4)
    try:
        episodes = engine.run(seeds, 1, SamplingParams(max_new_tokens=4096))
    finally:
        engine.close()
    assert [(e.error, e.finish_reason, e.score) for e in episodes] == [(None, "done", 1.0)] * len(seeds)
    assert [e.info["category"] for e in episodes] == list(data.CATEGORIES)


def test_without_bfcl_installed_the_env_says_what_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "bfcl_eval" else real(name, *a))
    data.load_category.cache_clear()
    try:
        with pytest.raises(data.BfclMissing) as error:
            BfclMultiTurnEnv()
    finally:
        data.load_category.cache_clear()
    message = str(error.value)
    assert "\n" not in message and message.endswith("pip install --no-deps bfcl-eval==2026.3.23")
