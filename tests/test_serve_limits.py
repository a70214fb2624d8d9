"""``envkit serve`` refuses what it cannot serve safely, each with an error naming the limit: token ids outside the
model's vocabulary (on CUDA an out-of-range id is a device-side assert that fails every later request), bodies over
``--max-body-bytes``, ``n`` over ``--max-n``, ``max_tokens`` over ``--max-tokens-limit``; and it keeps serving."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import httpx
import pytest
from helpers import envkit_serve

from envkit.cli.app import main

ENVKIT = str(Path(sys.executable).parent / "envkit")


@pytest.fixture(scope="module")
def url(tiny_model_dir, tmp_path_factory):
    """`envkit serve` on the tiny model in its own process, with small limits; stopped by its pid afterwards."""
    limits = ["--max-body-bytes", "4096", "--max-n", "2", "--max-tokens-limit", "8"]
    with envkit_serve(tiny_model_dir, *limits, log_path=tmp_path_factory.mktemp("serve") / "serve.log") as url:
        yield url


@pytest.fixture(scope="module")
def vocabulary(tiny_model_dir) -> int:
    return json.loads((tiny_model_dir / "config.json").read_text())["vocab_size"]


def complete(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": "tiny", "max_tokens": 2, **body}, timeout=60)


def refused(reply: httpx.Response, status: int, *says: str) -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert all(s in error["message"] for s in says), error
    return error


def test_a_token_id_outside_the_vocabulary_is_refused_and_the_server_goes_on(url, vocabulary):
    for prompt, bad in (([1, vocabulary], vocabulary), ([[3, 4], [vocabulary + 7]], vocabulary + 7), ([-1, 2], -1)):
        error = refused(complete(url, prompt=prompt), 400, f"token id {bad} in prompt", f"0-{vocabulary - 1}")
        assert error["param"] == "prompt"
    error = refused(complete(url, prompt=[1, 2], stop_token_ids=[vocabulary]), 400, f"token id {vocabulary}")
    assert error["param"] == "stop_token_ids"
    reply = complete(url, prompt=[1, vocabulary - 1])  # the last id is in range
    assert reply.status_code == 200 and len(reply.json()["choices"][0]["token_ids"]) >= 1


def test_n_and_max_tokens_over_their_limits_are_refused(url):
    error = refused(complete(url, prompt=[1, 2], n=3), 400, "n=3", "limit of 2", "--max-n")
    assert error["param"] == "n"
    assert complete(url, prompt=[1, 2], n=2).status_code == 200
    error = refused(complete(url, prompt=[1, 2], max_tokens=9), 400, "max_tokens=9", "1-8", "--max-tokens-limit")
    assert error["param"] == "max_tokens"
    refused(complete(url, prompt=[1, 2], max_tokens=0), 400, "max_tokens=0")
    assert complete(url, prompt=[1, 2], max_tokens=8).status_code == 200


def test_a_body_over_the_limit_is_refused_unread(url):
    with httpx.Client(timeout=60) as client:
        big = client.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [1] * 3000, "max_tokens": 1})
        refused(big, 413, "over this server's limit of 4096", "--max-body-bytes")
        assert big.headers.get("connection") == "close"
        again = client.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": [1, 2], "max_tokens": 1})
        assert again.status_code == 200


def test_the_defaults_derive_from_the_model(tiny_model_dir):
    from envkit.models.loading import load_model, load_tokenizer
    from envkit.serving.openai import DEFAULT_MAX_N, make_server

    model = load_model(str(tiny_model_dir))
    server = make_server(model, load_tokenizer(str(tiny_model_dir)), port=0)
    try:
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"
        context = model.config.max_position_embeddings
        refused(complete(url, prompt=[1], max_tokens=context + 1), 400, f"1-{context}")
        refused(complete(url, prompt=[1], n=DEFAULT_MAX_N + 1), 400, f"limit of {DEFAULT_MAX_N}")
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("flag", ["--max-body-bytes", "--max-n", "--max-tokens-limit"])
def test_a_limit_below_1_is_one_line(flag, capsys):
    assert main(["serve", "--model", "nowhere", flag, "0"]) == 2
    err = capsys.readouterr().err
    assert f"{flag} must be at least 1" in err and "Traceback" not in err


@pytest.mark.parametrize("port", ["99999", "-1"])
def test_a_port_out_of_range_is_one_line_before_the_model_loads(port, capsys):
    """socketserver raised OverflowError (a traceback) once the model had loaded; "nowhere" is never loaded now."""
    assert main(["serve", "--model", "nowhere", "--port", port]) == 2
    assert capsys.readouterr().err == f"error: --port {port} is not a TCP port (0-65535; 0 picks a free one)\n"


def test_the_help_states_the_servers_defaults(capsys):
    from envkit.serving.openai import DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_N

    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default {DEFAULT_MAX_BODY_BYTES // 2**20} MiB)" in text and f"(default {DEFAULT_MAX_N})" in text


def test_a_sampling_setting_out_of_range_is_refused_and_top_k_minus_1_is_off(url):
    """A negative temperature used to decode greedily, top_p 2 to sample with top-p off, and top_k -1 (vLLM's "off")
    to fail the request with a 500."""
    for setting, value in (("temperature", -1), ("top_p", 2), ("min_p", 3), ("top_k", -5), ("repetition_penalty", 0)):
        error = refused(complete(url, prompt=[1, 2], **{setting: value}), 400, f"{setting} must be")
        assert error["param"] == setting
    assert complete(url, prompt=[1, 2], top_k=-1).status_code == 200
