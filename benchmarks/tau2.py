"""tau2-airline and tau2-retail: the oracle's score per domain, env latency, episode memory, and SmolLM2-135M with
the scripted user on a few airline test tasks.

* **Oracle**: every task of a domain (``split="base"``) played by ``env.oracle()`` with the scripted user; its score,
  and how many tasks need an LLM judge (scored on their DB part, ``nl_assertion_unscored``).
* **Latency**: each ``reset`` and ``step`` of those oracle episodes timed (the env's own work: tools, user, score).
* **Memory**: the peak of Python allocations (``tracemalloc``) during one oracle episode, reset included, in a second
  pass (tracing slows the code down, so it is not timed).
* **SmolLM2-135M-Instruct** (``build/smollm2``, made by ``envkit model smollm2``) through ``RolloutEngine`` +
  ``TransformersBackend`` on the first ``--smollm2`` airline test tasks with the scripted user: pass^1 and how each
  episode ended.

Usage: ``python benchmarks/tau2.py [--smollm2 5] [--max-turns 6] [--max-new-tokens 192] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

import envkit
from envkit.envs.tau2 import scoring
from envkit.envs.tau2.data import load_domain

ROOT = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def play_oracle(env: Any, task_id: str, resets: list[float] | None = None, steps: list[float] | None = None) -> Any:
    """One oracle episode of ``task_id``; times appended to ``resets`` / ``steps`` when given."""
    start = time.perf_counter()
    env.reset(options={"task_id": task_id})
    if resets is not None:
        resets.append(time.perf_counter() - start)
    done = False
    while not done:
        action = env.oracle()
        start = time.perf_counter()
        _, _, terminated, truncated, _ = env.step(action)
        if steps is not None:
            steps.append(time.perf_counter() - start)
        done = terminated or truncated
    return env


def oracle_domain(domain: str) -> dict[str, Any]:
    """The oracle's scores, the env's latency and episode memory over every task of ``domain``."""
    # The first env of a domain in a process loads its data, validates its DB and replays every task's gold path
    # (to find the read-only tasks); later envs and resets reuse all of it.
    start = time.perf_counter()
    env = envkit.make(f"tau2-{domain}", split="base")
    first_make = time.perf_counter() - start
    tasks = list(load_domain(domain).tasks)
    gold = []
    scoring.gold_hash.cache_clear()
    for task in tasks:
        start = time.perf_counter()
        scoring.gold_hash(domain, task.id)
        gold.append(time.perf_counter() - start)
    play_oracle(env, tasks[0].id)
    resets: list[float] = []
    steps: list[float] = []
    scores: dict[str, float] = {}
    judged = []
    for task in tasks:
        play_oracle(env, task.id, resets, steps)
        scores[task.id] = env.score()
        if env.score_components().get("nl_assertion_unscored"):
            judged.append(task.id)
    peaks = []
    tracemalloc.start()
    for task in tasks:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        play_oracle(env, task.id)
        peaks.append(tracemalloc.get_traced_memory()[1] - before)
    tracemalloc.stop()
    not_one = sorted((t for t, s in scores.items() if s != 1.0), key=int)
    return {
        "domain": domain,
        "tasks": len(tasks),
        "oracle_mean": statistics.fmean(scores.values()),
        "oracle_not_1": not_one,
        "needs_llm_judge": len(judged),
        "read_only": len(env.read_only_ids),
        "resets": len(resets),
        "steps": len(steps),
        "reset_p50_ms": 1000 * percentile(resets, 0.5),
        "reset_p99_ms": 1000 * percentile(resets, 0.99),
        "step_p50_ms": 1000 * percentile(steps, 0.5),
        "step_p99_ms": 1000 * percentile(steps, 0.99),
        "first_make_ms": 1000 * first_make,
        "gold_replay_p50_ms": 1000 * percentile(gold, 0.5),
        "gold_replay_max_ms": 1000 * max(gold),
        "episode_peak_kib_p50": percentile(peaks, 0.5) / 1024,
        "episode_peak_kib_max": max(peaks) / 1024,
    }


def smollm2_airline(count: int, max_turns: int, max_new_tokens: int, read_only: bool) -> dict[str, Any]:
    """SmolLM2-135M-Instruct on the first ``count`` airline test tasks with the scripted user (``read_only``: the
    test split as tau2 scores it; otherwise without the tasks that doing nothing wins)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from envkit.backends import SamplingParams, TransformersBackend
    from envkit.models.smollm2 import smollm2_dir
    from envkit.rollout import RolloutEngine

    path = smollm2_dir(str(ROOT / "build" / "smollm2"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    config = {"split": "test", "include_read_only": read_only}
    engine = RolloutEngine(
        lambda: envkit.make("tau2-airline", **config),
        TransformersBackend(model, tokenizer),
        tokenizer,
        max_turns=max_turns,
        step_timeout_s=600,
    )
    sampling = SamplingParams(temperature=0.7, top_k=20, max_new_tokens=max_new_tokens, seed=0)
    start = time.perf_counter()
    episodes = engine.run(list(range(count)), group_size=1, sampling=sampling)
    wall = time.perf_counter() - start
    engine.close()
    test_env = envkit.make("tau2-airline", **config)
    test_ids = [t.id for t in test_env.tasks]
    rows = []
    for seed, episode in enumerate(episodes):
        calls = [
            c.get("function", c).get("name")
            for m in episode.messages
            if m.get("role") == "assistant"
            for c in m.get("tool_calls") or []
        ]
        malformed = sum(len(m.get("malformed_tool_calls") or []) for m in episode.messages)
        rows.append(
            {
                "task_id": test_ids[seed % len(test_ids)],
                "read_only": test_ids[seed % len(test_ids)] in test_env.read_only_ids,
                "score": episode.score,
                "components": episode.score_components,
                "turns": episode.turns,
                "turn_finish_reasons": episode.turn_finish_reasons,
                "finish_reason": episode.finish_reason,
                "prompt_tokens": len(episode.prompt_ids),
                "tool_calls": calls,
                "tool_errors": episode.tool_errors,
                "malformed_tool_calls": malformed,
                "last_assistant_text": next(
                    (str(m.get("content"))[:160] for m in reversed(episode.messages) if m.get("role") == "assistant"),
                    "",
                ),
                "error": episode.error,
            }
        )
    return {
        "config": config,
        "episodes": len(episodes),
        "pass^1": statistics.fmean(r["score"] == 1.0 for r in rows),
        "wall_s": wall,
        "max_turns": max_turns,
        "max_new_tokens": max_new_tokens,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domains", default="airline,retail")
    parser.add_argument("--smollm2", type=int, default=5, help="airline test tasks for SmolLM2 (0: skip)")
    parser.add_argument(
        "--smollm2-read-only",
        action="store_true",
        help="keep the read-only test tasks (doing nothing scores 1.0 on them) in SmolLM2's run",
    )
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=192)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result: dict[str, Any] = {"loadavg_before": os.getloadavg()}
    result["oracle"] = [oracle_domain(d) for d in args.domains.split(",") if d]
    if args.smollm2:
        result["smollm2"] = smollm2_airline(args.smollm2, args.max_turns, args.max_new_tokens, args.smollm2_read_only)
    result["loadavg_after"] = os.getloadavg()
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"load average before {result['loadavg_before']}, after {result['loadavg_after']}")
    print("| domain | tasks | oracle mean | tasks below 1.0 | need an LLM judge | read-only | reset p50 / p99 | "
          "step p50 / p99 | gold replay p50 / max | first make | episode peak (p50 / max) |")  # fmt: skip
    print("| --- |" + " ---: |" * 10)
    for r in result["oracle"]:
        print(
            f"| {r['domain']} | {r['tasks']} | {r['oracle_mean']:.3f} | {len(r['oracle_not_1'])} | "
            f"{r['needs_llm_judge']} | {r['read_only']} | {r['reset_p50_ms']:.2f} / {r['reset_p99_ms']:.2f} ms | "
            f"{r['step_p50_ms']:.3f} / {r['step_p99_ms']:.3f} ms ({r['steps']} steps) | "
            f"{r['gold_replay_p50_ms']:.2f} / {r['gold_replay_max_ms']:.2f} ms | {r['first_make_ms']:.0f} ms | "
            f"{r['episode_peak_kib_p50']:.0f} / {r['episode_peak_kib_max']:.0f} KiB |"
        )
    if "smollm2" in result:
        s = result["smollm2"]
        print(f"SmolLM2-135M, airline test tasks: pass^1 {s['pass^1']:.2f} over {s['episodes']} ({s['wall_s']:.0f} s)")
        for r in s["rows"]:
            print(json.dumps(r))


if __name__ == "__main__":
    main()
