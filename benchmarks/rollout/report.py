"""The results printed as tables, and several runs' ``--out`` files pooled."""

from __future__ import annotations

import statistics
from typing import Any


def print_report(results: dict[str, Any]) -> None:
    print(
        f"backend {results['backend']}, {results['parameters']:,}-parameter model, {results['cpu_count']} CPUs, "
        f"{results['torch_threads']} torch thread(s); {results['repeats']} repeats after a warm-up: median [min-max]; "
        f"a tool call that does not parse: {results['malformed']}s the episode in envkit's arms"
    )
    for name, by_size in results["workloads"].items():
        b = by_size["budgets"]
        for size, data in by_size.items():
            if size == "budgets":
                continue
            print(
                f"\n--- {name}, {size} episodes (per turn {b['per_turn']} tokens, per episode {b['total']}, "
                f"{b['max_turns']} turns max)"
            )
            print(
                f"{'arm':11} {'seconds':>22} {'eps/s':>7} {'model tok/s':>11} {'turns':>6} {'tools':>6} "
                f"{'model tok':>9} {'score':>6}  where the time went (medians)"
            )
            for arm, r in data["arms"].items():
                s = r["seconds"]
                line = f"{arm:11} {s['median']:7.3f} [{s['min']:.3f}-{s['max']:.3f}]"
                if arm != "limit":
                    score = "n/a" if r["mean_score"] is None else f"{r['mean_score']:.2f}"
                    line += (
                        f" {r['eps_per_s']:7.1f} {r['model_tok_per_s']:11.0f} {r['mean_turns']:6.2f} "
                        f"{r['mean_tool_calls']:6.2f} {r['model_tokens']:9.0f} {score:>6}  "
                    )
                if arm == "trl":
                    line += (
                        f"_generate {r['generate_seconds']:.3f}, model.generate {r['single_turn_seconds']:.3f}, "
                        f"tools slept {r['tool_sleep_seconds']:.3f}"
                    )
                elif arm == "envkit_trl":
                    line += f"_generate {r['generate_seconds']:.3f}, rollout_func {r['rollout_seconds']:.3f}"
                elif arm == "envkit":
                    line += (
                        f"backend.generate {r['generate_seconds']:.3f} in {r['generate_calls']:.0f} calls of "
                        f"{r['mean_batch']:.1f}"
                    )
                print(line)
            o, q = data["overhead_fraction"], data["ratio_vs_trl_per_repeat"]
            print(
                f"ratio vs TRL (GRPOTrainer._generate_and_score_completions): {data['ratio_vs_trl']:.2f}x "
                f"(per repeat {q['min']:.2f}-{q['max']:.2f}); _generate only: {data['ratio_vs_trl_generate']:.2f}x; "
                f"bare engine vs TRL's _generate: {data['ratio_bare_vs_trl']:.2f}x; "
                f"model tok/s: {data['ratio_vs_trl_tokens_per_s']:.2f}x; process CPU seconds: "
                f"{data['ratio_vs_trl_cpu']:.2f}x"
            )
            load = [r["loadavg_1min"] for a in data["arms"].values() for r in a["runs"] if "loadavg_1min" in r]
            print(
                f"overhead fraction (1 - limit/envkit): {o['median']:.3f} [{o['min']:.3f}-{o['max']:.3f}]; "
                f"replayed tokens identical: {data['limit_tokens_identical']}; 1-min load average "
                f"{min(load):.1f}-{max(load):.1f}"
            )


def print_profile(results: dict[str, Any]) -> None:
    for name, data in results.get("profile", {}).items():
        print(
            f"\n--- profile of one bare engine run: {name}, wall {data['wall_seconds']:.3f} s, backend.generate "
            f"{data['backend_generate_seconds']:.3f} s in {data['generate_calls']} calls ({data['threads_profiled']} "
            "threads; seconds summed over threads)"
        )
        for label, seconds in data["seconds"].items():
            print(f"  {label:48} {seconds:8.3f}")
        print("  top own time (waiting on queues, locks and epoll left out):")
        for row in data["top_own_time_excluding_waits"][:12]:
            print(f"    {row['function'][:90]:90} {row['own_seconds']:8.3f} {row['calls']:8}")


def pool_runs(results: list[dict[str, Any]], *, resamples: int = 2000) -> dict[str, dict[str, Any]]:
    """Pool several runs' ``--out`` results, per workload and episode count: every run's ratio vs TRL, and the
    per-repeat ratios of all runs together (each repeat pairs TRL's loop and envkit's ``rollout_func`` on the same
    batch): their median, a 95 % bootstrap interval of that median (``resamples`` draws, seeded) and how many repeats
    envkit won. One run's median hides how far runs spread; the pool says whether the margin outlasts that spread."""
    import random

    pooled: dict[str, dict[str, Any]] = {}
    for result in results:
        for workload, by_size in result["workloads"].items():
            for size, data in by_size.items():
                if size == "budgets":
                    continue
                entry = pooled.setdefault(f"{workload} {size}", {"run_ratios": [], "repeat_ratios": []})
                entry["run_ratios"].append(data["ratio_vs_trl"])
                arms = data["arms"]
                entry["repeat_ratios"] += [
                    t["seconds"] / e["seconds"]
                    for t, e in zip(arms["trl"]["runs"], arms["envkit_trl"]["runs"], strict=True)
                ]
    rng = random.Random(0)
    for entry in pooled.values():
        ratios = entry["repeat_ratios"]
        medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
        entry.update(
            runs=len(entry["run_ratios"]),
            repeats=len(ratios),
            median_run_ratio=statistics.median(entry["run_ratios"]),
            median_repeat_ratio=statistics.median(ratios),
            repeat_ratio_95=(medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]),
            envkit_faster=sum(r > 1.0 for r in ratios),
        )
    return pooled


def print_pool(pooled: dict[str, dict[str, Any]]) -> None:
    for name, entry in pooled.items():
        low, high = entry["repeat_ratio_95"]
        runs = ", ".join(f"{r:.2f}" for r in sorted(entry["run_ratios"]))
        print(
            f"{name} episodes: {entry['runs']} runs, ratio vs TRL per run {runs} "
            f"(median {entry['median_run_ratio']:.2f}); "
            f"{entry['repeats']} repeats pooled: median {entry['median_repeat_ratio']:.3f} (95 % bootstrap "
            f"{low:.3f}-{high:.3f}), envkit faster in {entry['envkit_faster']}/{entry['repeats']}"
        )
