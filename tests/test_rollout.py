"""The rollout engine: token-exact trajectories, groups, limits, fault isolation, real backends."""

from __future__ import annotations

import math
import threading

import pytest
from helpers import (
    ENGINE_DEADLINE_S,
    MODEL_LOGPROB,
    RELEASE_CAP_S,
    CheckedOracleBackend,
    CounterEnv,
    SilentOnce,
)

import envkit
from envkit.backends import FaultyBackend, Generation, RecordingBackend, ScriptedBackend, TransformersBackend
from envkit.chat.render import ChatRenderer
from envkit.rollout import Episode, RolloutEngine, SamplingParams, summarize, teacher_forced_logprobs


def model_spans(episode: Episode) -> list[list[int]]:
    spans, current = [], []
    for token, mask in zip(episode.completion_ids, episode.env_mask, strict=True):
        if mask:
            current.append(token)
        elif current:
            spans.append(current)
            current = []
    return [*spans, current] if current else spans


@pytest.mark.parametrize("env_name", ["hotel-booking", "guess-number", "arithmetic"])
def test_token_exact_on_the_real_qwen25_template(qwen25_tokenizer, env_name):
    seeds = [0, 1, 2, 5]
    factory = lambda: envkit.make(env_name)  # noqa: E731
    backend = CheckedOracleBackend(factory, qwen25_tokenizer, seeds)
    engine = RolloutEngine(factory, backend, qwen25_tokenizer)
    episodes = engine.run(seeds, group_size=2, sampling=SamplingParams())
    assert len(episodes) == 8
    for episode in episodes:
        assert episode.error is None and episode.score == 1.0 and episode.finish_reason == "done"
        assert model_spans(episode) == backend.spans[episode.task_seed]
        assert len(episode.completion_ids) == len(episode.env_mask) == len(episode.logprobs)
        assert all(
            lp == (MODEL_LOGPROB if m else 0.0) for lp, m in zip(episode.logprobs, episode.env_mask, strict=True)
        )
        renderer = ChatRenderer(qwen25_tokenizer, getattr(factory(), "tools", None) or None)
        # the episode ended, so no generation prompt; an episode ending on the model's turn ends at its <|im_end|>
        rendered = renderer.render(episode.messages)
        if episode.messages[-1]["role"] == "assistant":
            rendered = rendered[: rendered.rfind("<|im_end|>") + len("<|im_end|>")]
        assert qwen25_tokenizer.decode(episode.prompt_ids + episode.completion_ids) == rendered
        assert episode.prompt_ids == renderer.prompt_ids(episode.messages[:2])


def test_groups_share_their_task_seed_and_come_back_in_order(local_tokenizer):
    seeds = [7, 3, 9]
    backend = CheckedOracleBackend(CounterEnv, local_tokenizer, seeds)
    recorder = RecordingBackend(backend)
    episodes = RolloutEngine(CounterEnv, recorder, local_tokenizer).run(seeds, 3, SamplingParams())
    assert [(e.task_seed, e.group_index) for e in episodes] == [(s, g) for s in seeds for g in range(3)]
    assert all(e.score == 1.0 for e in episodes)
    # Episodes waiting for the model at the same time share one backend call (continuous batching).
    assert max(len(s) for s in backend.spans.values()) <= len(recorder.calls) < sum(e.turns for e in episodes)


class KeepsPrompts:
    """Wraps a backend and keeps every prompt list it is handed (the object itself, and its contents then)."""

    def __init__(self, inner):
        self.inner, self.handed = inner, []

    def generate(self, prompts, sampling, *, seeds=None, max_new_tokens=None):
        self.handed += [(prompt, list(prompt)) for prompt in prompts]
        return self.inner.generate(prompts, sampling, seeds=seeds, max_new_tokens=max_new_tokens)


def test_an_episode_context_is_one_list_extended_in_place_not_copied_every_turn(local_tokenizer):
    """A copy of the whole history per turn costs O(history) per step, and while a batch generates, every waiting
    episode's copy is young garbage the collector sweeps: at turn 200 that doubled the driver's CPU per step."""
    seeds = [7, 3]
    backend = KeepsPrompts(CheckedOracleBackend(CounterEnv, local_tokenizer, seeds))
    episodes = RolloutEngine(CounterEnv, backend, local_tokenizer).run(seeds, 1, SamplingParams())
    assert all(e.score == 1.0 and e.turns >= 3 for e in episodes)
    for episode in episodes:
        mine = [
            (prompt, then) for prompt, then in backend.handed if then[: len(episode.prompt_ids)] == episode.prompt_ids
        ]
        assert len(mine) == episode.turns
        assert len({id(prompt) for prompt, _ in mine}) == 1  # one list per episode, handed in on every turn
        # each turn's prompt was the context then: the opening prompt and everything after it so far
        context = episode.prompt_ids + episode.completion_ids
        assert all(then == context[: len(then)] for _, then in mine)
        assert [len(then) for _, then in mine] == sorted({len(then) for _, then in mine})


class Faulty(CounterEnv):
    """Seed 1 raises in step, seed 2 hangs past the timeout (until :attr:`release` is set), seed 3's score() raises."""

    release = threading.Event()

    def step(self, action):
        if self.np_random_seed == 1:
            raise RuntimeError("database connection lost")
        if self.np_random_seed == 2:
            self.release.wait(RELEASE_CAP_S)
        return super().step(action)

    def score(self):
        if self.np_random_seed == 3:
            raise ValueError("cannot score")
        return super().score()


def test_faults_stay_in_their_episode(local_tokenizer):
    seeds = [0, 1, 2, 3, 4]
    backend = CheckedOracleBackend(CounterEnv, local_tokenizer, seeds)
    engine = RolloutEngine(Faulty, backend, local_tokenizer, step_timeout_s=ENGINE_DEADLINE_S)
    Faulty.release.clear()
    try:
        episodes = engine.run(seeds, 1, SamplingParams())
    finally:
        Faulty.release.set()
    by_seed = {e.task_seed: e for e in episodes}
    assert len(episodes) == 5
    assert by_seed[1].error == "RuntimeError: database connection lost" and by_seed[1].finish_reason == "error"
    assert by_seed[2].finish_reason == "timeout" and f"longer than {ENGINE_DEADLINE_S:g}s" in by_seed[2].error
    assert by_seed[3].score == 0.0 and "cannot score" in by_seed[3].error
    for seed in (0, 4):
        assert by_seed[seed].error is None and by_seed[seed].score == 1.0


def test_malformed_model_output_goes_to_the_env_as_a_tool_error(local_tokenizer):
    garbage = ScriptedBackend('<tool_call>{"name": "add", "argu<|im_end|>', tokenizer=local_tokenizer)
    episodes = RolloutEngine(CounterEnv, garbage, local_tokenizer, max_turns=3).run([0], 2, SamplingParams())
    for episode in episodes:
        assert episode.finish_reason == "max_turns" and episode.truncated and episode.turns == 3
        assert episode.tool_errors == 3 and episode.score == 0.0
        assert "could not parse tool call" in episode.messages[3]["content"]


def test_max_episode_tokens_is_never_exceeded(local_tokenizer):
    tokens = local_tokenizer.encode("add add add add add add", add_special_tokens=False) * 5
    # A Generation is returned as is: 30 tokens whatever the budget, so the engine's own clipping is what is tested.
    chatty = ScriptedBackend(Generation(tokens, [-1.0] * len(tokens), "length"))
    engine = RolloutEngine(CounterEnv, chatty, local_tokenizer, max_episode_tokens=700)
    for episode in engine.run([0, 1], 2, SamplingParams()):
        assert episode.truncated and episode.finish_reason == "max_episode_tokens"
        assert len(episode.completion_ids) > 0
        assert len(episode.prompt_ids) + len(episode.completion_ids) <= 700
    # a prompt longer than the budget ends the episode before any generation
    short = RolloutEngine(CounterEnv, chatty, local_tokenizer, max_episode_tokens=100).run([0], 1, SamplingParams())
    assert short[0].finish_reason == "max_episode_tokens" and short[0].completion_ids == []


def test_a_cut_turn_is_closed_with_a_masked_end_of_turn_token(local_tokenizer):
    cut = ScriptedBackend(Generation([5, 6, 7], [-1.0] * 3, "length"))
    episode = RolloutEngine(CounterEnv, cut, local_tokenizer, max_turns=1).run([0], 1, SamplingParams())[0]
    im_end = local_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert episode.completion_ids[:4] == [5, 6, 7, im_end] and episode.env_mask[:4] == [1, 1, 1, 0]


def test_a_turn_cut_at_max_new_tokens_is_counted_in_the_summary(local_tokenizer):
    """A turn that hit the per-turn max_new_tokens goes to the env as it is, and the env may end the episode on it
    (here the env asks again after the first text reply and ends on the second, as it would on finished ones): the
    episode is not truncated, but summarize counts the cut turns (``cut_turn_rate``, logged in training as
    ``envkit/cut_turn_rate``), so a per-turn budget too small for the answers shows."""
    answer = local_tokenizer.encode("The answer is 4", add_special_tokens=False)  # cut before "2."
    cut = ScriptedBackend(Generation(answer, [-1.0] * len(answer), "length"))
    episodes = RolloutEngine(CounterEnv, cut, local_tokenizer, max_turns=2).run([0, 1], 2, SamplingParams())
    assert all(
        e.finish_reason == "done" and not e.truncated and e.turn_finish_reasons == ["length"] * 2 for e in episodes
    ), [(e.finish_reason, e.truncated, e.turn_finish_reasons, e.error) for e in episodes]
    metrics = summarize(episodes)
    assert metrics["cut_turn_rate"] == 1.0 and metrics["truncation_rate"] == 0.0
    closed = ScriptedBackend(
        Generation([*answer, local_tokenizer.convert_tokens_to_ids("<|im_end|>")], [-1.0] * (len(answer) + 1), "stop")
    )
    finished = RolloutEngine(CounterEnv, closed, local_tokenizer, max_turns=2).run([0], 1, SamplingParams())
    assert summarize(finished)["cut_turn_rate"] == 0.0


def test_a_backend_failure_is_retried_once_and_then_ends_only_the_episodes_it_hit(local_tokenizer):
    def flaky(failures: float) -> FaultyBackend:
        eos = ScriptedBackend([local_tokenizer.eos_token_id], logprob=0.0)
        return FaultyBackend(eos, fail_calls=failures, error=ConnectionError("server restarting"))

    episodes = RolloutEngine(CounterEnv, flaky(1), local_tokenizer).run([0], 2, SamplingParams())
    assert len(episodes) == 2 and all(e.error is None for e in episodes)
    down = RolloutEngine(CounterEnv, flaky(math.inf), local_tokenizer).run([0], 2, SamplingParams())
    assert len(down) == 2
    assert all(
        e.finish_reason == "error" and "failed twice: ConnectionError: server restarting" in e.error for e in down
    )


def test_summary_metrics_and_unbiased_pass_at_k():
    def episode(seed, score, turns=2):
        return Episode(task_seed=seed, group_index=0, score=score, turns=turns, num_tool_calls=2, tool_errors=1)

    episodes = [episode(0, 1.0), episode(0, 0.0), episode(0, 1.0), episode(1, 0.0), episode(1, 0.0), episode(1, 0.0)]
    metrics = summarize(episodes)
    assert metrics["k"] == 3 and metrics["pass@1"] == pytest.approx((2 / 3 + 0) / 2)
    assert metrics["pass@3"] == pytest.approx(0.5) and metrics["pass^3"] == 0.0
    assert metrics["mean_score"] == pytest.approx(2 / 6) and metrics["tool_error_rate"] == 0.5


def test_transformers_backend_end_to_end_with_exact_logprobs(local_tokenizer):
    from envkit.testing import build_tiny_model

    model = build_tiny_model(local_tokenizer, seed=1)
    backend = TransformersBackend(model, local_tokenizer)
    engine = RolloutEngine(lambda: envkit.make("arithmetic"), backend, local_tokenizer, max_turns=3)
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=24, seed=0)
    episodes = engine.run([0, 1], 2, sampling)
    assert len(episodes) == 4
    for episode in episodes:
        assert episode.error is None and episode.turns >= 1
        assert len(episode.completion_ids) == len(episode.env_mask) == len(episode.logprobs)
        # the recorded logprobs are the model's own: recompute them with one teacher-forced forward pass
        reference = teacher_forced_logprobs(model, episode)
        for mask, logprob, expected in zip(episode.env_mask, episode.logprobs, reference, strict=True):
            if mask:
                assert logprob == pytest.approx(expected, abs=1e-4)
            else:
                assert logprob == 0.0


def test_a_turn_ending_on_another_stop_token_is_closed_exactly_as_the_template_closes_it(qwen25_tokenizer):
    """Qwen2.5-Instruct also stops on <|endoftext|>: that token is replaced by the template's <|im_end|> (masked),
    never followed by a second end-of-turn, so the context the model trains on stays on-template."""
    endoftext, im_end = (qwen25_tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>"))
    answer = qwen25_tokenizer.encode("Done: the total is 7.", add_special_tokens=False)

    def stops_on_endoftext(request):
        assert im_end in request.sampling.stop_token_ids  # the template's end-of-turn always stops generation
        return [*answer, endoftext]

    backend = ScriptedBackend(stops_on_endoftext, logprob=-0.5)
    episode = RolloutEngine(CounterEnv, backend, qwen25_tokenizer, max_turns=2).run([0], 1, SamplingParams())[0]
    assert episode.error is None and episode.turns == 2
    assert endoftext not in episode.completion_ids
    first_turn = episode.completion_ids[: len(answer) + 1]
    assert first_turn == [*answer, im_end] and episode.env_mask[: len(answer) + 1] == [1] * len(answer) + [0]
    assert len(episode.completion_ids) == len(episode.logprobs) == len(episode.env_mask)
    renderer = ChatRenderer(qwen25_tokenizer, CounterEnv().tools)
    rendered = renderer.render(episode.messages)
    assert (
        qwen25_tokenizer.decode(episode.prompt_ids + episode.completion_ids)
        == rendered[: rendered.rfind("<|im_end|>")] + "<|im_end|>"
    )


def test_a_step_with_no_new_messages_still_opens_the_next_assistant_turn(local_tokenizer):
    reply = local_tokenizer.encode("Thinking.<|im_end|>", add_special_tokens=False)
    opening = local_tokenizer.encode("<|im_start|>assistant\n", add_special_tokens=False)
    recorder = RecordingBackend(ScriptedBackend(reply))
    episode = RolloutEngine(SilentOnce, recorder, local_tokenizer, max_turns=3).run([0], 1, SamplingParams())[0]
    prompts = recorder.prompts
    assert episode.turns == 3 and len(prompts) == 3
    assert all(p[-len(opening) :] == opening for p in prompts)  # every prompt ends with the generation prompt
    renderer = ChatRenderer(local_tokenizer, CounterEnv().tools)
    assert prompts[1] == renderer.prompt_ids(episode.messages[:2]) + reply + renderer.suffix_ids(
        episode.messages[:3], []
    )


def test_max_completion_tokens_bounds_every_episode(local_tokenizer):
    call = '<tool_call>{"name": "add", "arguments": {"amount": 1}}</tool_call><|im_end|>'
    chatty = ScriptedBackend(call, tokenizer=local_tokenizer)
    engine = RolloutEngine(CounterEnv, chatty, local_tokenizer, max_completion_tokens=60)
    for episode in engine.run([0, 1, 2], 2, SamplingParams()):
        assert episode.finish_reason == "max_episode_tokens" and episode.truncated
        assert 0 < len(episode.completion_ids) <= 60


def test_oracle_demonstrations_open_the_next_turn_after_a_silent_step(local_tokenizer):
    from envkit.demos import oracle_episode

    renderer = ChatRenderer(local_tokenizer, SilentOnce().tools)
    env = SilentOnce()
    episode = oracle_episode(env, renderer, seed=0)
    assert episode.score == 1.0 and episode.turns >= 5  # add, silent "done", "done", get_total, confirm
    rendered = renderer.render(episode.messages)
    rendered = rendered[: rendered.rfind(renderer.end_of_turn) + len(renderer.end_of_turn)]
    assert episode.prompt_ids + episode.completion_ids == renderer.encode(rendered)
