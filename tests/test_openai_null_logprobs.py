"""A server's ``null`` logprob is never turned into a number: the turn fails as a token/logprob count mismatch does
(OpenAIBackend against a scripted stand-in HTTP server)."""

from __future__ import annotations

import copy

import pytest
from http_stand_ins import ScriptedServer
from test_openai_backend import COMPLETION, guess_engine

from envkit.backends import BackendError, OpenAIBackend, SamplingParams


def completion(token_logprobs: list[float | None]) -> dict:
    reply = copy.deepcopy(COMPLETION)
    reply["choices"][0]["logprobs"]["token_logprobs"] = token_logprobs
    return reply


@pytest.mark.parametrize(
    ("token_logprobs", "says"),
    [([-0.5, None], "null logprob for token 1 of 2"), ([-0.5], "returned 2 tokens but 1 logprobs")],
)
def test_a_null_logprob_fails_the_request_as_a_count_mismatch_does(token_logprobs, says):
    with ScriptedServer([(200, completion(token_logprobs))], (200, COMPLETION)) as stub:
        backend = OpenAIBackend(stub.url, "tiny", backoff_s=0.01)
        with pytest.raises(BackendError, match=says) as raised:
            backend.generate([[1, 2, 3]], SamplingParams())
    assert "\n" not in str(raised.value)
    assert len(stub.bodies) == 1  # the server answered: not retried


def test_an_episode_whose_server_sends_null_logprobs_ends_with_an_error(local_tokenizer):
    nulls = completion([None, None])
    with ScriptedServer([(200, nulls)] * 8, (200, COMPLETION)) as stub:
        backend = OpenAIBackend(stub.url, "tiny", backoff_s=0.01)
        [episode] = guess_engine(backend, local_tokenizer).run([0], 1, SamplingParams(max_new_tokens=2))
    assert episode.finish_reason == "error" and episode.score == 0.0
    assert "null logprob" in episode.error, episode.error
    assert episode.logprobs == []  # no invented value reached the episode
