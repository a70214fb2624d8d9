"""What a ``textworld-express:`` or ``scienceworld:`` env costs: construction, reset and step latency, and memory.

Each env is built, reset on a few seeds and played along its gold path (the oracle's commands; the oracle call itself
is not timed), then closed. Per family it reports construction time (the JVM start and the game's load), reset and
step p50 / p99 (``env.step``: the command, the simulator's answer, the score), and episode memory: the resident
memory of the env's JVM after its episodes (``VmRSS``, and ``VmHWM``, its peak) and what the Python process grew by.

    .venv/bin/python benchmarks/textworlds.py                       # both families, a few games/tasks each
    .venv/bin/python benchmarks/textworlds.py --java-heap 512m      # the same with the JVM's heap capped
    .venv/bin/python benchmarks/textworlds.py --json --out tw.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from typing import Any

import numpy as np

import envkit

TWX_GAMES = ["cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder"]
SW_TASKS = ["find-animal", "boil", "lifespan-longest-lived", "use-thermometer", "grow-plant"]


def proc_kib(pid: int, field: str) -> int:
    """A ``/proc/PID/status`` memory field (``VmRSS``, ``VmHWM``) in KiB."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def measure(spec: str, seeds: list[int], java_heap: str | None) -> dict[str, Any]:
    """Build ``spec``, play its gold path on ``seeds``, and time and weigh it."""
    rss_before = proc_kib(os.getpid(), "VmRSS")
    start = time.perf_counter()
    env = envkit.make(spec, java_heap=java_heap)
    built = time.perf_counter() - start
    resets, steps, scores, turns = [], [], [], []
    try:
        for seed in seeds:
            start = time.perf_counter()
            env.reset(seed=seed)
            resets.append(time.perf_counter() - start)
            while not env.done:
                action = env.oracle()
                if action is None:
                    break
                start = time.perf_counter()
                env.step(action)
                steps.append(time.perf_counter() - start)
            scores.append(env.score())
            turns.append(env.turns)
        jvm_rss, jvm_peak = (proc_kib(env.java.process.pid, f) for f in ("VmRSS", "VmHWM"))
    finally:
        env.close()
    return {
        "spec": spec,
        "construct_s": built,
        "resets": resets,
        "steps": steps,
        "scores": scores,
        "turns": turns,
        "jvm_rss_mib": jvm_rss / 1024,
        "jvm_peak_mib": jvm_peak / 1024,
        "python_growth_mib": (proc_kib(os.getpid(), "VmRSS") - rss_before) / 1024,
    }


def summary(family: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Percentiles over every step and reset of a family, and its memory range."""
    steps = np.array([s for row in rows for s in row["steps"]]) * 1000
    resets = np.array([s for row in rows for s in row["resets"]]) * 1000
    return {
        "family": family,
        "envs": len(rows),
        "episodes": sum(len(row["scores"]) for row in rows),
        "mean_oracle_score": statistics.mean(s for row in rows for s in row["scores"]),
        "steps": int(steps.size),
        "step_p50_ms": float(np.percentile(steps, 50)),
        "step_p99_ms": float(np.percentile(steps, 99)),
        "reset_p50_ms": float(np.percentile(resets, 50)),
        "reset_p99_ms": float(np.percentile(resets, 99)),
        "construct_p50_s": float(np.median([row["construct_s"] for row in rows])),
        "jvm_rss_mib": [min(r["jvm_rss_mib"] for r in rows), max(r["jvm_rss_mib"] for r in rows)],
        "jvm_peak_mib": max(r["jvm_peak_mib"] for r in rows),
        "python_growth_mib": max(r["python_growth_mib"] for r in rows),
    }


def main() -> int:
    """Run the benchmark and print (or save) its figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3, help="task seeds per game / task (default 3)")
    parser.add_argument("--games", default=",".join(TWX_GAMES), help="TextWorldExpress games ('' for none)")
    parser.add_argument("--tasks", default=",".join(SW_TASKS), help="ScienceWorld tasks ('' for none)")
    parser.add_argument("--java-heap", default=None, help="the JVM's maximum heap, e.g. 512m (default: Java's)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--out", default=None, help="also write the figures (JSON) here")
    args = parser.parse_args()
    seeds = list(range(args.seeds))
    families = {
        "textworld-express": [f"textworld-express:{g}" for g in filter(None, args.games.split(","))],
        "scienceworld": [f"scienceworld:{t}" for t in filter(None, args.tasks.split(","))],
    }
    result: dict[str, Any] = {"java_heap": args.java_heap, "families": [], "envs": []}
    for family, specs in families.items():
        rows = []
        for spec in specs:
            row = measure(spec, seeds, args.java_heap)
            rows.append(row)
            steps = np.array(row["steps"]) * 1000
            print(
                f"{spec}: built {row['construct_s']:.2f} s, step p50 {np.percentile(steps, 50):.2f} ms / p99 "
                f"{np.percentile(steps, 99):.2f} ms over {steps.size} steps, oracle {row['scores']}, JVM "
                f"{row['jvm_rss_mib']:.0f} MiB (peak {row['jvm_peak_mib']:.0f})",
                file=sys.stderr,
                flush=True,
            )
        if rows:
            result["families"].append(summary(family, rows))
        result["envs"].extend({k: v for k, v in row.items() if k not in ("steps", "resets")} for row in rows)
    result["max_rss_python_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.out:
        with open(args.out, "w") as out:
            json.dump(result, out, indent=2)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for fam in result["families"]:
            print(
                f"{fam['family']}: {fam['envs']} envs, {fam['episodes']} episodes, oracle mean "
                f"{fam['mean_oracle_score']:.3f}; step p50 {fam['step_p50_ms']:.2f} ms / "
                f"p99 {fam['step_p99_ms']:.2f} ms "
                f"({fam['steps']} steps); reset p50 {fam['reset_p50_ms']:.0f} ms / p99 {fam['reset_p99_ms']:.0f} ms; "
                f"construction p50 {fam['construct_p50_s']:.1f} s; JVM RSS {fam['jvm_rss_mib'][0]:.0f}–"
                f"{fam['jvm_rss_mib'][1]:.0f} MiB (peak {fam['jvm_peak_mib']:.0f}); Python grew by at most "
                f"{fam['python_growth_mib']:.0f} MiB"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
