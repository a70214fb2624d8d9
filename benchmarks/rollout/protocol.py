"""The protocol: every arm built from the same checkpoint, a discarded warm-up, then repeats with the arms in rotated
order; medians, min-max and the ratios against TRL's loop."""

from __future__ import annotations

import dataclasses
import gc
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .arms import BREAKDOWN_KEYS, EngineArm, TrainerArm, envkit_backend, quiet, share_vllm_engine
from .model import load, prepare_checkpoint
from .profiling import profile_engine
from .workloads import GROUP, WORKLOADS, Workload


def summary(runs: list[dict[str, Any]], key: str = "seconds") -> dict[str, Any]:
    values = [r[key] for r in runs]
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def bench_one(
    workload: Workload,
    episodes: int,
    repeats: int,
    checkpoint: Path,
    tmp: Path,
    *,
    backend: str,
    log: Callable,
    malformed: str = "end",
) -> dict[str, Any]:
    cls = workload.env()
    if malformed == "answer":  # envkit's own rule: the env answers a call that does not parse, the episode goes on
        cls = type(cls.__name__, (cls,), {"malformed_ends_episode": False})
    arms: dict[str, Any] = {}
    vllm = backend == "vllm"
    with quiet():
        model, tokenizer = load(checkpoint)
        arms["trl"] = TrainerArm("trl", model, tokenizer, workload, episodes, cls, tmp / "trl", vllm=vllm)
        model, tokenizer = load(checkpoint)
        arms["envkit_trl"] = TrainerArm("envkit_trl", model, tokenizer, workload, episodes, cls, tmp / "ek", vllm=vllm)
        model, tokenizer = load(checkpoint)
        if vllm:  # the shared in-process vLLM engine (see share_vllm_engine)
            from envkit.adapters.trl import trainer_backend

            generation_backend = trainer_backend(arms["envkit_trl"].trainer)
        else:
            from envkit.backends import TransformersBackend

            generation_backend = envkit_backend(TransformersBackend(model, tokenizer), episodes)
        arms["envkit"] = EngineArm(generation_backend, tokenizer, workload, episodes, cls, seeded=not vllm)
    gc.collect()
    gc.freeze()  # long-lived objects out of the collector's way: the collections between runs stay cheap
    runs: dict[str, list[dict[str, Any]]] = {"trl": [], "envkit_trl": [], "envkit": [], "limit": []}
    units = ["trl", "envkit_trl", "envkit"]
    for repeat in range(-1, repeats):  # -1: the discarded warm-up
        order = units[repeat % len(units) :] + units[: repeat % len(units)] if repeat >= 0 else units
        for name in order:
            gc.collect()
            seed = 1000 * (repeat + 2) + episodes
            cpu = time.process_time()
            with quiet():
                result = arms[name].run(seed)
            # CPU of this process (every thread) during the run: the work done, less sensitive than wall time to
            # other jobs on shared cores (one OpenMP thread; generation and env work all run here).
            result["cpu_seconds"] = time.process_time() - cpu
            result["loadavg_1min"] = os.getloadavg()[0]
            if repeat >= 0:
                runs[name].append(result)
            if name == "envkit":
                gc.collect()
                limit = arms["envkit"].replay()
                if repeat >= 0:
                    runs["limit"].append(limit)
        if repeat >= 0:
            log(
                f"  {workload.name} {episodes} eps, repeat {repeat + 1}: "
                + ", ".join(f"{n} {runs[n][-1]['seconds']:.2f}s" for n in runs)
            )
    gc.unfreeze()
    for arm in arms.values():
        if isinstance(arm, EngineArm):
            arm.engine.close()
    result: dict[str, Any] = {"episodes": episodes, "order": "rotated", "arms": {}}
    for name, values in runs.items():
        arm_result = {"seconds": summary(values), "runs": values}
        if name != "limit":
            arm_result["eps_per_s"] = episodes / arm_result["seconds"]["median"]
            arm_result["model_tok_per_s"] = statistics.median(r["model_tokens"] / r["seconds"] for r in values)
            for key in ("mean_turns", "mean_tool_calls", "model_tokens", "mean_prompt_tokens"):
                arm_result[key] = statistics.mean(r[key] for r in values)
            scores = [r["mean_score"] for r in values if r["mean_score"] is not None]
            arm_result["mean_score"] = statistics.mean(scores) if scores else None
            for key in BREAKDOWN_KEYS:  # medians of where the time went
                if key in values[0]:
                    arm_result[key] = statistics.median(r[key] for r in values)
            arm_result["max_turn_tokens"] = max(r["max_turn_tokens"] for r in values)
            arm_result["max_completion_tokens"] = max(r["max_completion_tokens"] for r in values)
        result["arms"][name] = arm_result
    trl, ek_trl, ek = (result["arms"][n]["seconds"]["median"] for n in ("trl", "envkit_trl", "envkit"))
    tok = {n: result["arms"][n]["model_tok_per_s"] for n in ("trl", "envkit_trl", "envkit")}
    result["ratio_vs_trl"] = trl / ek_trl
    per_repeat = [t["seconds"] / e["seconds"] for t, e in zip(runs["trl"], runs["envkit_trl"], strict=True)]
    result["ratio_vs_trl_per_repeat"] = summary([{"seconds": v} for v in per_repeat])
    result["ratio_vs_trl_generate"] = statistics.median(r["generate_seconds"] for r in runs["trl"]) / statistics.median(
        r["generate_seconds"] for r in runs["envkit_trl"]
    )
    # The bare engine against TRL's rollout alone (its _generate: generation and tool loop, no scoring).
    result["ratio_bare_vs_trl"] = statistics.median(r["generate_seconds"] for r in runs["trl"]) / ek
    result["ratio_vs_trl_tokens_per_s"] = tok["envkit_trl"] / tok["trl"]
    result["ratio_vs_trl_cpu"] = statistics.median(r["cpu_seconds"] for r in runs["trl"]) / statistics.median(
        r["cpu_seconds"] for r in runs["envkit_trl"]
    )
    paired = [1.0 - lim["seconds"] / run["seconds"] for lim, run in zip(runs["limit"], runs["envkit"], strict=True)]
    result["overhead_fraction"] = summary([{"seconds": v} for v in paired])
    result["limit_tokens_identical"] = all(r["tokens_identical"] for r in runs["limit"])
    result["engine_generate_share"] = statistics.median(r["generate_seconds"] / r["seconds"] for r in runs["envkit"])
    return result


def run_benchmark(
    *,
    episodes: list[int],
    repeats: int,
    workloads: list[str],
    checkpoint: Path,
    sft: bool = True,
    backend: str = "transformers",
    torch_threads: int | None = 1,
    per_turn: int | None = None,
    profile: bool = False,
    malformed: str = "end",
    log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """The whole benchmark; returns the JSON-able results. ``per_turn`` overrides every workload's per-turn budget
    (smoke tests); ``malformed`` is what a tool call that does not parse does in envkit's arms: ``"end"`` the episode,
    as TRL's loop does (:class:`EndsOnMalformedCall`), or ``"answer"`` it with an error and go on (envkit's rule)."""
    if malformed not in ("end", "answer"):
        raise ValueError(f"malformed must be 'end' or 'answer', not {malformed!r}")
    import torch

    # One OpenMP thread: on 2 cores shared with other jobs, torch's 2-thread teams stall whenever another process
    # runs (measured: a 64-prompt batch of 40 tokens took 1.1-3.9 s with 1 thread, 10-43 s with 2). The module sets
    # OMP_NUM_THREADS=1 before torch loads, so threads that torch never saw (executor threads) get one too; vLLM-CPU
    # must not be given another count (its attention kernel aborts when its team differs from the one it planned).
    previous_threads = torch.get_num_threads()
    if torch_threads:
        torch.set_num_threads(torch_threads)
    try:
        return _run(episodes, repeats, workloads, checkpoint, sft, backend, per_turn, profile, malformed, log)
    finally:
        if torch_threads:
            torch.set_num_threads(previous_threads)


def _run(
    episodes: list[int],
    repeats: int,
    workloads: list[str],
    checkpoint: Path,
    sft: bool,
    backend: str,
    per_turn: int | None,
    profile: bool,
    malformed: str,
    log: Callable[[str], None],
) -> dict[str, Any]:
    import torch
    import transformers
    import trl

    prepare_checkpoint(checkpoint, sft=sft, log=log)
    if backend == "vllm":
        share_vllm_engine(max(episodes))
    results: dict[str, Any] = {
        "backend": backend,
        "episodes": episodes,
        "group": GROUP,
        "repeats": repeats,
        "malformed": malformed,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        "checkpoint": str(checkpoint),
        "parameters": sum(p.numel() for p in load(checkpoint)[0].parameters()),
        "workloads": {},
    }
    for name in workloads:
        workload = WORKLOADS[name]
        if per_turn is not None:
            workload = dataclasses.replace(workload, per_turn=per_turn)
        results["workloads"][name] = {"budgets": dataclasses.asdict(workload) | {"env": None}}
        for n in episodes:
            log(f"{name}: {n} episodes")
            with tempfile.TemporaryDirectory() as tmp:
                results["workloads"][name][str(n)] = bench_one(
                    workload, n, repeats, checkpoint, Path(tmp), backend=backend, log=log, malformed=malformed
                )
    top = str(max(episodes))
    for name, suffix in (("instant", ""), ("latency50ms", "_latency50ms"), ("hetero", "_hetero")):
        if name in results["workloads"]:
            data = results["workloads"][name][top]
            results[f"ratio_vs_trl{suffix}"] = data["ratio_vs_trl"]
            results[f"ratio_bare_vs_trl{suffix}"] = data["ratio_bare_vs_trl"]
            results[f"overhead_fraction{suffix}"] = data["overhead_fraction"]["median"]
    if profile:
        results["profile"] = {}
        for name in workloads:
            log(f"profiling one bare engine run: {name}, {top} episodes")
            results["profile"][name] = profile_engine(WORKLOADS[name], int(top), checkpoint)
    first = results["workloads"][workloads[0]][top]
    results.setdefault("overhead_fraction", first["overhead_fraction"]["median"])
    results["headline_episodes"] = int(top)
    return results
