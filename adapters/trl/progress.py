"""What ``envkit train`` shows while it runs and leaves behind: a live progress bar and ``reward_curve.png``.

:class:`TrainProgress` replaces transformers' progress callback (a bar plus a raw dict per log). It reads the metrics
envkit's rollouts log (``envkit/mean_score``, ``envkit/mean_turns``, ``envkit/tool_error_rate``, ``envkit/error_rate``)
or, for seed-style classes, TRL's own (``reward``, ``tools/failure_frequency``).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

SCORE_KEYS = ("envkit/mean_score", "reward")
"""Where the mean score of a step is logged: envkit's rollouts, else TRL's mean reward (seed-style classes)."""
TURNS_KEYS = ("envkit/mean_turns",)
TOOL_ERROR_KEYS = ("envkit/tool_error_rate", "tools/failure_frequency")
FAILED_KEYS = ("envkit/error_rate",)

EVAL_PREFIX = "eval_"
"""What transformers puts before each metric of an evaluation's log (``eval_envkit/mean_score``)."""
EVAL_SCORE_KEY = EVAL_PREFIX + SCORE_KEYS[0]
"""The mean score of an evaluation during training (``--eval-strategy``), plotted beside the training curve."""
BAR_FORMAT = "train {n_fmt}/{total_fmt} |{bar:24}| {desc} | ETA {remaining} ({elapsed} elapsed)"
CURVE_FILE = "reward_curve.png"


def _first(logs: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    for key in keys:
        value = logs.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


def describe(logs: dict[str, Any]) -> str:
    """The metrics of one training log as ``score 0.412 · turns 2.50 · tool errors 0.03``; ``""`` when it has none."""
    parts = []
    for label, keys, form in (
        ("score", SCORE_KEYS, "{:.3f}"),
        ("turns", TURNS_KEYS, "{:.2f}"),
        ("tool errors", TOOL_ERROR_KEYS, "{:.2f}"),
    ):
        value = _first(logs, keys)
        if value is not None:
            parts.append(f"{label} {form.format(value)}")
    failed = _first(logs, FAILED_KEYS)
    if failed:
        parts.append(f"failed {failed:.2f}")
    return " · ".join(parts)


def _clock(seconds: float) -> str:
    from tqdm import tqdm

    return tqdm.format_interval(max(0.0, seconds))


class TrainProgress(TrainerCallback):
    """Live progress of a training run: step/max_steps, mean score, mean turns, tool-error rate and ETA.

    By default a tqdm bar (on ``file``, stderr) advanced every step, its metrics refreshed at every log. With
    ``disable`` (GRPOConfig's ``disable_tqdm``, ``--disable-tqdm true``) no bar: one plain line per log, through
    ``log``. Only the main process shows anything.
    """

    def __init__(self, *, disable: bool = False, log: Callable[[str], Any] = print, file: Any = None) -> None:
        self.disable = disable
        self.log = log
        self.file = file
        self.bar: Any = None
        self.started = 0.0
        self.first_step = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        self.started = time.monotonic()
        self.first_step = state.global_step
        if not self.disable:
            from tqdm import tqdm

            self.bar = tqdm(
                total=state.max_steps,
                initial=state.global_step,
                desc="waiting for the first log",
                bar_format=BAR_FORMAT,
                file=self.file if self.file is not None else sys.stderr,
                dynamic_ncols=True,
            )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None and state.global_step > self.bar.n:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not state.is_world_process_zero or not logs:
            return
        if any(key.startswith(EVAL_PREFIX) for key in logs):  # TRL's periodic evaluation (--eval-strategy)
            scores = describe({key.removeprefix(EVAL_PREFIX): value for key, value in logs.items()})
            self.write(f"eval at step {state.global_step}: {scores or 'no score logged'}")
            return
        text = describe(logs)
        if self.bar is not None:
            if text:
                self.bar.set_description_str(text)
            return
        if not self.disable:
            return
        elapsed = time.monotonic() - self.started
        if "train_runtime" in logs:  # the trainer's closing summary
            line = f"done: {state.global_step}/{state.max_steps} steps in {_clock(elapsed)}"
            loss = logs.get("train_loss")
            self.log(line + (f" · train loss {loss:.4g}" if isinstance(loss, (int, float)) else ""))
            return
        done = state.global_step - self.first_step
        remaining = elapsed / done * (state.max_steps - state.global_step) if done > 0 else float("nan")
        eta = _clock(remaining) if math.isfinite(remaining) else "?"
        loss = logs.get("loss")
        parts = [f"step {state.global_step}/{state.max_steps}", text, f"loss {loss:.4g}" if loss is not None else ""]
        self.log(" · ".join(p for p in parts if p) + f" · ETA {eta} ({_clock(elapsed)} elapsed)")

    def write(self, line: str) -> None:
        """Print one line through ``log``: above the live bar when one is shown (the bar is redrawn below it)."""
        if self.bar is None:
            self.log(line)
            return
        with self.bar.external_write_mode():
            self.log(line)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def install(trainer: Any, *, disable: bool, log: Callable[[str], Any] = print) -> TrainProgress:
    """Replace the trainer's progress display (transformers' bar and raw dicts) with :class:`TrainProgress`."""
    from transformers.trainer import DEFAULT_PROGRESS_CALLBACK  # ProgressCallback, or the notebook one
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    for callback in {ProgressCallback, PrinterCallback, DEFAULT_PROGRESS_CALLBACK}:
        trainer.remove_callback(callback)
    progress = TrainProgress(disable=disable, log=log)
    trainer.add_callback(progress)
    return progress


def score_points(log_history: list[dict[str, Any]]) -> tuple[str | None, list[tuple[int, float]]]:
    """``(key, [(step, mean score), …])`` of the training logs: envkit's ``envkit/mean_score`` where logged, else
    TRL's ``reward`` (seed-style classes)."""
    for key in SCORE_KEYS:
        points = logged_points(log_history, key)
        if points:
            return key, points
    return None, []


def logged_points(log_history: list[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    """``[(step, value), …]`` of the log entries with a finite number under ``key``."""
    return [
        (int(entry.get("step", 0)), float(entry[key]))
        for entry in log_history
        if isinstance(entry.get(key), (int, float)) and math.isfinite(entry[key])
    ]


def reward_curve_figure(
    log_history: list[dict[str, Any]],
    *,
    before: float | None = None,
    after: float | None = None,
    title: str = "",
    eval_label: str = "held-out",
) -> Any:
    """The figure of :func:`write_reward_curve` (a matplotlib ``Figure`` on the Agg canvas; no pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    key, points = score_points(log_history)
    figure = Figure(figsize=(7, 4), dpi=110)
    FigureCanvasAgg(figure)
    axis = figure.add_subplot()
    if points:
        steps, scores = zip(*points, strict=True)
        label = "training mean score" if key == "envkit/mean_score" else "training mean reward (score_episode)"
        axis.plot(steps, scores, color="tab:blue", linewidth=1.2, marker="." if len(points) < 50 else None, label=label)
    evaluated = logged_points(log_history, EVAL_SCORE_KEY)
    if evaluated:
        steps, scores = zip(*evaluated, strict=True)
        axis.plot(steps, scores, color="tab:green", linestyle="--", marker="o", markersize=3, label="eval mean score")
    last = max([step for step, _ in points] or [0])
    for name, step, value, style in (
        ("before", 0, before, {"color": "tab:gray", "marker": "o", "s": 60}),
        ("after", last, after, {"color": "tab:green", "marker": "*", "s": 160}),
    ):
        if value is not None:
            axis.scatter([step], [value], zorder=3, label=f"{eval_label} {name}: {value:.3f}", **style)
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_xlabel("training step")
    axis.set_ylabel("mean score")
    axis.set_title(title or "envkit train", fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(loc="best", fontsize=8)
    figure.tight_layout()
    return figure


def write_reward_curve(
    log_history: list[dict[str, Any]],
    output_dir: str | Path,
    *,
    before: float | None = None,
    after: float | None = None,
    title: str = "",
    eval_label: str = "held-out",
    log: Callable[[str], Any] = print,
) -> Path | None:
    """Plot the training mean score per logged step, the evaluations' during training (``--eval-strategy``), and the
    held-out mean score before and after training as markers, to ``OUTPUT_DIR/reward_curve.png`` with matplotlib's
    Agg backend. Without matplotlib, or with nothing to plot, logs one line and returns ``None``: the run itself never
    fails for its figure. ``eval_label`` names the markers in the legend ("held-out" only when no eval task was seen
    in training)."""
    try:
        import matplotlib.backends.backend_agg
        import matplotlib.figure
        import matplotlib.ticker  # noqa: F401
    except ImportError:
        log(f"{CURVE_FILE} not written: matplotlib is not installed (pip install matplotlib)")
        return None
    if not score_points(log_history)[1] and before is None and after is None:
        log(f"{CURVE_FILE} not written: no mean score was logged")
        return None
    path = Path(output_dir) / CURVE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    reward_curve_figure(log_history, before=before, after=after, title=title, eval_label=eval_label).savefig(str(path))
    return path
