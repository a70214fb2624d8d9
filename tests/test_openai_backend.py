"""What is OpenAIBackend's own, over real HTTP (``envkit serve`` processes): per-episode ``agenerate`` against the
batched path, several servers, a server killed mid-run, every knob on the wire, ``envkit eval`` with several servers.
The contract every backend shares (greedy episodes, seeds, budgets, stop reasons, logprobs, dead servers, retries,
deadlines) is tests/backends/test_backend_contract.py's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import free_port
from http_stand_ins import ScriptedServer

import envkit
from envkit.backends import BackendError, OpenAIBackend, RecordingBackend, SamplingParams
from envkit.cli.app import main
from envkit.rollout import RolloutEngine

ENVKIT = str(Path(sys.executable).parent / "envkit")


def start_servers(model_dir: Path, log_dir: Path, count: int) -> list[tuple[subprocess.Popen, str]]:
    """``count`` `envkit serve` processes on the tiny model, started together; returned once all answer."""
    started = []
    for _ in range(count):
        port = free_port()
        log = open(log_dir / f"serve-{port}.log", "wb")  # noqa: SIM115 (closed by stop_server)
        process = subprocess.Popen(
            [ENVKIT, "serve", "--model", str(model_dir), "--port", str(port), "--served-model-name", "tiny"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        process.log = log
        started.append((process, f"http://127.0.0.1:{port}"))
    deadline = time.time() + 3600  # a loaded machine is slow, not broken: only an exit (or an hour) fails
    for process, url in started:
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                if process.poll() is not None or time.time() > deadline:
                    for other, _ in started:
                        stop_server(other)
                    pytest.fail(f"envkit serve at {url} did not start: {Path(process.log.name).read_text()[-2000:]}")
                time.sleep(0.2)
    return started


def stop_server(process: subprocess.Popen) -> None:
    """Stop one server started by :func:`start_servers`, by its pid."""
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
    process.log.close()


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    """Two `envkit serve` processes on the tiny model (URLs)."""
    started = start_servers(tiny_model_dir, tmp_path_factory.mktemp("serve-logs"), 2)
    yield [url for _, url in started]
    for process, _ in started:
        stop_server(process)


def closed_url() -> str:
    """A URL where nothing listens (connections are refused at once)."""
    return f"http://127.0.0.1:{free_port()}"


def total(backend: OpenAIBackend, key: str) -> int:
    return sum(counts[key] for counts in backend.stats.values())


def guess_engine(backend, tokenizer, **kwargs) -> RolloutEngine:
    return RolloutEngine(lambda: envkit.make("guess-number"), backend, tokenizer, max_turns=3, **kwargs)


def assert_same_episodes(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        assert (a.task_seed, a.group_index, a.turns) == (b.task_seed, b.group_index, b.turns)
        assert a.prompt_ids == b.prompt_ids
        assert a.completion_ids == b.completion_ids
        assert a.env_mask == b.env_mask
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


# ---- (a) agenerate against the batched path ------------------------------------------------------------------------
def test_agenerate_sends_the_same_seeded_requests_as_the_batched_path(servers, local_tokenizer):
    backend = OpenAIBackend(servers[0], "tiny")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
    per_episode = guess_engine(backend, local_tokenizer).run([0, 1], 3, sampling)
    assert backend.stats[servers[0]]["requests"] == sum(e.turns for e in per_episode)  # one request per turn
    # A RecordingBackend offers the batched ``generate`` alone: the engine drives it through its MicroBatcher.
    generate_only = RecordingBackend(OpenAIBackend(servers[0], "tiny"))
    batched = guess_engine(generate_only, local_tokenizer).run([0, 1], 3, sampling)
    assert sum(generate_only.batch_sizes) == sum(e.turns for e in batched)  # every turn through generate
    assert all(e.error is None for e in per_episode + batched)
    assert_same_episodes(per_episode, batched)
    for seed in (0, 1):  # each member of a group has its own request seed
        group = [tuple(e.completion_ids) for e in per_episode if e.task_seed == seed]
        assert len(set(group)) == len(group)


# ---- (b) several servers ---------------------------------------------------------------------------------------------
def test_requests_are_spread_over_both_servers(servers, local_tokenizer):
    backend = OpenAIBackend(servers, "tiny")
    episodes = guess_engine(backend, local_tokenizer).run([0, 1, 2, 3], 2, SamplingParams(max_new_tokens=8, seed=1))
    assert len(episodes) == 8 and all(e.error is None for e in episodes)
    requests = [backend.stats[url]["requests"] for url in servers]
    assert sum(requests) == sum(e.turns for e in episodes)
    assert min(requests) >= sum(requests) // 4, backend.stats  # least-busy routing: neither server idles
    assert total(backend, "retries") == total(backend, "failures") == 0


def test_base_url_forms(servers):
    a, b = servers
    assert OpenAIBackend(f" {a}/v1/ , {b}", "tiny").base_urls == [a, b]
    assert OpenAIBackend([a + "/", f"{b},{a}"], "tiny").base_urls == [a, b]
    assert OpenAIBackend(a, "tiny").base_url == a
    for bad in ("", " , ", "127.0.0.1:8000", ["http://x", 3]):
        with pytest.raises(ValueError):
            OpenAIBackend(bad, "tiny")


# ---- (c) a dead server among several costs no episode ----------------------------------------------------------------
def test_a_server_that_never_answers_costs_no_episode(servers, local_tokenizer):
    dead = closed_url()
    backend = OpenAIBackend([dead, servers[0]], "tiny", backoff_s=0.05)
    with pytest.raises(BackendError, match=f"the server at {dead} does not answer"):
        backend.check()
    episodes = guess_engine(backend, local_tokenizer).run([0, 1, 2], 2, SamplingParams(max_new_tokens=8, seed=2))
    assert len(episodes) == 6 and all(e.error is None and e.finish_reason != "error" for e in episodes)
    assert backend.stats[dead]["requests"] == backend.stats[dead]["failures"] >= 1
    assert total(backend, "retries") >= 1
    assert backend.stats[servers[0]]["failures"] == 0


def test_a_server_killed_mid_run_costs_no_episode(servers, tiny_model_dir, local_tokenizer, tmp_path):
    [(victim, victim_url)] = start_servers(tiny_model_dir, tmp_path, 1)
    try:
        backend = OpenAIBackend([victim_url, servers[1]], "tiny", backoff_s=0.05)
        killed = threading.Event()

        def kill_after_its_first_request():
            while not killed.is_set():
                if backend.stats[victim_url]["requests"] >= 1:
                    os.kill(victim.pid, signal.SIGKILL)
                    killed.set()
                time.sleep(0.002)

        watcher = threading.Thread(target=kill_after_its_first_request, daemon=True)
        watcher.start()
        episodes = guess_engine(backend, local_tokenizer).run([0, 1, 2, 3], 2, SamplingParams(max_new_tokens=8))
        assert killed.is_set()
        killed.set()
        watcher.join(timeout=5)
    finally:
        stop_server(victim)
    assert len(episodes) == 8
    assert all(e.error is None and e.finish_reason != "error" for e in episodes), [e.error for e in episodes]
    assert backend.stats[victim_url]["failures"] >= 1 and total(backend, "retries") >= 1, backend.stats
    assert backend.stats[servers[1]]["failures"] == 0


# ---- (d) the wire ----------------------------------------------------------------------------------------------------
COMPLETION = {
    "choices": [
        {
            "index": 0,
            "finish_reason": "length",
            "token_ids": [5, 6],
            "logprobs": {"tokens": ["token_id:5", "token_id:6"], "token_logprobs": [-0.5, -1.5]},
        }
    ]
}


def test_every_sampling_knob_is_sent_even_when_neutral():
    """A vLLM server fills an omitted knob from the model's generation_config.json (Qwen2.5-Instruct: top_k 20,
    repetition_penalty 1.05): neutral settings must be sent as such, or the server samples from another
    distribution than the one recorded as the policy's. top_k 0 is vLLM's (and envkit serve's) "off"."""
    with ScriptedServer([], (200, COMPLETION)) as stub:
        OpenAIBackend(stub.url, "tiny").generate([[1, 2]], SamplingParams(top_k=None))
        OpenAIBackend(stub.url, "tiny").generate([[1, 2]], SamplingParams(top_k=0))
        knobs = SamplingParams(temperature=0.7, top_k=20, min_p=0.05, stop=["\n"], stop_token_ids=[2], seed=3)
        OpenAIBackend(stub.url, "tiny").generate([[1, 2, 3]], knobs)
    neutral = {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }
    assert len(stub.bodies) == 3
    for body in stub.bodies[:2]:
        assert {k: body.get(k) for k in neutral} == neutral
    body = stub.bodies[2]
    assert body["prompt"] == [1, 2, 3] and body["logprobs"] == 1 and body["return_token_ids"] is True
    assert (body["top_k"], body["min_p"], body["stop"], body["stop_token_ids"]) == (20, 0.05, ["\n"], [2])
    assert isinstance(body["seed"], int) and body["repetition_penalty"] == 1.0


# ---- (f) envkit eval with several servers ----------------------------------------------------------------------------
def eval_argv(urls, tiny_model_dir, out):
    argv = ["eval", "guess-number", "--backend", "openai", *urls, "--model", "tiny", "--tokenizer", str(tiny_model_dir)]
    return [*argv, "--tasks", "3", "--samples", "2", "--max-new-tokens", "8", "--max-turns", "2", "--out", str(out)]


def test_eval_cli_with_a_comma_separated_list_of_servers(servers, tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "episodes.jsonl"
    assert main([*eval_argv(["--base-url", ",".join(servers)], tiny_model_dir, out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 6
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 6 and all(line["error"] is None and line["turns"] >= 1 for line in lines)


def test_eval_cli_with_a_repeated_base_url_flag_uses_every_server(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "episodes.jsonl"
    with ScriptedServer([], (200, COMPLETION)) as first, ScriptedServer([], (200, COMPLETION)) as second:
        urls = ["--base-url", first.url, "--base-url", second.url]
        assert main([*eval_argv(urls, tiny_model_dir, out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 6
    assert len(out.read_text().splitlines()) == 6
    assert first.bodies and second.bodies  # both servers generated


@pytest.mark.parametrize(
    ("base_url", "message"),
    [
        ("127.0.0.1:8000", "--base-url: not an http(s) URL: '127.0.0.1:8000'"),
        (" , ", "--base-url: no base URL given"),
    ],
)
def test_eval_cli_bad_base_url_is_one_line(tiny_model_dir, capsys, base_url, message):
    argv = ["eval", "guess-number", "--backend", "openai", "--base-url", base_url, "--model", "tiny"]
    assert main([*argv, "--tokenizer", str(tiny_model_dir)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_eval_cli_names_the_server_that_does_not_answer(servers, tiny_model_dir, capsys):
    dead = closed_url()
    argv = ["eval", "guess-number", "--backend", "openai", "--base-url", f"{servers[0]},{dead}", "--model", "tiny"]
    assert main([*argv, "--tokenizer", str(tiny_model_dir)]) == 2
    err = capsys.readouterr().err
    assert f"the server at {dead} does not answer" in err and servers[0] not in err
