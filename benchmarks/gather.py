"""The micro-batcher's gather window, side by side: does waiting longer for stragglers pay on a batch backend?

A batch backend (transformers, an in-process ``vllm.LLM``) pays per call: an episode whose env call ends just after a
batch started waits a whole call for the next one. ``RolloutEngine(gather_s=...)`` lets a batch that is about to start
wait that long for episodes still in env calls (default 0.05 s). This script runs the bare ``RolloutEngine`` with
several windows on the workloads of ``benchmarks/rollout`` (its checkpoint, budgets, envs and seeds: the arms
generate the same tokens), each arm on its own fresh copy of the model, after a discarded warm-up, arms alternated,
and reports median (min-max) seconds per batch of rollouts, backend calls and the time spent generating.

    .venv/bin/python benchmarks/gather.py --episodes 128 --repeats 5 --windows 0.05,0.25
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")  # as benchmarks/rollout: before torch loads
sys.path.insert(0, str(Path(__file__).resolve().parent))

import rollout  # the package benchmarks/rollout: its checkpoint, workloads and engine arm


def bench(workload_name: str, episodes: int, repeats: int, checkpoint: Path, windows: list[float]) -> dict[str, Any]:
    """Both arms on one workload: ``repeats`` alternated rounds after a warm-up."""
    from envkit.backends import TransformersBackend

    workload = rollout.WORKLOADS[workload_name]
    cls = workload.env()
    arms = {}
    with rollout.quiet():
        for gather_s in windows:
            name = f"gather {gather_s:g} s"
            model, tokenizer = rollout.load(checkpoint)
            backend = rollout.envkit_backend(TransformersBackend(model, tokenizer), episodes)
            arm = rollout.EngineArm(backend, tokenizer, workload, episodes, cls)
            arm.engine.gather_s = gather_s
            arms[name] = arm
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in arms}
    names = list(arms)
    for repeat in range(-1, repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]  # rotated
        for name in order:
            gc.collect()
            with rollout.quiet():
                result = arms[name].run(1000 * (repeat + 2) + episodes)  # the same seeds for both arms
            if repeat >= 0:
                runs[name].append(result)
        if repeat >= 0:
            print(
                f"  {workload_name} {episodes}, repeat {repeat + 1}: "
                + ", ".join(f"{n} {runs[n][-1]['seconds']:.2f}s ({runs[n][-1]['generate_calls']} calls)" for n in runs),
                file=sys.stderr,
                flush=True,
            )
    for arm in arms.values():
        arm.engine.close()
    return {
        name: {
            "seconds": rollout.summary(values),
            "generate_seconds": rollout.summary(values, "generate_seconds"),
            "generate_calls": statistics.median(r["generate_calls"] for r in values),
            "model_tokens": statistics.mean(r["model_tokens"] for r in values),
            "errors": sum(r["errors"] for r in values),
            "runs": values,
        }
        for name, values in runs.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workloads", default=",".join(rollout.WORKLOADS))
    parser.add_argument("--windows", default="0.05,0.25", help="comma-separated gather_s values, in seconds")
    parser.add_argument("--checkpoint", default=str(rollout.ROOT / "build" / "bench-rollout"))
    parser.add_argument("--out", help="also write the JSON results here")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    checkpoint = Path(args.checkpoint)
    rollout.prepare_checkpoint(checkpoint, sft=True, log=lambda s: print(s, file=sys.stderr))
    windows = [float(w) for w in args.windows.split(",")]
    results = {
        name: bench(name, args.episodes, args.repeats, checkpoint, windows) for name in args.workloads.split(",")
    }
    print("| workload | arm | seconds | generating | backend calls | model tokens |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for workload, arms in results.items():
        for name, r in arms.items():
            s, g = r["seconds"], r["generate_seconds"]
            print(
                f"| {workload} | {name} | {s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f}) | "
                f"{g['median']:.2f} | {r['generate_calls']:g} | {r['model_tokens']:.0f} |"
            )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, default=float))


if __name__ == "__main__":
    main()
