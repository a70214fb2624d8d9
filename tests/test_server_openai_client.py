"""`envkit serve` through the official `openai` client: strict response types, kept-alive connections, streaming."""

from __future__ import annotations

import http.client
import json
import sys
import time
from pathlib import Path

import openai  # the official client: in the dev extra
import pytest
from helpers import envkit_serve

ENVKIT = str(Path(sys.executable).parent / "envkit")


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    """`envkit serve` on the tiny model in its own process, as ``(host, port)``; stopped by its pid afterwards."""
    with envkit_serve(tiny_model_dir, log_path=tmp_path_factory.mktemp("serve") / "serve.log") as url:
        host, port = url.removeprefix("http://").split(":")
        yield host, int(port)


def make_client(server: tuple[str, int], *, strict: bool) -> openai.OpenAI:
    """The official client over ONE pooled connection (so a request that leaves the connection in a bad state breaks
    the next one), never retrying; ``strict``: every response is validated against the client's own types."""
    try:
        import httpx2 as httpx  # what openai >= 3 is built on
    except ImportError:
        import httpx

    host, port = server
    return openai.OpenAI(
        base_url=f"http://{host}:{port}/v1",
        api_key="unused",
        max_retries=0,
        http_client=openai.DefaultHttpxClient(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1)),
        _strict_response_validation=strict,
    )


@pytest.fixture
def client(server):
    """The official client, strict (see :func:`make_client`)."""
    with make_client(server, strict=True) as client:
        yield client


def test_models_parse_with_every_field_the_client_requires(client):
    (model,) = client.models.list().data
    assert model.id == "tiny" and model.object == "model" and model.owned_by == "envkit"
    assert isinstance(model.created, int) and abs(model.created - time.time()) < 3600
    assert client.models.retrieve("tiny") == model
    with pytest.raises(openai.NotFoundError, match="no model 'gpt-4'; this server serves 'tiny'"):
        client.models.retrieve("gpt-4")


def test_completions_create_parses_with_usage_and_logprobs(client, local_tokenizer):
    prompt = local_tokenizer.encode("hello there", add_special_tokens=False)
    completion = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, logprobs=1, seed=3)
    assert completion.object == "text_completion" and completion.model == "tiny"
    (choice,) = completion.choices
    assert choice.finish_reason in ("stop", "length") and choice.index == 0
    token_ids = choice.model_extra["token_ids"]
    assert 1 <= len(token_ids) <= 5 and choice.logprobs.tokens == [f"token_id:{t}" for t in token_ids]
    assert len(choice.logprobs.token_logprobs) == len(token_ids)
    usage = completion.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt), len(token_ids))
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    again = client.completions.create(model="tiny", prompt=prompt, max_tokens=5, logprobs=1, seed=3)
    assert again.choices[0].model_extra["token_ids"] == token_ids  # seeded: the same sample


def test_completions_n_gives_n_choices_per_prompt(client):
    completion = client.completions.create(model="tiny", prompt=["a", "b"], max_tokens=3, n=2, seed=1)
    assert [c.index for c in completion.choices] == [0, 1, 2, 3]
    assert completion.usage.completion_tokens == sum(len(c.model_extra["token_ids"]) for c in completion.choices)


def test_a_404_and_errors_in_between_leave_the_kept_alive_connection_usable(server):
    # The client's one connection: a request the server refused used to leave its unread body in the socket, read as
    # the start of the next request (400/501). Not strict: this test is about the connection alone.
    client = make_client(server, strict=False)
    assert client.models.list().data[0].id == "tiny"
    with pytest.raises(openai.NotFoundError, match="no route /v1/chat/completions"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi " * 200}])
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.total_tokens > 0
    with pytest.raises(openai.NotFoundError, match="no route /v1/nope"):
        client.post("/nope", cast_to=object, body={"padding": "x" * 5000})
    with pytest.raises(openai.BadRequestError, match="prompt"):
        client.completions.create(model="tiny", prompt=[], max_tokens=2)
    assert client.models.list().data[0].id == "tiny"
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).choices[0].text is not None

    # The same on a raw HTTP/1.1 connection, checked to be the one socket throughout.
    connection = http.client.HTTPConnection(*server, timeout=30)
    try:
        replies = []
        for method, path, body in [
            ("POST", "/v1/nope", {"padding": "x" * 5000}),
            ("GET", "/v1/models", None),
            ("POST", "/v1/completions", "{not json"),
            ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ]:
            data = body if isinstance(body, str) else None if body is None else json.dumps(body)
            connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
            sock = connection.sock
            reply = connection.getresponse()
            replies.append((reply.status, json.loads(reply.read())))
            assert connection.sock is sock  # kept alive, not reopened
        assert [status for status, _ in replies] == [404, 200, 400, 200], replies
        assert replies[2][1]["error"]["type"] == "invalid_request_error"
    finally:
        connection.close()
        client.close()


def test_chat_completions_is_a_404_that_names_what_is_served(client):
    with pytest.raises(openai.NotFoundError, match="envkit serve answers /v1/completions") as raised:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
    assert "chat template" in raised.value.message


def test_stream_true_is_a_clear_error_not_an_empty_stream(client):
    with pytest.raises(openai.BadRequestError, match="streaming is not supported") as raised:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, stream=True)
    assert raised.value.param == "stream" and raised.value.type == "invalid_request_error"
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).choices  # the connection still works


@pytest.mark.parametrize(
    ("option", "value"),
    [("echo", True), ("suffix", "!"), ("best_of", 3), ("logit_bias", {"5": 10}), ("presence_penalty", 0.5)],
)
def test_options_the_server_would_ignore_are_refused_by_name(client, option, value):
    with pytest.raises(openai.BadRequestError, match=f"{option} is not supported by envkit serve") as raised:
        client.completions.create(model="tiny", prompt="hi", max_tokens=2, **{option: value})
    assert raised.value.param == option


def test_one_stop_string_is_one_stop_string_not_its_characters(client, local_tokenizer):
    """OpenAI's ``stop`` is a string or a list of strings: a string is one stop string, as ``[string]``."""
    prompt = local_tokenizer.encode("hello there", add_special_tokens=False)

    def completion(**stop) -> tuple[list[int], str]:
        (choice,) = client.completions.create(model="tiny", prompt=prompt, max_tokens=40, seed=3, **stop).choices
        return choice.model_extra["token_ids"], choice.finish_reason

    unstopped = completion()
    assert "er§QQ" not in local_tokenizer.decode(unstopped[0])  # never generated: neither form stops early
    assert completion(stop="er§QQ") == completion(stop=["er§QQ"]) == unstopped
    with pytest.raises(openai.BadRequestError, match="stop must be a string or a list of strings, got 5"):
        client.completions.create(model="tiny", prompt=prompt, max_tokens=4, stop=5)
