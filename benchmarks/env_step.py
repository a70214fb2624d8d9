"""Env latency: reset and step p50 / p99 for every built-in env, driven by its oracle.

Usage: python benchmarks/env_step.py [--episodes 300] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import envkit
from envkit.envs import BUILTINS


def measure(name: str, episodes: int) -> dict[str, float]:
    """Time every reset and step of ``episodes`` oracle episodes of env ``name``."""
    env = envkit.make(name)
    resets, steps = [], []
    for seed in range(episodes):
        start = time.perf_counter()
        env.reset(seed=seed)
        resets.append(time.perf_counter() - start)
        while not env.done:
            action = env.oracle()
            start = time.perf_counter()
            env.step(action)
            steps.append(time.perf_counter() - start)
    ms = 1000.0
    return {
        "env": name,
        "episodes": episodes,
        "steps": len(steps),
        "reset_p50_ms": float(np.percentile(resets, 50) * ms),
        "reset_p99_ms": float(np.percentile(resets, 99) * ms),
        "step_p50_ms": float(np.percentile(steps, 50) * ms),
        "step_p99_ms": float(np.percentile(steps, 99) * ms),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    results = [measure(name, args.episodes) for name in BUILTINS]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'env':15} {'steps':>6} {'reset p50':>10} {'reset p99':>10} {'step p50':>9} {'step p99':>9}  (ms)")
    for r in results:
        print(
            f"{r['env']:15} {r['steps']:>6} {r['reset_p50_ms']:>10.3f} {r['reset_p99_ms']:>10.3f} "
            f"{r['step_p50_ms']:>9.3f} {r['step_p99_ms']:>9.3f}"
        )


if __name__ == "__main__":
    main()
