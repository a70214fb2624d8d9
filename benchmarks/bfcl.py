"""bfcl-multi-turn: what the env costs per step and per episode, category by category.

* **Latency**: every task of each category played by ``env.oracle()``; each ``reset`` and ``step`` timed (the env's
  own work: building and loading BFCL's API instances, running the calls, the ground truth's replay and BFCL's
  checks at each turn's end). p50 / p99 / max in milliseconds.
* **First env**: the time and traced memory of the first env of a category in a process (it reads the category's
  tasks; its first episode imports BFCL's classes); later envs share them.
* **Memory**: the peak of Python allocations (``tracemalloc``) during one oracle episode, reset included, in a second
  pass over every ``--memory-every``-th task (tracing slows the code down, so it is not timed). p50 / max in MiB.
* **Oracle**: the mean score (1.0 expected on every task).

* **Through the engine** (``--engine-every N``): every N-th task's oracle played by ``RolloutEngine`` with
  ``OracleBackend`` through Qwen2.5's chat template (``../shared/tokenizers/qwen2.5-instruct``), token-exactly: the
  episodes that score 1.0, the wall time, and the longest episode in tokens.

Usage: ``python benchmarks/bfcl.py [--categories base long_context] [--memory-every 5] [--engine-every 10] [--json]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from typing import Any

import envkit
from envkit.envs.bfcl import data


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def play_oracle(env: Any, task_id: str, resets: list[float] | None = None, steps: list[float] | None = None) -> float:
    """One oracle episode of ``task_id``; times appended to ``resets`` / ``steps`` when given. Returns its score."""
    start = time.perf_counter()
    env.reset(options={"task_id": task_id})
    if resets is not None:
        resets.append(time.perf_counter() - start)
    while not env.done:
        action = env.oracle()
        start = time.perf_counter()
        env.step(action)
        if steps is not None:
            steps.append(time.perf_counter() - start)
    return env.score()


def category(name: str, memory_every: int) -> dict[str, Any]:
    """Latency, memory and the oracle's mean score over every task of one category."""
    tracemalloc.start()
    start = time.perf_counter()
    env = envkit.make("bfcl-multi-turn", split=name)  # the first env of a split in a process reads its tasks
    tasks = [task.id for task in env.tasks]
    play_oracle(env, tasks[0])  # and the first episode imports BFCL's classes
    load_s = time.perf_counter() - start
    load_mib = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    resets: list[float] = []
    steps: list[float] = []
    scores = [play_oracle(env, task_id, resets, steps) for task_id in tasks]
    peaks = []
    for task_id in tasks[::memory_every]:
        tracemalloc.start()
        play_oracle(env, task_id)
        peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
        tracemalloc.stop()
    ms = [1000 * s for s in steps]
    reset_ms = [1000 * s for s in resets]
    return {
        "tasks": len(tasks),
        "first_env": {"seconds": load_s, "peak_mib": load_mib},
        "oracle_mean_score": statistics.fmean(scores),
        "steps": len(steps),
        "step_ms": {"p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99), "max": max(ms)},
        "reset_ms": {"p50": percentile(reset_ms, 0.5), "p99": percentile(reset_ms, 0.99), "max": max(reset_ms)},
        "episode_peak_mib": {"p50": percentile(peaks, 0.5), "max": max(peaks), "episodes": len(peaks)},
    }


def through_engine(name: str, every: int) -> dict[str, Any]:
    """Every ``every``-th task of a category played by the oracle through the rollout engine and Qwen2.5's template.

    One :class:`~envkit.backends.oracle.OracleBackend` per category: tasks of two categories can open with the same
    prompt (``long_context`` differs from ``base`` only in the APIs' state), which one backend cannot tell apart.
    """
    from envkit.backends.oracle import OracleBackend
    from envkit.rollout import RolloutEngine, SamplingParams
    from envkit.testing import load_shared_tokenizer
    from envkit.workers import EnvFactory

    tokenizer = load_shared_tokenizer("qwen2.5-instruct")
    if tokenizer is None:
        raise SystemExit("../shared/tokenizers/qwen2.5-instruct is not present: --engine-every needs it")
    factory = EnvFactory("bfcl-multi-turn", {"split": name})
    seeds = list(range(0, len(data.load_category(name)), every))
    start = time.perf_counter()
    engine = RolloutEngine(factory, OracleBackend(factory, tokenizer, seeds), tokenizer, concurrency=8)
    try:
        episodes = engine.run(seeds, 1, SamplingParams(max_new_tokens=4096))
    finally:
        engine.close()
    return {
        "episodes": len(episodes),
        "scored_1": sum(e.score == 1.0 and e.error is None for e in episodes),
        "seconds": time.perf_counter() - start,
        "most_tokens": max(len(e.prompt_ids) + len(e.completion_ids) for e in episodes),
    }


def main() -> None:
    """Run the benchmark and print a table (or JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--categories", nargs="+", default=list(data.CATEGORIES), choices=data.CATEGORIES)
    parser.add_argument("--memory-every", type=int, default=5, help="trace every N-th task's episode (default 5)")
    parser.add_argument("--engine-every", type=int, default=0, help="also play every N-th task through the engine")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    results = {name: category(name, args.memory_every) for name in args.categories}
    if args.engine_every:
        for name in args.categories:
            results[name]["engine"] = through_engine(name, args.engine_every)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(
        f"{'category':<14}{'tasks':>6}{'oracle':>8}{'step p50':>10}{'p99':>8}{'max':>8}{'reset p50':>11}{'p99':>8}"
        f"{'mem p50':>9}{'max':>7}"
    )
    for name, r in results.items():
        s, z, m = r["step_ms"], r["reset_ms"], r["episode_peak_mib"]
        print(
            f"{name:<14}{r['tasks']:>6}{r['oracle_mean_score']:>8.3f}{s['p50']:>8.2f}ms{s['p99']:>6.1f}ms"
            f"{s['max']:>6.0f}ms{z['p50']:>9.2f}ms{z['p99']:>6.1f}ms{m['p50']:>6.2f}MiB{m['max']:>5.1f}M"
        )
    for name, r in results.items():
        if "engine" in r:
            e = r["engine"]
            print(
                f"{name}: through the engine (Qwen2.5 template), {e['scored_1']} of {e['episodes']} oracle episodes "
                f"score 1.0 in {e['seconds']:.1f} s; the longest is {e['most_tokens']} tokens"
            )


if __name__ == "__main__":
    main()
