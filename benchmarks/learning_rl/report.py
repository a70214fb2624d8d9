"""The report of whatever has finished: IQM tables with stratified-bootstrap 95 % CIs, the probability of
improvement, pass@k, learning-curve and pass@k figures and the canaries, into ``OUT/results.md``,
``OUT/summary.json`` and PNGs."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

from .experiments import ARMS, EXPERIMENTS, MODELS, Experiment, as_recorded
from .files import write_whole
from .search import SEARCH_FILE


def finished(out: Path, exp: str) -> list[dict[str, Any]]:
    """The finished seeds' results of experiment ``exp``."""
    return [json.loads(p.read_text()) for p in sorted((out / exp).glob("seed-*.json"))]


def _rejected(warm: dict[str, Any]) -> str:
    """The warm-start attempts not kept, each with its probe and pilot gate (", rejected: …"), or nothing."""
    others = [a for i, a in enumerate(warm["attempts"], 1) if i != warm["kept_attempt"]]
    return "".join(
        f"{', rejected: ' if i == 0 else '; '}probe {a['best']:.2f}, gate {a['gate']['solved']:.3f}"
        for i, a in enumerate(others)
    )


def _rates(run: dict[str, Any]) -> str:
    """The learning rate each arm of a seed ran at ("; learning rates: grpo 0.0001, …"), or nothing (a seed run
    before the search recorded none)."""
    rates = [f"{arm} {run[arm]['learning_rate']:g}" for arm in ARMS if "learning_rate" in run.get(arm, {})]
    return f"; learning rates: {', '.join(rates)}" if rates else ""


def _capped(run: dict[str, Any]) -> list[str]:
    """The SFT-to-plateau arms of a seed that stopped at ``--plateau-max-steps`` with their best validation at the last
    checkpoint: not at a plateau (the arm is short of what more steps would give it)."""
    return [
        arm
        for arm in ("sft_plateau", "privileged")
        if arm in run and run[arm]["best_step"] == run[arm]["steps"] and run[arm]["best_step"] > 0
    ]


def _kept_start(run: dict[str, Any]) -> list[str]:
    """The SFT-to-plateau arms of a seed whose best validation was before their first step: they stopped (their
    patience spent) on a dip and kept the warm start, so the arm is the warm start there, not SFT at a plateau."""
    return [arm for arm in ("sft_plateau", "privileged") if arm in run and run[arm]["best_step"] == 0]


def _kept_probe(warm: dict[str, Any]) -> float:
    """The probe of the warm-start checkpoint kept."""
    return float(dict((int(s), p) for s, p in warm["probes"])[warm["selected_steps"]])


def report(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Tables (IQM, stratified-bootstrap 95 % CIs, probability of improvement), pass@k and learning-curve PNGs of
    every finished seed; writes ``OUT/results.md`` and ``OUT/summary.json``."""
    import numpy as np
    from rliable import library as rly
    from rliable import metrics

    lines, summary = [], {}
    for name, current in EXPERIMENTS.items():
        runs = finished(out, name)
        recorded = out / name / "args.json"
        if not runs:
            if recorded.exists():  # started: say so, rather than leave the experiment out
                title = as_recorded(current, json.loads(recorded.read_text())).title
                progress = (
                    f"No seed has finished yet (a seed's JSON is written once every arm has run; its progress is in "
                    f"{name}/seed-N/log.txt)."
                )
                lines += [f"## Experiment {name}: {title}", "", progress, ""]
            continue
        exp = as_recorded(current, json.loads(recorded.read_text())) if recorded.exists() else current
        gated = [r["seed"] for r in runs if r.get("gated")]
        full = [r for r in runs if not r.get("gated")]
        lines += [f"## Experiment {name}: {exp.title}", ""]
        below = [r["seed"] for r in runs if r.get("below_gate")]
        lines.append(
            f"{len(runs)} seed{'s' if len(runs) != 1 else ''} finished ({len(full)} with every arm; gated by the "
            f"pilot gate: {gated or 'none'}"
            + (f"; arms run below the gate with --ignore-gate: {below}" if below else "")
            + ")."
        )
        for r in runs:
            g = r["gate"]
            lines.append(
                f"- seed {r['seed']}: warm start {r['warm_start']['selected_steps']} SFT steps (probe "
                f"{_kept_probe(r['warm_start']):.2f}, passed: {r['warm_start']['passed']}, initialisations tried: "
                f"{len(r['warm_start']['attempts'])}{_rejected(r['warm_start'])}); pilot gate "
                + (
                    f"(on the {g['after_failure']['episodes_with_failure']} episodes that met a failure) "
                    if "after_failure" in g
                    else ""
                )
                + f"{g['solved']:.3f} ≥ {g['needed']}: {g['passed']}; held-out overlap {r['tasks']['overlap']} "
                f"(dropped {r['tasks']['dropped']})"
                + _rates(r)
                + (
                    f"; **stopped at the step cap, still improving**: {', '.join(capped)}"
                    if (capped := _capped(r))
                    else ""
                )
                + (
                    f"; **kept the warm start (best validation before the first SFT step)**: {', '.join(start)}"
                    if (start := _kept_start(r))
                    else ""
                )
            )
        lines.append("")
        lines += _search_table(out / name / SEARCH_FILE, summary.setdefault(name, {}))
        models = [m for m in MODELS if all(m in r["eval"] for r in full)] if full else ["warm_start"]
        source = full or runs
        conditions = list(exp.conditions)
        scores = {
            m: np.array([[r["eval"][m]["conditions"][c]["mean_score"] for c in conditions] for r in source])
            for m in models
        }
        validity = {
            m: np.array([[r["eval"][m]["conditions"][c]["format_valid"] for c in conditions] for r in source])
            for m in models
        }
        summary[name].update({"seeds": [r["seed"] for r in source], "models": {}})
        lines += [
            f"Held-out mean score, IQM over {len(source)} seeds [95 % stratified-bootstrap CI] "
            f"(format validity, mean):",
            "",
            "| model | " + " | ".join(conditions) + " | hard conditions (IQM) |",
            "| --- | " + " | ".join("---:" for _ in conditions) + " | ---: |",
        ]
        hard = [conditions.index(c) for c in exp.hard_conditions]
        reps = args.bootstrap_reps
        for m in models:
            cells = []
            per = {}
            for j, c in enumerate(conditions):
                point, ci = rly.get_interval_estimates(
                    {m: scores[m][:, [j]]}, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=reps
                )
                lo, hi = ci[m][:, 0]
                per[c] = {
                    "iqm": float(point[m][0]),
                    "ci": [float(lo), float(hi)],
                    "format_valid": float(validity[m][:, j].mean()),
                }
                cells.append(f"{point[m][0]:.3f} [{lo:.2f}, {hi:.2f}] ({validity[m][:, j].mean():.2f})")
            point, ci = rly.get_interval_estimates(
                {m: scores[m][:, hard]}, lambda x: np.array([metrics.aggregate_iqm(x)]), reps=reps
            )
            lo, hi = ci[m][:, 0]
            per["hard"] = {"iqm": float(point[m][0]), "ci": [float(lo), float(hi)]}
            summary[name]["models"][m] = per
            lines.append(f"| {m} | " + " | ".join(cells) + f" | {point[m][0]:.3f} [{lo:.2f}, {hi:.2f}] |")
        lines.append("")
        if "grpo" in models:
            lines += ["Probability of improvement of GRPO over each arm on the hard conditions [95 % CI]:", ""]
            summary[name]["probability_of_improvement"] = {}
            for m in models:
                if m == "grpo":
                    continue
                pair = {f"grpo,{m}": (scores["grpo"][:, hard], scores[m][:, hard])}
                point, ci = rly.get_interval_estimates(pair, metrics.probability_of_improvement, reps=reps)
                key = f"grpo,{m}"
                lo, hi = ci[key][:, 0] if ci[key].ndim == 2 else ci[key]
                summary[name]["probability_of_improvement"][m] = {
                    "p": float(np.ravel(point[key])[0]),
                    "ci": [float(lo), float(hi)],
                }
                lines.append(f"- P(GRPO > {m}) = {float(np.ravel(point[key])[0]):.2f} [{lo:.2f}, {hi:.2f}]")
            lines.append("")
        lines += _after_failure_table(exp, source, models, summary[name])
        lines += _pass_at_k_table(exp, source, models, summary[name])
        _plots(out, exp, source, models)
        lines += [
            f"![pass@k]({name}-pass_at_k.png)",
            f"![learning curves]({name}-learning_curves.png)",
            "",
        ]
        canary = out / name / "canaries.json"
        if canary.exists():
            lines += ["Canaries (`envkit validate` check 17, per env config):", ""]
            for label, c in json.loads(canary.read_text()).items():
                lines.append(f"- {label}: {c['status']} — {c['reason']}")
            lines.append("")
    if not lines:
        lines = [
            f"No seed has finished in {out.name}/ yet (a seed's JSON is written once every arm has run; a pilot's "
            "figures are in its seeds' log.txt)."
        ]
    write_whole(out / "results.md", "\n".join(lines) + "\n")
    write_whole(out / "summary.json", json.dumps(summary, indent=1))
    print("\n".join(lines))
    return summary


def _search_table(path: Path, summary: dict) -> list[str]:
    """The learning-rate search's table (each arm's validation score at each rate, the rate kept), from ``path``
    (``OUT/EXP/search.json``); nothing before the search seed has chosen a rate."""
    if not path.exists():
        return []
    search = json.loads(path.read_text())
    summary["search"] = search
    rates = [f"{rate:g}" for rate in search["learning_rates"]]
    lines = [
        f"Learning-rate search, the same budget for every arm: each ran at {' and '.join(rates)} on seed "
        f"{search['seed']}; {search['rule']}. Validation scores:",
        "",
        "| arm | " + " | ".join(f"lr {rate}" for rate in rates) + " | kept |",
        "| --- | " + " | ".join("---:" for _ in rates) + " | ---: |",
    ]
    for arm, scores in search["validation"].items():
        cells = " | ".join(f"{scores[rate]:.3f}" if rate in scores else "–" for rate in rates)
        lines.append(f"| {arm} | {cells} | {search['chosen'][arm]:g} |")
    return [*lines, ""]


def _after_failure_table(exp: Experiment, runs: list[dict], models: list[str], summary: dict) -> list[str]:
    """What each model did after an injected tool failure, per held-out condition that has failures (mean over the
    seeds whose evaluation recorded it): the fraction of failures retried at once, and the mean score of episodes
    that met a failure against those that did not."""
    if exp.failure_marker is None:
        return []
    first = exp.hard_conditions[0]
    runs = [r for r in runs if all("after_failure" in r["eval"][m]["conditions"][first] for m in models)]
    if not runs:
        return []
    conditions = [
        c for c in exp.conditions if runs[0]["eval"]["warm_start"]["conditions"][c]["after_failure"]["failures"]
    ]

    def mean(model: str, condition: str, key: str) -> float | None:
        values = [r["eval"][model]["conditions"][condition]["after_failure"][key] for r in runs]
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    def shown(value: float | None) -> str:
        return "–" if value is None else f"{value:.2f}"

    lines = [
        f"After a failed tool call (mean over {len(runs)} seeds): retried = the next turn called the tool again; "
        "score when a failure was met / when none was:",
        "",
        "| model | " + " | ".join(f"{c} retried | {c} score, failure met / none" for c in conditions) + " |",
        "| --- | " + " | ".join("---: | ---:" for _ in conditions) + " |",
    ]
    summary["after_failure"] = {}
    for m in models:
        per = {
            c: {k: mean(m, c, k) for k in ("retried", "score_with_failure", "score_without_failure")}
            for c in conditions
        }
        summary["after_failure"][m] = per
        cells = [
            f"{shown(f['retried'])} | {shown(f['score_with_failure'])} / {shown(f['score_without_failure'])}"
            for f in per.values()
        ]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def _pass_at_k_table(exp: Experiment, runs: list[dict], models: list[str], summary: dict) -> list[str]:
    ks = [1, 2, 4, 8, 16, 32, 64]
    lines = [f"pass@k on held-out {exp.pass_at_k} (mean over seeds; unbiased estimator):", ""]
    n = len(runs[0]["eval"]["warm_start"]["pass@k"]["pass@k"])
    ks = [k for k in ks if k <= n]
    lines += [
        "| model | " + " | ".join(f"k={k}" for k in ks) + " |",
        "| --- | " + " | ".join("---:" for _ in ks) + " |",
    ]
    summary["pass@k"] = {}
    for m in models:
        curve = [sum(r["eval"][m]["pass@k"]["pass@k"][k - 1] for r in runs) / len(runs) for k in range(1, n + 1)]
        summary["pass@k"][m] = curve
        lines.append(f"| {m} | " + " | ".join(f"{curve[k - 1]:.3f}" for k in ks) + " |")
    return [*lines, ""]


DEFAULT_WINDOW = 320
"""Env episodes per learning-curve point when no run has RFT's rounds to match."""


def windowed(curve: list[list[float]], width: int) -> list[tuple[float, float]]:
    """A training curve's ``[env episodes so far, mean score of the batch]`` points averaged over consecutive windows of
    ``width`` env episodes, each point at its window's end. GRPO's 32-episode batches, windowed by RFT's 320-episode
    rounds, become points that are means of as many episodes as RFT's (and readable: one batch is noise)."""
    windows: dict[int, list[float]] = {}
    for episodes, score in curve:
        windows.setdefault(math.ceil(episodes / width), []).append(score)
    return [(index * width, sum(scores) / len(scores)) for index, scores in sorted(windows.items())]


def seed_mean(curves: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """The mean over seeds of curves on one grid of env episodes (the points every seed has)."""
    by_x: dict[float, list[float]] = {}
    for curve in curves:
        for x, y in curve:
            by_x.setdefault(x, []).append(y)
    return [(x, sum(ys) / len(ys)) for x, ys in sorted(by_x.items()) if len(ys) == len(curves)]


def _draw(axis: Any, curves: list[list[tuple[float, float]]], color: str, label: str) -> None:
    """Each seed's curve thin (when there are several) and their mean bold."""
    if len(curves) > 1:
        for curve in curves:
            axis.plot(*zip(*curve, strict=True), color=color, alpha=0.3, linewidth=1)
    if curves:
        seeds = f"{len(curves)} seed{'s' * (len(curves) > 1)}"
        axis.plot(*zip(*seed_mean(curves), strict=True), color=color, linewidth=2, label=f"{label} ({seeds})")


def _plots(out: Path, exp: Experiment, runs: list[dict], models: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for m in models:
        n = len(runs[0]["eval"][m]["pass@k"]["pass@k"])
        curve = [sum(r["eval"][m]["pass@k"]["pass@k"][k] for r in runs) / len(runs) for k in range(n)]
        axis.plot(range(1, n + 1), curve, label=m)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("k")
    axis.set_ylabel(f"pass@k, held-out {exp.pass_at_k}")
    axis.set_title(f"Experiment {exp.name}: {exp.title}", fontsize=9)
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out / f"{exp.name}-pass_at_k.png", dpi=110)
    plt.close(figure)

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    rft_rounds = [r["rft"]["curve"] for r in runs if "rft" in r and r["rft"]["curve"]]
    width = int(rft_rounds[0][0][0]) if rft_rounds else DEFAULT_WINDOW
    trained = {
        arm: [windowed(r[arm]["curve"], width) for r in runs if arm in r and r[arm]["curve"]] for arm in ("grpo", "rft")
    }
    for (arm, curves), color in zip(trained.items(), ("C0", "C1"), strict=True):
        _draw(left, curves, color, arm)
    left.set_xlabel("env episodes")
    left.set_ylabel(f"mean score of the {width} episodes sampled")
    thin = "; thin: one seed each" if any(len(curves) > 1 for curves in trained.values()) else ""
    left.set_title(f"GRPO and RFT against env episodes (a point per {width}{thin})", fontsize=9)
    for arm, color in (("sft_plateau", "C2"), ("privileged", "C3")):
        _draw(right, [[tuple(point) for point in r[arm]["curve"]] for r in runs if arm in r], color, arm)
    right.set_xlabel("SFT steps from the warm start")
    right.set_ylabel("validation score (training condition)")
    right.set_title("SFT arms' validation curves (checkpoint selection)", fontsize=9)
    for axis in (left, right):
        axis.grid(alpha=0.3)
        if axis.get_legend_handles_labels()[0]:  # a gated experiment has no arms to draw
            axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / f"{exp.name}-learning_curves.png", dpi=110)
    plt.close(figure)
