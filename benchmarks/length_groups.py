"""Does length grouping pay? The bare rollout engine on ``benchmarks/rollout``'s workload and checkpoint, its
``TransformersBackend`` run with each ``pad_tolerance`` in turn on identical work.

Every repeat plays the same task seeds with the same sampling seed under every tolerance (alternated order, one
discarded warm-up), so each arm generates the same tokens (checked: each request's tokens, by prompt and seed, must
agree across arms) and only the batches' shapes differ: one left-padded call per turn (``inf``), or groups of similar
prompt length (``TransformersBackend.pad_tolerance``, default 0.1 on CPU; see
``envkit.backends.transformers.length_groups``).

Usage::

    .venv/bin/python benchmarks/length_groups.py --episodes 32,128 --repeats 15
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import rollout  # (the package benchmarks/rollout: its workload, checkpoint and engine arm)


def measure(
    episodes: int,
    repeats: int,
    tolerances: list[float],
    checkpoint: Path,
    *,
    sft: bool = True,
    workload: str = "instant",
) -> dict[str, Any]:
    """Wall seconds of the bare engine under each tolerance, median (min-max) over ``repeats`` alternated repeats."""
    import torch

    from envkit.backends import TransformersBackend

    torch.set_num_threads(1)  # as benchmarks/rollout: one OpenMP thread, the engine's work on the other core
    rollout.prepare_checkpoint(checkpoint, sft=sft, log=print)
    spec = rollout.WORKLOADS[workload]
    with rollout.quiet():
        model, tokenizer = rollout.load(checkpoint)
        backend = rollout.envkit_backend(TransformersBackend(model, tokenizer), episodes)
        arm = rollout.EngineArm(backend, tokenizer, spec, episodes, spec.env())
    seconds: dict[float, list[float]] = {t: [] for t in tolerances}
    try:
        for repeat in range(-1, repeats):  # -1: the warm-up
            generated: list[dict[tuple[tuple[int, ...], int | None], tuple[int, ...]]] = []
            for tolerance in tolerances if repeat % 2 else tolerances[::-1]:
                backend.pad_tolerance = tolerance
                gc.collect()
                with rollout.quiet():
                    result = arm.run(1000 + max(repeat, 0))
                generated.append(_generated(arm.recorder.calls))
                if repeat >= 0:
                    seconds[tolerance].append(result["seconds"])
            if not generated[0]:
                raise RuntimeError(f"repeat {repeat}: no generation was recorded, nothing to compare")
            if any(tokens != generated[0] for tokens in generated):
                raise RuntimeError(f"repeat {repeat}: the tolerances generated different tokens for the same requests")
    finally:
        arm.engine.close()
    return {
        str(t): {"median": statistics.median(v), "min": min(v), "max": max(v), "all": v} for t, v in seconds.items()
    }


def _generated(calls: list[Any]) -> dict[tuple[tuple[int, ...], int | None], tuple[int, ...]]:
    """What one run generated: each request's tokens by its (prompt, seed)."""
    return {
        (tuple(prompt), seed): tuple(generation.token_ids)
        for call in calls
        for prompt, seed, generation in zip(
            call.prompts, call.seeds or [None] * len(call.prompts), call.generations or [], strict=True
        )
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", default="32,128", help="comma-separated episode counts (default 32,128)")
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats per tolerance (default 15)")
    parser.add_argument("--tolerances", default="0.1,inf", help="comma-separated pad tolerances (default 0.1,inf)")
    parser.add_argument("--checkpoint", default=str(rollout.ROOT / "build" / "bench-rollout"), help="cached model")
    parser.add_argument("--no-sft", action="store_true", help="a random model (smoke tests: it never calls tools)")
    args = parser.parse_args(argv)
    try:
        tolerances = [math.inf if t.strip() == "inf" else float(t) for t in args.tolerances.split(",")]
        counts = [int(n) for n in args.episodes.split(",")]
    except ValueError as error:
        parser.error(f"--tolerances takes numbers or 'inf', --episodes whole numbers: {error}")
    checkpoint = Path(args.checkpoint)
    if args.no_sft and args.checkpoint == parser.get_default("checkpoint"):
        checkpoint = checkpoint.with_name(checkpoint.name + "-random")
    results: dict[str, Any] = {}
    for n in counts:
        results[str(n)] = measure(n, args.repeats, tolerances, checkpoint, sft=not args.no_sft)
        for tolerance, value in results[str(n)].items():
            print(
                f"{n} episodes, pad_tolerance {tolerance}: {value['median']:.3f} s "
                f"({value['min']:.3f}-{value['max']:.3f}), {args.repeats} repeats"
            )
    return results


if __name__ == "__main__":
    main()
