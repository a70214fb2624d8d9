"""What is SGLang's own in the SGLang backend: its knob conventions on the wire, its replies, and ``envkit eval
--backend sglang`` against a stand-in ``/generate`` over the tiny model (the shared contract is in
test_backend_contract.py)."""

from __future__ import annotations

import json

import pytest
from http_stand_ins import ScriptedServer, SGLangStandIn

from envkit.backends import BackendError, SamplingParams, SGLangBackend, TransformersBackend
from envkit.cli.app import main

GOOD = {
    "output_ids": [5, 6],
    "meta_info": {
        "finish_reason": {"type": "stop", "matched": 6},
        "output_token_logprobs": [[-0.5, 5, None], [-1.5, 6, None]],
    },
}


def test_every_knob_is_sent_in_sglangs_terms():
    """``top_k`` −1 is SGLang's "off" (it refuses 0), the budget is ``max_new_tokens``, the seed ``sampling_seed``;
    neutral knobs are sent too, so nothing is filled from the model's generation_config.json."""
    backend = SGLangBackend("http://127.0.0.1:9", "tiny")
    off = backend.request_body([1, 2], SamplingParams(top_k=None, max_new_tokens=5), None)
    assert off == {
        "input_ids": [1, 2],
        "sampling_params": {
            "max_new_tokens": 5,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        },
        "return_logprob": True,
        "logprob_start_len": -1,
    }
    assert backend.request_body([1], SamplingParams(top_k=0), None)["sampling_params"]["top_k"] == -1
    knobs = SamplingParams(temperature=0.7, top_k=20, min_p=0.05, stop=["\n"], stop_token_ids=[2])
    params = backend.request_body([1], knobs, 123)["sampling_params"]
    assert (params["top_k"], params["min_p"], params["stop"], params["stop_token_ids"]) == (20, 0.05, ["\n"], [2])
    assert params["sampling_seed"] == 123 and "seed" not in params


def test_a_reply_gives_tokens_logprobs_and_the_finish_reason():
    backend = SGLangBackend("http://127.0.0.1:9", "tiny")
    generation = backend.parse_generation(GOOD, "http://x")
    assert (generation.token_ids, generation.logprobs, generation.finish_reason) == ([5, 6], [-0.5, -1.5], "stop")
    with pytest.raises(BackendError, match="null logprob for token 1 of 2"):
        backend.parse_generation({"meta_info": {"output_token_logprobs": [[-0.5, 5, None], [None, 6, None]]}}, "u")
    with pytest.raises(BackendError, match="unexpected /generate response"):
        backend.parse_generation({"text": "no meta_info"}, "u")


def test_an_aborted_request_is_retried():
    aborted = {"meta_info": {"finish_reason": {"type": "abort", "message": "restarting"}, "output_token_logprobs": []}}
    with ScriptedServer([(200, aborted)], (200, GOOD)) as server:
        backend = SGLangBackend(server.url, "tiny", backoff_s=0.01)
        [generation] = backend.generate([[1, 2]], SamplingParams(max_new_tokens=2))
    assert generation.token_ids == [5, 6]
    assert backend.stats[server.url] == {"requests": 2, "retries": 1, "failures": 1}


def test_check_tells_an_sglang_server_from_another():
    class NotSGLang(ScriptedServer):
        def get(self, path):
            return 404, {"detail": "Not Found"}

    with NotSGLang([], (200, GOOD)) as server, pytest.raises(BackendError, match="GET /get_model_info → HTTP 404"):
        SGLangBackend(server.url, "tiny").check()


@pytest.fixture(scope="module")
def sglang_server(tiny_model_dir, local_tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    with SGLangStandIn(TransformersBackend(model, local_tokenizer), local_tokenizer) as server:
        yield server


def test_envkit_eval_with_the_sglang_backend(sglang_server, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "episodes.jsonl"
    argv = ["eval", "guess-number", "--backend", "sglang", "--base-url", sglang_server.url, "--model", "tiny"]
    argv += ["--tokenizer", str(tiny_model_dir), "--tasks", "2", "--samples", "2", "--max-new-tokens", "8"]
    assert main([*argv, "--max-turns", "2", "--temperature", "0", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 4
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 4 and all(line["error"] is None and line["turns"] >= 1 for line in lines)
    assert all(body["sampling_params"]["top_k"] == -1 for body in sglang_server.bodies)


def test_envkit_eval_sglang_needs_a_server(tiny_model_dir, capsys):
    argv = ["eval", "guess-number", "--backend", "sglang", "--model", "tiny", "--tokenizer", str(tiny_model_dir)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--backend sglang needs --base-url" in err and "Traceback" not in err
