"""Proof that GRPO through envkit learns: SFT warm start, then ``envkit train``, held-out score before and after.

For each run seed: train a BPE tokenizer and build a tiny Qwen2 model locally, warm-start it with ``envkit sft``'s
code (a short SFT on oracle demonstrations), then run ``envkit train`` (full fine-tuning, GRPO through TRL) on the
built-in ``guess-number`` env with a 1–32 range; ``envkit train`` evaluates 256 held-out tasks (seeds ≥ 1,000,000,
4 episodes each) before and after. Prints the table, writes ``benchmarks/learning.json`` and the reward curve
``benchmarks/learning_curve.png``.

Usage: ``python benchmarks/learning.py [--runs 3] [--grpo-steps 1400] [--num-iterations 2] [--sft-steps 150]
[--learning-rate 5e-4]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import envkit
from envkit import train
from envkit.sft import sft_on_oracle
from envkit.testing import build_tiny_model, build_tokenizer

HERE = Path(__file__).resolve().parent
ENV, ENV_CONFIG = "guess-number", {"low": 1, "high": 32}


def one_run(seed: int, workdir: Path, args: argparse.Namespace) -> dict:
    """Warm start, then GRPO; the before/after held-out scores and the training reward curve."""
    factory = lambda: envkit.make(ENV, **ENV_CONFIG)  # noqa: E731
    env = factory()
    corpus = [m["content"] for s in range(200) for m in env.reset(seed=s)[0]]
    tokenizer = build_tokenizer(workdir / "tokenizer", extra_corpus=corpus)
    model = build_tiny_model(tokenizer, seed=seed)
    started = time.perf_counter()
    sft_on_oracle(
        model,
        tokenizer,
        factory,
        seeds=list(range(2000 + 1000 * seed, 2128 + 1000 * seed)),
        output_dir=str(workdir / "sft"),
        max_steps=args.sft_steps,
        learning_rate=3e-3,
        log=lambda _: None,
        disable_tqdm=True,
        seed=seed,
    )
    sft_seconds = time.perf_counter() - started
    started = time.perf_counter()
    summary = train.run(
        [
            "--env",
            ENV,
            "--rl-env-config",
            json.dumps(ENV_CONFIG),
            "--model",
            str(workdir / "sft"),
            "--output-dir",
            str(workdir / "grpo"),
            "--no-lora",
            "--learning-rate",
            str(args.learning_rate),
            "--warmup-steps",
            "20",
            "--max-steps",
            str(args.grpo_steps),
            "--per-device-train-batch-size",
            str(args.batch_size),
            "--gradient-checkpointing",
            "false",
            "--num-iterations",
            str(args.num_iterations),
            "--rl-num-generations",
            str(args.num_generations),
            "--rl-max-new-tokens",
            "6",
            "--max-turns",
            "8",
            "--rl-kl-coef",
            "0.0",
            "--rl-top-k",
            "0",
            "--eval-tasks",
            str(args.eval_tasks),
            "--eval-samples",
            "4",
            "--train-tasks",
            "4000",
            "--seed",
            str(seed),
            "--disable-tqdm",
            "true",
            "--logging-steps",
            "5",
        ],
        log=lambda _: None,
    )
    grpo_seconds = time.perf_counter() - started
    history = json.loads((workdir / "grpo" / "log_history.json").read_text())
    curve = [(e["step"], e["envkit/mean_score"]) for e in history if "envkit/mean_score" in e]
    return {
        "seed": seed,
        "before": summary["before"]["mean_score"],
        "after": summary["after"]["mean_score"],
        "pass_before": summary["before"]["pass@1"],
        "pass_after": summary["after"]["pass@1"],
        "sft_seconds": sft_seconds,
        "grpo_seconds": grpo_seconds,
        "curve": curve,
    }


def plot(runs: list[dict], path: Path) -> None:
    """Training reward (mean episode score per logged step) for every run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for run in runs:
        steps, scores = zip(*run["curve"], strict=True)
        window = 10
        smooth = [statistics.mean(scores[max(0, i - window + 1) : i + 1]) for i in range(len(scores))]
        (line,) = axis.plot(
            steps, smooth, label=f"run {run['seed']}: {run['before']:.2f} → {run['after']:.2f} held-out"
        )
        axis.plot(steps, scores, color=line.get_color(), alpha=0.2, linewidth=0.8)
    axis.set_xlabel("GRPO step")
    axis.set_ylabel("mean episode score (training batches;\nbold: moving average of 10 logs)")
    axis.set_title(f"envkit train on {ENV} (1–32), tiny Qwen2 after SFT warm start")
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sft-steps", type=int, default=150)
    parser.add_argument("--grpo-steps", type=int, default=1400)
    parser.add_argument("--batch-size", type=int, default=64, help="episodes per GRPO step")
    parser.add_argument("--num-generations", type=int, default=8, help="episodes per task (GRPO's group size)")
    parser.add_argument("--eval-tasks", type=int, default=256)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument(
        "--num-iterations", type=int, default=2, help="optimizer steps per batch of episodes (TRL's num_iterations)"
    )
    parser.add_argument("--plot-only", action="store_true", help="redraw the PNG from benchmarks/learning.json")
    args = parser.parse_args()
    if args.plot_only:
        plot(json.loads((HERE / "learning.json").read_text())["runs"], HERE / "learning_curve.png")
        return
    started = time.perf_counter()
    runs = []
    for seed in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            runs.append(one_run(seed, Path(tmp), args))
        r = runs[-1]
        print(
            f"run {seed}: held-out mean score {r['before']:.3f} → {r['after']:.3f} ({r['after'] - r['before']:+.3f}); "
            f"pass@1 {r['pass_before']:.3f} → {r['pass_after']:.3f}; SFT {r['sft_seconds']:.0f}s, GRPO "
            f"{r['grpo_seconds']:.0f}s",
            flush=True,
        )
    gains = [r["after"] - r["before"] for r in runs]
    total = time.perf_counter() - started
    print(
        f"mean gain {statistics.mean(gains):+.3f} (min {min(gains):+.3f}) over {len(runs)} runs in {total / 60:.1f} min"
    )
    (HERE / "learning.json").write_text(
        json.dumps(
            {"runs": runs, "mean_gain": statistics.mean(gains), "minutes": total / 60, "args": vars(args)}, indent=1
        )
    )
    plot(runs, HERE / "learning_curve.png")


if __name__ == "__main__":
    main()
