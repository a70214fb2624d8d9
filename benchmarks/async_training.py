"""Asynchronous vs synchronous training, like for like: speed per sample, overlap, and learning parity.

On the built-in ``arithmetic`` env (``{"kinds": ["containers"]}``: a word problem, ``calculator``, ``submit_answer``)
from one shared SFT warm start (``benchmarks/learning.py``'s: a tiny model and tokenizer built locally, oracle
demonstrations of training tasks only, the held-out tasks checked disjoint from the training tasks by content), three
arms train with the same LoRA, sampling, samples per step and total samples:

* ``sync``: ``envkit train`` as it is (generation in the training process, then training, in lockstep);
* ``sync-1t``: the same with one torch thread (``OMP_NUM_THREADS=1``): on cores that other jobs share, a second
  OpenMP thread can cost more than it gives, and the asynchronous arms train with one thread;
* ``async-s1`` / ``async-s2``: ``envkit train --async --max-staleness 1`` / ``2`` against the same vLLM server(s),
  started once here (``--servers``) and given by URL. Without CUDA the cores are split as ``--vllm-servers`` splits
  them (``envkit.adapters.vllm.cpus``): the servers bound to theirs, the asynchronous arms on the rest
  (``--no-cpu-split``: everything on every core).

``--runs`` repeats (each with its own seed, the arms in a rotated order so no arm always runs first on a machine
whose load drifts). Per run: the training loop's wall time per 1,000 trained samples, the fraction of that time
generation and training ran at once (async: measured from request and forward/backward intervals; sync: 0 by
construction), and the held-out score (``envkit train``'s own eval: the same held-out seeds for every arm, sampled at
the training temperature) after training. Prints a table and writes ``async_training.json`` to ``--out``.

Usage: ``python benchmarks/async_training.py [--runs 3] [--steps 40] [--batch-size 32] [--servers 1] [--quick]``;
``--vllm-python`` is the interpreter with vLLM (default ``.venv-vllm/bin/python`` beside this checkout, else this
one). ``--quick`` shrinks everything to check the pipeline (figures meaningless).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import learning  # noqa: E402  (the warm start and the held-out check are learning.py's)

from envkit.util.options import as_flags  # noqa: E402

ARMS: dict[str, list[str]] = {
    "sync": [],
    "sync-1t": [],
    "async-s1": ["--async", "--max-staleness", "1"],
    "async-s2": ["--async", "--max-staleness", "2"],
}


ARM_ENV: dict[str, dict[str, str]] = {"sync-1t": {"OMP_NUM_THREADS": "1"}}
"""Environment per arm: ``sync-1t`` is the synchronous path with one torch thread (on cores other jobs share, a
second OpenMP thread can cost more than it gives: the asynchronous arms train with one thread beside the server)."""


def parser() -> argparse.ArgumentParser:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="repeats (seeds 0 … N-1), arms alternated")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of " + ", ".join(ARMS))
    p.add_argument("--steps", type=int, default=40, help="training steps (the same for every arm)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per step")
    p.add_argument("--num-generations", type=int, default=8, help="GRPO group size")
    p.add_argument("--learning-rate", type=float, default=2e-3, help="LoRA learning rate")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-completion-tokens", type=int, default=192)
    p.add_argument("--train-tasks", type=int, default=4000)
    p.add_argument("--eval-tasks", type=int, default=128, help="held-out tasks evaluated after training")
    p.add_argument("--sft-steps", type=int, default=1500, help="warm start SFT steps (learning.py's default)")
    p.add_argument("--sft-demos", type=int, default=4000)
    p.add_argument("--servers", type=int, default=1, help="local vLLM servers the async arms generate on")
    p.add_argument("--vllm-python", default=None)
    p.add_argument("--warm-start", type=Path, default=None, help="reuse a warm-start model folder (skips SFT)")
    p.add_argument("--out", type=Path, default=None, help="folder for async_training.json (default benchmarks/)")
    p.add_argument(
        "--no-cpu-split",
        action="store_true",
        help="no CUDA: leave the servers on vLLM's own core binding and the async arms on every core (the contended "
        "layout, for comparison)",
    )
    p.add_argument(
        "--vllm-lora-kernels",
        action="store_true",
        help="no CUDA: the servers keep vLLM-CPU's own LoRA ops instead of envkit's grouped kernels (for comparison)",
    )
    p.add_argument("--quick", action="store_true", help="a few steps on a few tasks: the pipeline end to end")
    return p


QUICK = {
    "runs": 1,
    "steps": 3,
    "batch_size": 8,
    "num_generations": 4,
    "max_new_tokens": 16,
    "max_turns": 3,
    "max_completion_tokens": 96,
    "train_tasks": 64,
    "eval_tasks": 8,
    "sft_steps": 40,
    "sft_demos": 64,
}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def vllm_python(args: argparse.Namespace) -> str:
    """The interpreter the vLLM servers run with."""
    if args.vllm_python:
        return args.vllm_python
    candidate = ROOT / ".venv-vllm" / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable


def make_warm_start(args: argparse.Namespace, workdir: Path) -> Path:
    """learning.py's warm start (tiny model, tokenizer from training tasks, SFT on oracle demonstrations of training
    tasks, held-out tasks checked disjoint by content); returns the model folder."""
    largs = learning.parser().parse_args(
        [
            "--train-tasks",
            str(args.train_tasks),
            "--eval-tasks",
            str(args.eval_tasks),
            "--eval-repeats",
            "1",
            "--sft-steps",
            str(args.sft_steps),
            "--sft-demos",
            str(args.sft_demos),
            "--max-new-tokens",
            str(args.max_new_tokens),
            "--max-turns",
            str(args.max_turns),
            "--max-completion-tokens",
            str(args.max_completion_tokens),
            "--no-progress",
        ]
    )
    warm = learning.warm_start(0, workdir, largs)
    print(f"warm start: held-out {warm['before']['mean_score']:.3f} ({warm['sft_seconds']:.0f}s of SFT)", flush=True)
    return Path(warm["dir"])


def train_command(arm: str, model: Path, out: Path, seed: int, args: argparse.Namespace, urls: list[str]) -> list[str]:
    """``envkit train``'s command line for one arm and seed."""
    command = [
        sys.executable,
        "-m",
        "envkit.cli",
        "train",
        learning.ENV,
        *as_flags(
            env_config=learning.ENV_CONFIG,
            model=model,
            output_dir=out,
            lora_r=args.lora_r,
            lora_alpha=2 * args.lora_r,
            learning_rate=args.learning_rate,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            num_generations=args.num_generations,
            max_completion_length=args.max_new_tokens,
            max_turns=args.max_turns,
            max_completion_tokens=args.max_completion_tokens,
            rl_kl_coef=0.0,
            rl_top_k=0,
            gradient_checkpointing=False,
            train_tasks=args.train_tasks,
            eval_tasks=args.eval_tasks,
            seed=seed,
            logging_steps=1,
            disable_tqdm=True,
        ),
        *ARMS[arm],
    ]
    if arm.startswith("async"):
        command += ["--vllm-server-url", ",".join(urls)]
    return command


def run_arm(
    arm: str, model: Path, workdir: Path, seed: int, args: argparse.Namespace, urls: list[str], split: Any = None
) -> dict:
    """Train one arm once; its figures. With a CPU ``split`` (servers on this machine, no CUDA), the asynchronous
    arms train on the cores the servers are not bound to, as ``envkit train --async --vllm-servers N`` places
    itself; the synchronous arm has the whole machine."""
    out = workdir / f"{arm}-{seed}"
    command = train_command(arm, model, out, seed, args, urls)
    env, placed = {**os.environ, **ARM_ENV.get(arm, {})}, None
    if split is not None and arm.startswith("async"):
        env["OMP_NUM_THREADS"] = str(len(split.training))

        def placed() -> None:
            os.sched_setaffinity(0, split.training)

    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, cwd=str(ROOT), env=env, preexec_fn=placed)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{arm} seed {seed} failed: {result.stderr[-2000:]}")
    summary = json.loads((out / "eval_summary.json").read_text())
    history = json.loads((out / "log_history.json").read_text())
    samples = args.steps * args.batch_size
    if summary.get("eval_tasks_seen_in_training"):
        raise RuntimeError(f"{summary['eval_tasks_seen_in_training']} eval tasks open like training tasks")
    figures = {
        "arm": arm,
        "seed": seed,
        "process_s": wall,
        "train_s": summary["train_s"],
        "samples": samples,
        "s_per_1000": summary["train_s"] / samples * 1000,
        "overlap": summary.get("overlap", {}).get("fraction", 0.0),
        "before": summary["before"]["mean_score"],
        "after": summary["after"]["mean_score"],
        "train_score_last": next(
            (e.get("envkit/mean_score") for e in reversed(history) if "envkit/mean_score" in e), None
        ),
    }
    if arm.startswith("async"):
        figures.update(
            staleness_max=summary.get("staleness_max"),
            staleness_mean=summary.get("staleness_mean"),
            rollout=summary.get("rollout"),
            overlap_detail=summary.get("overlap"),
        )
    print(
        f"{arm} seed {seed}: {figures['s_per_1000']:.1f} s/1000 samples, overlap {figures['overlap']:.0%}, "
        f"held-out {figures['before']:.3f} → {figures['after']:.3f}",
        flush=True,
    )
    return figures


def aggregate(runs: list[dict], arms: list[str]) -> dict[str, dict[str, Any]]:
    """Per arm: median, min, max of s/1000 samples; median overlap; held-out after (mean, min, max, stdev)."""
    table: dict[str, dict[str, Any]] = {}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]
        times = [r["s_per_1000"] for r in mine]
        after = [r["after"] for r in mine]
        table[arm] = {
            "runs": len(mine),
            "s_per_1000_median": statistics.median(times),
            "s_per_1000_min": min(times),
            "s_per_1000_max": max(times),
            "overlap_median": statistics.median(r["overlap"] for r in mine),
            "held_out_after_mean": statistics.mean(after),
            "held_out_after_min": min(after),
            "held_out_after_max": max(after),
            "held_out_after_stdev": statistics.stdev(after) if len(after) > 1 else float("nan"),
        }
    if "sync" in table:
        for arm in arms:
            table[arm]["speedup_vs_sync"] = table["sync"]["s_per_1000_median"] / table[arm]["s_per_1000_median"]
    return table


def markdown(table: dict[str, dict[str, Any]], before: float) -> str:
    """The table as Markdown."""
    lines = [
        "| arm | s / 1,000 samples: median (min–max) | speed-up vs sync | overlap | held-out after: mean (min–max) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for arm, t in table.items():
        lines.append(
            f"| {arm} | {t['s_per_1000_median']:.1f} ({t['s_per_1000_min']:.1f}–{t['s_per_1000_max']:.1f}) | "
            f"{t.get('speedup_vs_sync', float('nan')):.2f}× | {t['overlap_median']:.0%} | "
            f"{t['held_out_after_mean']:.3f} ({t['held_out_after_min']:.3f}–{t['held_out_after_max']:.3f}) |"
        )
    lines.append(f"\nheld-out before training (shared warm start): {before:.3f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns what it writes to ``async_training.json``."""
    args = parser().parse_args(argv)
    if args.quick:
        defaults = parser().parse_args([])
        for key, value in QUICK.items():
            if getattr(args, key) == getattr(defaults, key):
                setattr(args, key, value)
    arms = [a for a in args.arms.split(",") if a]
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise SystemExit(f"unknown arms {sorted(unknown)}: choose from {', '.join(ARMS)}")
    out = args.out or (Path(tempfile.mkdtemp(prefix="envkit-async-bench-")) if args.quick else HERE)
    out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    started = time.perf_counter()
    from envkit.adapters.vllm import cpus
    from envkit.adapters.vllm.servers import LocalServers, lora_rank_bound, min_max_loras, model_max_len

    cuda = _cuda()
    split = None if args.no_cpu_split else cpus.local_split(args.servers, cuda=cuda)
    if split is not None:
        print(split.describe(), flush=True)

    with tempfile.TemporaryDirectory(prefix="envkit-async-bench-") as tmp:
        workdir = Path(tmp)
        model = args.warm_start or make_warm_start(args, workdir / "warm")
        runs: list[dict] = []
        servers = None
        if any(a.startswith("async") for a in arms):
            servers = LocalServers(
                str(model),
                args.servers,
                python=vllm_python(args),
                log_dir=out / "servers",
                max_loras=min_max_loras(2),
                max_lora_rank=lora_rank_bound(args.lora_r),
                max_model_len=model_max_len(str(model)),
                cpu_sets=split.servers if split else None,
                chunked_prefill=cuda,
                grouped_lora=not cuda and not args.vllm_lora_kernels,
            )
            servers.start()
            print(f"server LoRA kernels: {servers.lora_kernels}", *servers.notes, sep="\n", flush=True)
        try:
            for seed in range(args.runs):
                order = arms[seed % len(arms) :] + arms[: seed % len(arms)]
                for arm in order:
                    runs.append(run_arm(arm, model, workdir, seed, args, servers.urls if servers else [], split))
        finally:
            if servers is not None:
                servers.stop()
    table = aggregate(runs, arms)
    before = runs[0]["before"]
    result = {
        "table": table,
        "runs": runs,
        "held_out_before": before,
        "minutes": (time.perf_counter() - started) / 60,
        "load_average_at_start": load,
        "load_average_at_end": os.getloadavg(),
        "cpus": os.cpu_count(),
        "cpu_split": split.as_dict() if split else None,
        "server_lora_kernels": servers.lora_kernels if servers else None,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    (out / "async_training.json").write_text(json.dumps(result, indent=1, default=str))
    print(markdown(table, before))
    print(f"load average at start {load}, at end {os.getloadavg()}; {result['minutes']:.1f} min")
    print(f"figures: {out / 'async_training.json'}", flush=True)
    return result


if __name__ == "__main__":
    main()
