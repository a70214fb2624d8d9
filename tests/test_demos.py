"""The oracle as a generation backend: OracleBackend through the rollout engine, and oracle demonstrations.

Every check compares with the chat template's own rendering of the oracle's transcript, played here directly (reset,
then ``step(oracle())`` until done), never with the engine's or the backend's token arithmetic.
"""

from __future__ import annotations

import itertools

import pytest
from helpers import CounterEnv, SilentOnce

import envkit
from envkit.backends.oracle import NoOracle, OracleBackend, UnknownPrompt
from envkit.chat.render import ChatRenderer
from envkit.demos import OracleEpisodeFailed, oracle_episode, oracle_episodes
from envkit.envs.guess_number import GuessNumberEnv
from envkit.rollout import RolloutEngine, SamplingParams


def played_directly(env_factory, seed):
    """The oracle's own transcript on ``seed`` (its messages as it wrote them, not parsed back from tokens)."""
    env = env_factory()
    env.reset(seed=seed)
    while not env.done:
        env.step(env.oracle())
    return env.messages, env.score()


def template_tokens(renderer: ChatRenderer, messages):
    """The template's tokens for a finished transcript, and the token spans of each assistant turn."""
    rendered = renderer.render(messages)
    if messages[-1]["role"] == "assistant":  # ends on the model's turn: at its end-of-turn token
        rendered = rendered[: rendered.rfind(renderer.end_of_turn) + len(renderer.end_of_turn)]
    spans = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            before = renderer.render(messages[:i], add_generation_prompt=True)
            turn = renderer.render(messages[: i + 1])
            turn = turn[: turn.rfind(renderer.end_of_turn) + len(renderer.end_of_turn)]
            spans.append(renderer.encode(turn[len(before) :]))
    return renderer.encode(rendered), spans


def model_spans(episode):
    spans, current = [], []
    for token, mask in zip(episode.completion_ids, episode.env_mask, strict=True):
        if mask:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return [*spans, current] if current else spans


ENVS = {"tool env with a silent turn": SilentOnce, "text env": lambda: envkit.make("guess-number")}


@pytest.mark.parametrize("env_name", list(ENVS))
def test_the_oracle_backend_through_the_engine_reproduces_the_oracle_token_exactly(any_tokenizer, env_name):
    factory = ENVS[env_name]
    seeds = [0, 4]
    backend = OracleBackend(factory, any_tokenizer, seeds, logprob=-0.25)
    episodes = RolloutEngine(factory, backend, any_tokenizer).run(seeds, 3, SamplingParams())
    assert [(e.task_seed, e.group_index) for e in episodes] == [(s, g) for s in seeds for g in range(3)]
    renderer = ChatRenderer(any_tokenizer, getattr(factory(), "tools", None) or None)
    for episode in episodes:
        messages, score = played_directly(factory, episode.task_seed)
        tokens, spans = template_tokens(renderer, messages)
        assert episode.error is None and episode.finish_reason == "done" and episode.score == score == 1.0
        assert episode.prompt_ids + episode.completion_ids == tokens
        assert model_spans(episode) == spans and episode.turns == len(spans)
        assert episode.logprobs == [-0.25 if m else 0.0 for m in episode.env_mask]
        assert [m["role"] for m in episode.messages] == [m["role"] for m in messages]
    if factory is SilentOnce:  # the silent step opened the next turn: two assistant turns in a row
        roles = [m["role"] for m in episodes[0].messages]
        assert any(a == b == "assistant" for a, b in itertools.pairwise(roles))


@pytest.mark.parametrize("env_name", list(ENVS))
def test_oracle_episode_is_the_oracles_transcript_token_exactly(any_tokenizer, env_name):
    factory = ENVS[env_name]
    renderer = ChatRenderer(any_tokenizer, getattr(factory(), "tools", None) or None)
    for seed in (1, 2):
        episode = oracle_episode(factory(), renderer, seed)
        messages, _ = played_directly(factory, seed)
        tokens, spans = template_tokens(renderer, messages)
        assert episode.prompt_ids + episode.completion_ids == tokens and model_spans(episode) == spans
        assert episode.score == 1.0 and episode.finish_reason == "done" and not episode.truncated
        assert episode.logprobs == [0.0] * len(episode.completion_ids)
        assert len(episode.rewards) == episode.turns == len(spans)


class GivesUp(CounterEnv):
    """The oracle knows the first step only."""

    def oracle(self):
        return super().oracle() if self.turns == 0 else None


class Broken(CounterEnv):
    def step(self, action):
        if self.turns == 1:
            raise KeyError("inventory table missing")
        return super().step(action)


def test_oracle_episode_raises_no_oracle_and_env_errors(local_tokenizer):
    renderer = ChatRenderer(local_tokenizer, CounterEnv().tools)
    with pytest.raises(NoOracle, match=r"^GivesUp\.oracle\(\) returned None on seed 3$"):
        oracle_episode(GivesUp(), renderer, 3)

    class NoOracleAtAll(envkit.Env):
        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed, options=options)
            return [{"role": "user", "content": "hi"}], {}

        def step(self, action):
            return [], 0.0, True, False, {}

        def score(self):
            return 0.0

    with pytest.raises(NoOracle, match="NoOracleAtAll"):
        oracle_episodes(NoOracleAtAll, local_tokenizer, [0])
    with pytest.raises(OracleEpisodeFailed, match=r"Broken on seed 0 failed: KeyError: 'inventory table missing'"):
        oracle_episode(Broken(), renderer, 0)


def test_a_prompt_off_by_one_token_is_refused_and_a_failed_batch_changes_nothing(local_tokenizer):
    backend = OracleBackend(CounterEnv, local_tokenizer, [0])
    env = CounterEnv()
    opening, _ = env.reset(seed=0)
    prompt = ChatRenderer(local_tokenizer, env.tools).prompt_ids(opening)
    with pytest.raises(UnknownPrompt, match="neither the opening of seeds"):
        backend.generate([prompt, prompt[:-1]], SamplingParams())
    assert isinstance(backend.last_error, UnknownPrompt)
    first = backend.generate([prompt], SamplingParams())[0]  # the good prompt of the failed batch is served alone
    assert first.finish_reason == "stop" and first.logprobs == [0.0] * len(first.token_ids)
    with pytest.raises(UnknownPrompt):  # a continuation must be exactly the prompt the replica expects
        backend.generate([[*prompt, *first.token_ids]], SamplingParams())


def test_seeds_with_the_same_opening_are_told_apart_by_the_envs_answers(local_tokenizer):
    """guess-number with a fixed range opens every seed with the same prompt; only "Higher."/"Lower." differ."""
    factory = lambda: envkit.make("guess-number", low=1, high=100)  # noqa: E731
    seeds = [0, 1, 2, 3]
    backend = OracleBackend(factory, local_tokenizer, seeds)
    episodes = RolloutEngine(factory, backend, local_tokenizer).run(seeds, 2, SamplingParams())
    renderer = ChatRenderer(local_tokenizer)
    for episode in episodes:
        assert episode.error is None and episode.score == 1.0
        assert (
            episode.prompt_ids + episode.completion_ids
            == template_tokens(renderer, played_directly(factory, episode.task_seed)[0])[0]
        )

    class Cheater(GuessNumberEnv):
        def oracle(self):  # knows the answer: the same conversation gets another reply on each seed
            return {"role": "assistant", "content": str(self.target)}

    cheater = lambda: Cheater(low=1, high=100)  # noqa: E731
    episodes = RolloutEngine(cheater, OracleBackend(cheater, local_tokenizer, [0, 1]), local_tokenizer).run(
        [0, 1], 1, SamplingParams()
    )
    assert all("their oracles act differently" in e.error for e in episodes)
