"""The backend contract, one suite for every backend (a new backend adds a case to :data:`CASES`, not a test file).

Token backends — transformers, OpenAI ``/v1/completions`` (``envkit serve``'s server), SGLang ``/generate`` (a
stand-in over the same model), vLLM (``-m vllm``), scripted and the oracle — play episodes through the rollout
engine: greedy episodes equal the in-process model's token for token, seeded samples repeat and differ per request,
each prompt gets its own budget, turns end for the reasons they report, and logprobs are the model's. Remote backends
(OpenAI, SGLang, chat completions) share the HTTP client: a dead server is named, failures are retried on another
server, client errors are not, and a hung server ends the request at its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from helpers import CounterEnv, free_port
from http_stand_ins import OpenAIStandIn, ScriptedServer, SGLangStandIn

import envkit
from envkit.backends import (
    AsyncBackend,
    Backend,
    BackendError,
    ChatCompletionsBackend,
    Checkable,
    GenerationTimeout,
    OpenAIBackend,
    SamplingParams,
    ScriptedBackend,
    SGLangBackend,
    TransformersBackend,
)
from envkit.backends.oracle import OracleBackend
from envkit.chat import ChatRenderer
from envkit.rollout import RolloutEngine

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))


@pytest.fixture(scope="module")
def in_process(tiny_model, local_tokenizer) -> TransformersBackend:
    """The reference: the tiny model in this process."""
    return TransformersBackend(tiny_model, local_tokenizer)


# ---- the cases -------------------------------------------------------------------------------------------------------
@dataclass
class Case:
    """One backend under test: ``backend`` generates; ``model`` says whether it runs the tiny model (so its greedy
    episodes must equal the in-process model's)."""

    backend: Any
    model: bool


@contextlib.contextmanager
def transformers_case(tiny_model, tokenizer, tiny_model_dir) -> Iterator[Case]:
    yield Case(TransformersBackend(tiny_model, tokenizer), model=True)


@contextlib.contextmanager
def openai_case(tiny_model, tokenizer, tiny_model_dir) -> Iterator[Case]:
    with OpenAIStandIn(tiny_model, tokenizer) as server:
        yield Case(OpenAIBackend(server.url, "tiny"), model=True)


@contextlib.contextmanager
def sglang_case(tiny_model, tokenizer, tiny_model_dir) -> Iterator[Case]:
    with SGLangStandIn(TransformersBackend(tiny_model, tokenizer), tokenizer) as server:
        yield Case(SGLangBackend(server.url, "tiny"), model=True)


@pytest.fixture(scope="module")
def vllm_engine(tiny_model_dir):
    """One in-process ``AsyncLLM`` on the tiny model for the module (an engine takes tens of seconds to start)."""
    pytest.importorskip("vllm")
    from envkit.backends import AsyncVLLMBackend

    with AsyncVLLMBackend(str(tiny_model_dir), dtype="float32", enforce_eager=True, max_model_len=512) as backend:
        yield backend


@contextlib.contextmanager
def vllm_case(tiny_model, tokenizer, tiny_model_dir, engine=None) -> Iterator[Case]:
    yield Case(engine, model=True)


@contextlib.contextmanager
def scripted_case(tiny_model, tokenizer, tiny_model_dir) -> Iterator[Case]:
    def reply(request):  # a "model" whose tokens depend on the prompt and the seed, as a sampling one's do
        seed = 0 if request.seed is None else request.seed
        return [(sum(request.ids) + seed + step) % 200 + 20 for step in range(64)]

    yield Case(ScriptedBackend(reply, tokenizer=tokenizer), model=False)


MODEL_CASES = {
    "transformers": transformers_case,
    "openai": openai_case,
    "sglang": sglang_case,
    "vllm": vllm_case,
}
CASES = {**MODEL_CASES, "scripted": scripted_case}


def params(names):
    return [pytest.param(n, marks=pytest.mark.vllm) if n == "vllm" else n for n in names]


@pytest.fixture
def case(request, tiny_model, local_tokenizer, tiny_model_dir) -> Iterator[Case]:
    if request.param == "vllm":
        with vllm_case(tiny_model, local_tokenizer, tiny_model_dir, request.getfixturevalue("vllm_engine")) as built:
            yield built
        return
    with CASES[request.param](tiny_model, local_tokenizer, tiny_model_dir) as built:
        yield built


def guess_episodes(backend, tokenizer, sampling, tasks=(0, 1), group=2):
    engine = RolloutEngine(lambda: envkit.make("guess-number"), backend, tokenizer, max_turns=3)
    try:
        return engine.run(list(tasks), group, sampling)
    finally:
        engine.close()


def prompt_of(tokenizer) -> list[int]:
    return ChatRenderer(tokenizer).prompt_ids([{"role": "user", "content": "Say something."}])


# ---- what every token backend is -------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", params(CASES), indirect=True)
def test_it_is_a_backend_and_declares_what_else_it_can_do(case):
    assert isinstance(case.backend, Backend)
    remote = isinstance(case.backend, (OpenAIBackend, SGLangBackend))
    assert isinstance(case.backend, Checkable) == remote
    if remote:
        case.backend.check()
        assert isinstance(case.backend, AsyncBackend)


@pytest.mark.parametrize("case", params(MODEL_CASES), indirect=True)
def test_greedy_episodes_equal_the_in_process_models(case, in_process, local_tokenizer):
    remote = guess_episodes(case.backend, local_tokenizer, GREEDY)
    local = guess_episodes(in_process, local_tokenizer, GREEDY)
    assert all(e.error is None and e.turns >= 1 for e in remote), [e.error for e in remote]
    for a, b in zip(remote, local, strict=True):
        assert (a.task_seed, a.group_index, a.turns) == (b.task_seed, b.group_index, b.turns)
        assert (a.prompt_ids, a.completion_ids, a.env_mask) == (b.prompt_ids, b.completion_ids, b.env_mask)
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


@pytest.mark.parametrize("case", params(CASES), indirect=True)
def test_seeded_samples_repeat_and_differ_per_request(case, local_tokenizer):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=7)
    first = guess_episodes(case.backend, local_tokenizer, sampling)
    again = guess_episodes(case.backend, local_tokenizer, sampling)
    assert [e.completion_ids for e in first] == [e.completion_ids for e in again]
    for seed in (0, 1):  # the members of a group each get their own request seed
        group = [tuple(e.completion_ids) for e in first if e.task_seed == seed]
        assert len(set(group)) == len(group)
    other = guess_episodes(case.backend, local_tokenizer, SamplingParams(temperature=1.0, max_new_tokens=8, seed=8))
    assert [e.completion_ids for e in other] != [e.completion_ids for e in first]


@pytest.mark.parametrize("case", params(CASES), indirect=True)
def test_each_prompt_gets_exactly_its_own_budget(case, local_tokenizer):
    prompt = prompt_of(local_tokenizer)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=6)
    short, long = case.backend.generate([prompt, prompt], sampling, max_new_tokens=[2, 6])
    [alone] = case.backend.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=2))
    assert short.token_ids == alone.token_ids and len(short.token_ids) <= 2
    assert long.token_ids[: len(short.token_ids)] == short.token_ids
    for generation in (short, long, alone):
        assert len(generation.logprobs) == len(generation.token_ids)


@pytest.mark.parametrize("case", params(CASES), indirect=True)
def test_turns_end_for_the_reason_they_report(case, local_tokenizer):
    prompt = prompt_of(local_tokenizer)
    [free] = case.backend.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=4))
    assert (free.finish_reason, len(free.token_ids)) == ("length", 4), free
    stop = free.token_ids[1]  # the second token: a stop token there ends the turn on it
    first = free.token_ids.index(stop)
    [stopped] = case.backend.generate(
        [prompt], SamplingParams(temperature=0.0, max_new_tokens=4, stop_token_ids=[stop])
    )
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free.token_ids[: first + 1]  # the stop token is the turn's last


@pytest.mark.parametrize("case", params(MODEL_CASES), indirect=True)
def test_logprobs_are_the_models_own(case, tiny_model, local_tokenizer):
    import torch

    prompt = prompt_of(local_tokenizer)
    [generation] = case.backend.generate([prompt], SamplingParams(temperature=1.0, max_new_tokens=6), seeds=[3])
    ids = torch.tensor([prompt + generation.token_ids])
    with torch.no_grad():
        logits = tiny_model(ids).logits[0, len(prompt) - 1 : -1].float()
    expected = torch.log_softmax(logits, dim=-1).gather(1, ids[0, len(prompt) :, None])[:, 0].tolist()
    assert generation.logprobs == pytest.approx(expected, abs=1e-3)


def test_the_oracle_plays_token_exact_episodes(local_tokenizer):
    """The oracle is a backend too: its episodes run through the engine like a model's, and score."""
    backend = OracleBackend(CounterEnv, local_tokenizer, seeds=[0, 1])
    assert isinstance(backend, Backend)
    engine = RolloutEngine(CounterEnv, backend, local_tokenizer)
    episodes = engine.run([0, 1], 1, GREEDY)
    engine.close()
    assert all(e.error is None and e.score == 1.0 for e in episodes), [e.error for e in episodes]
    for episode in episodes:
        assert len(episode.logprobs) == len(episode.completion_ids) == len(episode.env_mask)


# ---- what every remote backend shares --------------------------------------------------------------------------------
@dataclass
class Remote:
    """A remote backend's wire format: a good reply, and one request."""

    make: Callable[..., Any]
    reply: dict[str, Any]
    ask: Callable[[Any, float | None], Any]


def ask_tokens(backend, timeout_s=None):
    return asyncio.run(backend.agenerate([1, 2, 3], SamplingParams(max_new_tokens=2), 1, timeout_s=timeout_s))


def ask_chat(backend, timeout_s=None):
    return asyncio.run(backend.achat([{"role": "user", "content": "Hi"}], timeout_s=timeout_s))


REMOTES = {
    "openai": Remote(
        OpenAIBackend,
        {
            "choices": [
                {
                    "finish_reason": "length",
                    "token_ids": [5, 6],
                    "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.5, -1.5]},
                }
            ]
        },
        ask_tokens,
    ),
    "sglang": Remote(
        SGLangBackend,
        {
            "output_ids": [5, 6],
            "meta_info": {
                "finish_reason": {"type": "length", "length": 2},
                "output_token_logprobs": [[-0.5, 5, None], [-1.5, 6, None]],
            },
        },
        ask_tokens,
    ),
    "chat": Remote(
        ChatCompletionsBackend,
        {"choices": [{"message": {"role": "assistant", "content": "Hello."}, "finish_reason": "stop"}]},
        ask_chat,
    ),
}


def closed_url() -> str:
    """A URL where nothing listens (connections are refused at once)."""
    return f"http://127.0.0.1:{free_port()}"


def answered(remote: Remote, result: Any) -> bool:
    if remote.ask is ask_chat:
        return result.message == {"role": "assistant", "content": "Hello."}
    return (result.token_ids, result.logprobs, result.finish_reason) == ([5, 6], [-0.5, -1.5], "length")


@pytest.mark.parametrize("name", REMOTES)
def test_check_names_the_server_that_does_not_answer(name):
    remote = REMOTES[name]
    dead = closed_url()
    with ScriptedServer([], (200, remote.reply)) as live:
        remote.make([live.url], "tiny").check()
        with pytest.raises(BackendError, match=f"the server at {dead} does not answer") as raised:
            remote.make([live.url, dead], "tiny").check()
    assert live.url not in str(raised.value)


@pytest.mark.parametrize("name", REMOTES)
@pytest.mark.parametrize("status", [500, 503, 429])
def test_a_server_error_is_retried_on_another_server(name, status):
    remote = REMOTES[name]
    with (
        ScriptedServer([(status, {"error": {"message": "overloaded"}})], (200, remote.reply)) as first,
        ScriptedServer([], (200, remote.reply)) as second,
    ):
        backend = remote.make([first.url, second.url], "tiny", backoff_s=0.01)
        assert answered(remote, remote.ask(backend))
    assert backend.stats[first.url] == {"requests": 1, "retries": 0, "failures": 1}
    assert backend.stats[second.url] == {"requests": 1, "retries": 1, "failures": 0}
    assert first.bodies == second.bodies  # the same request, seed included


@pytest.mark.parametrize("name", REMOTES)
def test_a_client_error_fails_at_once_with_the_servers_message(name):
    remote = REMOTES[name]
    message = {"error": {"message": "This model's maximum context length is 32 tokens.\nYou asked for 40."}}
    with ScriptedServer([(400, message)], (200, remote.reply)) as bad, ScriptedServer([], (200, remote.reply)) as other:
        backend = remote.make([bad.url, other.url], "tiny", backoff_s=0.01)
        with pytest.raises(BackendError) as raised:
            remote.ask(backend)
    text = str(raised.value)
    assert "HTTP 400" in text and "maximum context length is 32 tokens. You asked for 40." in text and "\n" not in text
    assert len(bad.bodies) == 1 and other.bodies == []  # not retried, anywhere


@pytest.mark.parametrize("name", REMOTES)
def test_every_server_down_fails_naming_each(name):
    remote = REMOTES[name]
    urls = [closed_url(), closed_url()]
    backend = remote.make(urls, "tiny", retries=2, backoff_s=0.01)
    with pytest.raises(BackendError) as raised:
        remote.ask(backend)
    assert "failed 3 times" in str(raised.value) and all(url in str(raised.value) for url in urls)
    assert sum(s["requests"] for s in backend.stats.values()) == sum(s["failures"] for s in backend.stats.values())


@pytest.mark.parametrize("name", REMOTES)
def test_a_hung_server_ends_the_request_at_its_deadline(name):
    remote = REMOTES[name]
    with ScriptedServer([], (200, remote.reply), hang_s=3.0) as hung:
        backend = remote.make([hung.url], "tiny")
        with pytest.raises(GenerationTimeout, match=r"longer than 0.2s"):
            remote.ask(backend, 0.2)
    assert math.isclose(backend.stats[hung.url]["requests"], 1)


@pytest.mark.parametrize("name", ["openai", "sglang"])
def test_every_server_down_ends_each_episode_with_an_error_naming_them(name, local_tokenizer):
    urls = [closed_url(), closed_url()]
    backend = REMOTES[name].make(urls, "tiny", retries=2, backoff_s=0.01)
    episodes = guess_episodes(backend, local_tokenizer, GREEDY)
    assert len(episodes) == 4
    for episode in episodes:
        assert episode.finish_reason == "error" and episode.score == 0.0
        assert all(url in episode.error for url in urls), episode.error
    requests = sum(s["requests"] for s in backend.stats.values())
    assert requests == sum(s["failures"] for s in backend.stats.values()) == 4 * 2 * 3  # 2 tries of 3 attempts each
