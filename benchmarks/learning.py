"""Does GRPO through envkit learn a tool-using, multi-turn task? And does it beat more SFT in the same time?

For each run seed, on the built-in ``arithmetic`` env (a word problem; the agent calls ``calculator`` with an
expression, then ``submit_answer`` with the result — two tool-calling turns, scored exactly):

1. Build a BPE tokenizer and a tiny Qwen2 model locally (from training tasks' text only).
2. Check that the held-out tasks are held out: training tasks are seeds ``0 … train_tasks-1``, held-out tasks seeds
   ``held_out_start …`` (the ranges must not intersect), and no held-out opening prompt — rendered through the chat
   template with the tools, as the model sees it — may equal a training prompt. The overlap count is printed; any
   overlap raises :class:`HeldOutOverlap`.
3. Warm start: SFT (``envkit sft``'s code) on oracle demonstrations of training tasks only.
4. Evaluate the warm start on the held-out tasks several times with different sampling seeds: the spread of those
   means is the eval noise.
5. GRPO with ``envkit train`` (full fine-tuning) from the warm start; evaluate.
6. The baseline: continue SFT from the warm start on oracle demonstrations of training tasks for the same compute
   GRPO took — the same CPU time of this process (on an idle machine that is the same wall-clock time; CPU time keeps
   the two arms matched when other work shares the cores); evaluate.

Prints the table, writes ``benchmarks/learning.json`` and the reward curve ``benchmarks/learning_curve.png``; the
last lines are the held-out figures and where the files are. With ``--progress`` (the default when stderr is a
terminal) every phase shows a progress bar with its ETA on stderr; without, the phases are silent until their result
line, so logs of CI runs hold no bars.

Usage: ``python benchmarks/learning.py [--runs 3] [--grpo-steps N] [--sft-steps N] [--eval-tasks 256] ...``;
``--quick`` runs the whole pipeline for a few steps on a few tasks (the test suite's smoke test) and writes its
outputs to ``--out`` (a temporary folder by default) instead of ``benchmarks/``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import envkit
from envkit.adapters.trl import train
from envkit.chat.render import ChatRenderer
from envkit.demos import oracle_episodes
from envkit.models.loading import check_saved_tokenizer
from envkit.testing import build_tiny_model, build_tokenizer
from envkit.util.options import as_flags

HERE = Path(__file__).resolve().parent
ENV = "arithmetic"
ENV_CONFIG: dict[str, Any] = {"kinds": ["containers"]}
"""The env's constructor arguments (``--env-config``); by default one problem kind: a tiny model learns to copy its
three numbers within minutes, and the task space stays wide (tens of millions of problems)."""
HELD_OUT_START = 1_000_000


class HeldOutOverlap(AssertionError):
    """Held-out tasks that are not held out: their seed ranges intersect, or an opening prompt is a training one."""


def factory() -> envkit.Env:
    """A fresh env of the benchmark."""
    return envkit.make(ENV, **ENV_CONFIG)


BAR_FORMAT = "{desc} {n_fmt}/{total_fmt} {unit} |{bar:24}| ETA {remaining} ({elapsed} elapsed)"


def progress_bar(args: argparse.Namespace, desc: str, total: int, unit: str) -> Any:
    """One phase's tqdm bar on stderr (shown with ``--progress``), its ETA from the rate so far."""
    from tqdm import tqdm

    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        bar_format=BAR_FORMAT,
        file=sys.stderr,
        disable=not args.progress,
        mininterval=1.0,  # redrawn at most once a second: a log file of the demo stays small
        dynamic_ncols=True,
    )


def opening_prompts(renderer: ChatRenderer, seeds: range | list[int]) -> list[str]:
    """The opening prompt of each seed's task, rendered through the chat template with the tools (the model's view)."""
    env = factory()
    return [renderer.render(env.reset(seed=seed)[0], add_generation_prompt=True) for seed in seeds]


def training_corpus(seeds: range) -> list[str]:
    """Text of training tasks' oracle episodes (messages and tool calls) and a rendered prompt: the tokenizer's
    corpus, so its merges fit the prompts (tool schemas included) — no held-out text is read."""
    env, corpus = factory(), []
    for seed in seeds:
        env.reset(seed=seed)
        while not env.done:
            env.step(env.oracle())
        for message in env.messages:
            corpus.append(str(message.get("content") or ""))
            corpus += [json.dumps(c["function"]) for c in message.get("tool_calls") or []]
    prompt = ChatRenderer(build_tokenizer(), env.tools).render(env.messages[:2], add_generation_prompt=True)
    return corpus + [prompt] * 20


def check_held_out(renderer: ChatRenderer, train_seeds: range, held_out_seeds: range, log=print) -> int:
    """Raise :class:`HeldOutOverlap` unless the held-out tasks are disjoint from the training tasks, by seed range and
    by content (rendered opening prompts); return the overlap count (0)."""
    shared = range(max(train_seeds.start, held_out_seeds.start), min(train_seeds.stop, held_out_seeds.stop))
    training = set(opening_prompts(renderer, train_seeds))
    held_out = opening_prompts(renderer, held_out_seeds)
    overlap = sum(prompt in training for prompt in held_out)
    log(
        f"held-out check: {len(held_out)} held-out tasks (seeds {held_out_seeds.start}–{held_out_seeds.stop - 1}), "
        f"{len(training)} distinct training prompts (seeds {train_seeds.start}–{train_seeds.stop - 1}); "
        f"overlap: {overlap} prompts, {len(shared)} seeds"
    )
    if len(shared) or overlap:
        raise HeldOutOverlap(
            f"{overlap} of {len(held_out)} held-out opening prompts are training prompts and {len(shared)} seeds are "
            "in both ranges: the held-out score would measure memorisation; move --held-out-start past the training "
            "seeds (and use an env whose task space is wide enough)"
        )
    return overlap


def evaluate(
    model: Any, tokenizer: Any, seeds: list[int], args: argparse.Namespace, sampling_seed: int, bar: Any = None
) -> dict:
    """Mean score and pass@1 over ``seeds`` × ``--eval-samples`` episodes at the training temperature (1.0); ``bar``
    (a progress bar) advances by one per finished episode."""
    from envkit.backends import SamplingParams, TransformersBackend
    from envkit.rollout import RolloutEngine, summarize

    model.eval()
    engine = RolloutEngine(
        factory,
        TransformersBackend(model, tokenizer),
        tokenizer,
        max_turns=args.max_turns,
        max_completion_tokens=args.max_completion_tokens,
    )
    sampling = SamplingParams(temperature=1.0, top_k=None, max_new_tokens=args.max_new_tokens, seed=sampling_seed)
    on_episode = (lambda _: bar.update(1)) if bar is not None else None
    summary = summarize(engine.run(seeds, args.eval_samples, sampling, on_episode=on_episode))
    return {"mean_score": summary["mean_score"], "pass@1": summary["pass@1"]}


def evaluate_repeated(
    model: Any, tokenizer: Any, seeds: list[int], args: argparse.Namespace, label: str = "eval"
) -> dict:
    """``--eval-repeats`` evaluations with different sampling seeds: their mean, and their spread (the noise); one
    progress bar ``label`` over all their episodes."""
    total = args.eval_repeats * len(seeds) * args.eval_samples
    with progress_bar(args, label, total, "episodes") as bar:
        evals = [evaluate(model, tokenizer, seeds, args, sampling_seed=r, bar=bar) for r in range(args.eval_repeats)]
    scores = [e["mean_score"] for e in evals]
    return {
        "mean_score": statistics.mean(scores),
        "pass@1": statistics.mean(e["pass@1"] for e in evals),
        "noise": statistics.stdev(scores) if len(scores) > 1 else float("nan"),
        "evals": evals,
    }


def sft(
    model: Any,
    tokenizer: Any,
    episodes: list,
    output_dir: Path,
    *,
    learning_rate: float,
    seed: int,
    max_steps: int = 10**6,
    scheduler: str = "cosine",
    cpu_seconds: float | None = None,
    bar: Any = None,
) -> int:
    """SFT on oracle ``episodes`` — ``envkit sft``'s code (:func:`envkit.adapters.trl.sft.demonstrations_dataset`, TRL's
    SFTTrainer, env tokens masked out of the loss) — for ``max_steps`` steps or until this process has used
    ``cpu_seconds`` of CPU time since the call (its setup included, as GRPO's time includes its own); returns the steps
    run. ``bar`` (a progress bar of ``max_steps`` steps, or of ``cpu_seconds`` CPU-seconds) advances as it trains."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    from envkit.adapters.trl.sft import demonstrations_dataset

    cpu_started = time.process_time()
    deadline = cpu_started + cpu_seconds if cpu_seconds is not None else None

    class StopAtDeadline(TrainerCallback):
        def on_step_end(self, _args, state, control, **_):
            now = time.process_time()
            if bar is not None:  # in CPU-seconds when the budget is time, else in steps
                done = int(now - cpu_started) if deadline is not None else state.global_step
                bar.update(min(done, bar.total) - bar.n)
            if deadline is not None and now >= deadline:
                control.should_training_stop = True

    config = SFTConfig(
        output_dir=str(output_dir),
        max_steps=max_steps,
        learning_rate=learning_rate,
        lr_scheduler_type=scheduler,
        warmup_steps=min(20, max_steps // 10),
        per_device_train_batch_size=16,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
        max_length=None,
        logging_steps=10**6,
        disable_tqdm=True,  # transformers' bar counts to max_steps, 10**6 for a time budget: ours (``bar``) instead
        gradient_checkpointing=False,
        seed=seed,
    )
    trainer = SFTTrainer(
        model=model,
        args=config,
        train_dataset=demonstrations_dataset(episodes),
        processing_class=tokenizer,
        callbacks=[StopAtDeadline()],
    )
    # With disable_tqdm, transformers prints every log dict to stdout, the final {'train_runtime': ...} included:
    # the phase's own bar and result line say it.
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    model.eval()
    return trainer.state.global_step


def grpo_flags(workdir: Path, seed: int, args: argparse.Namespace, model: Path) -> list[str]:
    """``envkit train``'s command line for one run (its own held-out eval is off: this script evaluates)."""
    return as_flags(
        env=ENV,
        env_config=ENV_CONFIG,
        model=model,
        output_dir=workdir / "grpo",
        no_lora=True,
        learning_rate=args.learning_rate,
        warmup_steps=min(20, args.grpo_steps // 10),
        max_steps=args.grpo_steps,
        per_device_train_batch_size=args.batch_size,
        gradient_checkpointing=False,
        num_iterations=args.num_iterations,
        rl_num_generations=args.num_generations,
        rl_max_new_tokens=args.max_new_tokens,
        max_turns=args.max_turns,
        max_completion_tokens=args.max_completion_tokens,
        rl_kl_coef=0.0,
        rl_top_k=0,
        eval_tasks=0,
        train_tasks=args.train_tasks,
        seed=seed,
        disable_tqdm=not args.progress,  # envkit train's live bar (step, score, ETA) on stderr
        logging_steps=args.logging_steps,
    )


def warm_start(seed: int, workdir: Path, args: argparse.Namespace, log=print) -> dict:
    """Tokenizer, held-out check, SFT warm start on oracle demonstrations of training tasks (saved in
    ``workdir/sft``) and its repeated held-out evaluation (the noise)."""
    train_seeds = range(0, args.train_tasks)
    held_out = range(args.held_out_start, args.held_out_start + args.eval_tasks)
    env = factory()
    tokenizer = build_tokenizer(workdir / "tokenizer", extra_corpus=training_corpus(train_seeds[:200]))
    renderer = ChatRenderer(tokenizer, env.tools)
    overlap = check_held_out(renderer, train_seeds, held_out, log)

    model = build_tiny_model(
        tokenizer,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        num_kv_heads=args.num_heads,
        max_position_embeddings=1024,
        seed=seed,
    )
    started = time.perf_counter()
    demo_seeds = list(range(0, min(args.sft_demos, args.train_tasks)))  # training tasks only
    demos = []
    with progress_bar(args, "oracle demonstrations", len(demo_seeds), "tasks") as bar:
        for start in range(0, len(demo_seeds), 100):
            chunk = demo_seeds[start : start + 100]
            demos += oracle_episodes(factory, tokenizer, chunk)
            bar.update(len(chunk))
    with progress_bar(args, "SFT warm start", args.sft_steps, "steps") as bar:
        sft(
            model,
            tokenizer,
            demos,
            workdir / "sft-out",
            learning_rate=args.sft_learning_rate,
            seed=seed,
            max_steps=args.sft_steps,
            scheduler=args.sft_scheduler,
            bar=bar,
        )
    model.save_pretrained(str(workdir / "sft"))
    tokenizer.save_pretrained(str(workdir / "sft"))
    check_saved_tokenizer(
        tokenizer, str(workdir / "sft"), "\n".join(str(m.get("content") or "") for m in demos[0].messages)
    )
    sft_seconds = time.perf_counter() - started
    eval_seeds = list(held_out)
    before = evaluate_repeated(model, tokenizer, eval_seeds, args, "eval warm start (held-out)")
    log(
        f"warm start (seed {seed}): {before['mean_score']:.3f} (pass@1 {before['pass@1']:.3f}; eval noise "
        f"{before['noise']:.3f} over {args.eval_repeats} evals) after {sft_seconds:.0f}s of SFT"
    )
    return {
        "seed": seed,
        "dir": workdir / "sft",
        "tokenizer": tokenizer,
        "demos": demos,
        "demo_seeds": demo_seeds,
        "overlap": overlap,
        "before": before,
        "sft_seconds": sft_seconds,
        "eval_seeds": eval_seeds,
    }


def one_run(seed: int, workdir: Path, args: argparse.Namespace, log=print, warm: dict | None = None) -> dict:
    """Warm start (unless ``warm``, one shared by several runs, is given), GRPO, SFT baseline: one run's figures."""
    import torch
    from transformers import AutoModelForCausalLM

    warm = warm or warm_start(seed, workdir, args, log)
    tokenizer, demos, eval_seeds, before = warm["tokenizer"], warm["demos"], warm["eval_seeds"], warm["before"]
    overlap, demo_seeds, sft_seconds = warm["overlap"], warm["demo_seeds"], warm["sft_seconds"]

    started, cpu_started = time.perf_counter(), time.process_time()
    train.run(grpo_flags(workdir, seed, args, model=warm["dir"]), log=lambda _: None)
    grpo_seconds, grpo_cpu = time.perf_counter() - started, time.process_time() - cpu_started
    grpo_model = AutoModelForCausalLM.from_pretrained(str(workdir / "grpo"), dtype=torch.float32)
    after = evaluate_repeated(grpo_model, tokenizer, eval_seeds, args, "eval after GRPO (held-out)")
    log(
        f"run {seed}: after GRPO {after['mean_score']:.3f} (pass@1 {after['pass@1']:.3f}) in {grpo_seconds:.0f}s "
        f"({grpo_cpu:.0f} CPU-s)"
    )

    budget = grpo_cpu if args.baseline_seconds is None else min(grpo_cpu, args.baseline_seconds)
    started = time.perf_counter()
    sft_model = AutoModelForCausalLM.from_pretrained(str(warm["dir"]), dtype=torch.float32)
    with progress_bar(args, "SFT continuation (GRPO's CPU time)", max(1, int(budget)), "CPU-s") as bar:
        sft_steps = sft(
            sft_model,
            tokenizer,
            demos,
            workdir / "sft-continued",
            learning_rate=args.sft_continue_learning_rate,
            seed=seed,
            scheduler="constant",
            cpu_seconds=budget,
            bar=bar,
        )
        bar.update(bar.total - bar.n)  # the budget is spent (the last step's fraction of a CPU-second included)
    sft_continuation_seconds = time.perf_counter() - started
    baseline = evaluate_repeated(sft_model, tokenizer, eval_seeds, args, "eval after SFT continuation (held-out)")
    log(
        f"run {seed}: after SFT continuation ({sft_steps} steps, {budget:.0f} CPU-s as GRPO, "
        f"{sft_continuation_seconds:.0f}s) "
        f"{baseline['mean_score']:.3f} (pass@1 {baseline['pass@1']:.3f})"
    )
    history = json.loads((workdir / "grpo" / "log_history.json").read_text())
    curve = [(e["step"], e["envkit/mean_score"]) for e in history if "envkit/mean_score" in e]
    return {
        "seed": seed,
        "warm_start_seed": warm["seed"],
        "overlap": overlap,
        "held_out_tasks": len(eval_seeds),
        "train_tasks": args.train_tasks,
        "sft_demos": len(demo_seeds),
        "before": before,
        "grpo": after,
        "sft_baseline": baseline,
        "gain_grpo": after["mean_score"] - before["mean_score"],
        "gain_sft": baseline["mean_score"] - before["mean_score"],
        "sft_seconds": sft_seconds,
        "grpo_seconds": grpo_seconds,
        "grpo_cpu_seconds": grpo_cpu,
        "sft_continuation_seconds": sft_continuation_seconds,
        "sft_continuation_cpu_seconds": budget,
        "sft_continuation_steps": sft_steps,
        "curve": curve,
    }


def plot(runs: list[dict], path: Path) -> None:
    """Training reward (mean episode score per logged step) for every run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for run in runs:
        if not run["curve"]:
            continue
        steps, scores = zip(*run["curve"], strict=True)
        window = 10
        smooth = [statistics.mean(scores[max(0, i - window + 1) : i + 1]) for i in range(len(scores))]
        label = (
            f"run {run['seed']}: held-out {run['before']['mean_score']:.2f} → {run['grpo']['mean_score']:.2f} "
            f"(SFT baseline {run['sft_baseline']['mean_score']:.2f})"
        )
        (line,) = axis.plot(steps, smooth, label=label)
        axis.plot(steps, scores, color=line.get_color(), alpha=0.2, linewidth=0.8)
    axis.set_xlabel("GRPO step")
    axis.set_ylabel("mean episode score (training batches;\nbold: moving average of 10 logs)")
    axis.set_title(
        f"envkit train on {ENV} {json.dumps(ENV_CONFIG)} (calculator + submit_answer)\n"
        "tiny Qwen2 after an SFT warm start; held-out scores in the legend",
        fontsize=9,
    )
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def table(runs: list[dict]) -> str:
    """The results as a Markdown table."""
    lines = [
        "| run | warm start: score (pass@1) | eval noise | after GRPO | gain | gain / noise | after SFT, same time | "
        "gain | GRPO time (CPU) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in runs:
        b, g, s = r["before"], r["grpo"], r["sft_baseline"]
        ratio = r["gain_grpo"] / b["noise"] if b["noise"] and b["noise"] == b["noise"] else float("nan")
        lines.append(
            f"| {r['seed']} | {b['mean_score']:.3f} ({b['pass@1']:.3f}) | ±{b['noise']:.3f} | "
            f"{g['mean_score']:.3f} ({g['pass@1']:.3f}) | {r['gain_grpo']:+.3f} | {ratio:.1f}× | "
            f"{s['mean_score']:.3f} ({s['pass@1']:.3f}) | {r['gain_sft']:+.3f} | "
            f"{r['grpo_seconds']:.0f} s ({r.get('grpo_cpu_seconds', float('nan')):.0f} CPU-s) |"
        )
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The command line (``--quick`` shrinks every size for a smoke test)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument(
        "--env-config", type=json.loads, default=dict(ENV_CONFIG), help="JSON constructor arguments of arithmetic"
    )
    p.add_argument("--seed-offset", type=int, default=0, help="the first run seed")
    p.add_argument("--train-tasks", type=int, default=4000, help="training tasks: seeds 0 … N-1 (GRPO and SFT)")
    p.add_argument("--held-out-start", type=int, default=HELD_OUT_START, help="the first held-out seed")
    p.add_argument("--eval-tasks", type=int, default=256, help="held-out tasks")
    p.add_argument("--eval-samples", type=int, default=1, help="episodes per held-out task")
    p.add_argument("--eval-repeats", type=int, default=3, help="evaluations of each model, with other sampling seeds")
    p.add_argument("--sft-demos", type=int, default=4000, help="oracle demonstrations of training tasks")
    p.add_argument("--sft-steps", type=int, default=1500)
    p.add_argument("--sft-learning-rate", type=float, default=3e-3)
    p.add_argument(
        "--sft-scheduler",
        default="constant_with_warmup",
        help="the warm start's learning-rate schedule (a cosine decay to 0 stalls it before it learns to copy numbers)",
    )
    p.add_argument("--sft-continue-learning-rate", type=float, default=5e-4, help="the SFT baseline's (constant)")
    p.add_argument("--grpo-steps", type=int, default=250)
    p.add_argument("--batch-size", type=int, default=32, help="episodes per GRPO step")
    p.add_argument("--num-generations", type=int, default=8, help="episodes per task (GRPO's group size)")
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument(
        "--num-iterations", type=int, default=2, help="optimizer steps per batch of episodes (TRL's num_iterations)"
    )
    p.add_argument("--max-new-tokens", type=int, default=48, help="tokens per assistant turn")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-completion-tokens", type=int, default=192)
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--logging-steps", type=int, default=5)
    p.add_argument(
        "--baseline-seconds", type=float, default=None, help="cap the SFT baseline's CPU time (--quick: 2 s; else none)"
    )
    p.add_argument("--out", type=Path, default=None, help="folder for learning.json and the PNG (default benchmarks/)")
    p.add_argument(
        "--shared-warm-start",
        action="store_true",
        help="one SFT warm start (run seed --seed-offset) for every run: the runs then differ in GRPO's and the "
        "baseline's seeds only (saves an SFT per run)",
    )
    p.add_argument("--quick", action="store_true", help="a few steps on a few tasks: the pipeline end to end")
    p.add_argument("--plot-only", action="store_true", help="redraw the PNG from learning.json")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a progress bar with an ETA for every phase, on stderr (default: on when stderr is a terminal)",
    )
    return p


QUICK = {
    "runs": 1,
    "train_tasks": 64,
    "eval_tasks": 4,
    "eval_samples": 1,
    "eval_repeats": 2,
    "sft_demos": 16,
    "sft_steps": 4,
    "grpo_steps": 2,
    "batch_size": 4,
    "num_generations": 2,
    "max_new_tokens": 8,
    "max_turns": 2,
    "max_completion_tokens": 48,
    "logging_steps": 1,
    "baseline_seconds": 2.0,
}
"""``--quick``: every size shrunk so the whole pipeline runs in seconds (figures meaningless)."""


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark; returns what it writes to ``learning.json``."""
    args = parser().parse_args(argv)
    if args.progress is None:
        args.progress = sys.stderr.isatty()
    ENV_CONFIG.clear()
    ENV_CONFIG.update(args.env_config)
    if args.quick:  # QUICK's sizes, except where the command line gave its own
        defaults = parser().parse_args([])
        for key, value in QUICK.items():
            if getattr(args, key) == getattr(defaults, key):
                setattr(args, key, value)
    out = args.out or (Path(tempfile.mkdtemp(prefix="envkit-learning-")) if args.quick else HERE)
    out.mkdir(parents=True, exist_ok=True)
    if args.plot_only:
        plot(json.loads((out / "learning.json").read_text())["runs"], out / "learning_curve.png")
        return {}
    started = time.perf_counter()
    runs = []
    with tempfile.TemporaryDirectory() as shared:
        warm = warm_start(args.seed_offset, Path(shared), args) if args.shared_warm_start else None
        for seed in range(args.seed_offset, args.seed_offset + args.runs):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(one_run(seed, Path(tmp), args, warm=warm))
                r = runs[-1]
                print(
                    f"run {seed}: held-out {r['before']['mean_score']:.3f} → GRPO {r['grpo']['mean_score']:.3f}, "
                    f"SFT continuation {r['sft_baseline']['mean_score']:.3f}",
                    flush=True,
                )
    total = time.perf_counter() - started
    print(table(runs))
    gains = [r["gain_grpo"] for r in runs]
    beats = sum(r["grpo"]["mean_score"] > r["sft_baseline"]["mean_score"] for r in runs)
    result = {"runs": runs, "mean_gain": statistics.mean(gains), "minutes": total / 60, "args": vars(args)}
    (out / "learning.json").write_text(json.dumps(result, indent=1, default=str))
    plot(runs, out / "learning_curve.png")
    # The last lines: the figures, then where they are.
    for r in runs:
        print(held_out_line(r, args))
    print(
        f"mean held-out gain of GRPO {statistics.mean(gains):+.3f} (min {min(gains):+.3f}); GRPO beats the SFT "
        f"baseline in {beats}/{len(runs)} runs; {len(runs)} runs in {total / 60:.1f} min"
    )
    print(f"figures: {out / 'learning.json'} · reward curve: {out / 'learning_curve.png'}", flush=True)
    return result


def held_out_line(run: dict, args: argparse.Namespace) -> str:
    """One run's held-out figures in a sentence."""
    b, g, s = run["before"], run["grpo"], run["sft_baseline"]
    return (
        f"run {run['seed']}: held-out score on {run['held_out_tasks']} tasks (mean of {args.eval_repeats} evals): "
        f"warm start {b['mean_score']:.3f} → after GRPO {g['mean_score']:.3f} ({run['gain_grpo']:+.3f}); "
        f"after SFT for the same CPU time {s['mean_score']:.3f} ({run['gain_sft']:+.3f})"
    )


if __name__ == "__main__":
    main()
