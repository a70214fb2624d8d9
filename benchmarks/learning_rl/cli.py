"""The command line: the flags, ``--quick``'s sizes, the check that a resumed run keeps its experiment's settings, and
:func:`main`, which runs the seeds and the report (``python -m benchmarks.learning_rl``)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from . import __doc__ as PACKAGE_DOC
from .carry import in_progress
from .experiments import ARMS, EXPERIMENT_KEY, EXPERIMENTS, MATCHED_TO_GRPO, Experiment, canaries, definition
from .files import write_whole
from .report import report
from .seed import Seed

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "learning_rl_runs"
"""``--out``'s default: ``benchmarks/learning_rl_runs``, whose records (settings, canaries, finished seeds, logs,
warm-start attempts, each finished phase of a seed) and warm-start weights git keeps (not arms' weights), so that a run
goes on from a fresh clone; it keeps those of a pilot's ``benchmarks/learning_rl_runs_NAME`` too."""


def parser() -> argparse.ArgumentParser:
    """The command line (``--quick`` shrinks every size for a smoke test)."""
    p = argparse.ArgumentParser(description=PACKAGE_DOC.splitlines()[0])
    p.add_argument("--experiments", nargs="+", default=list(EXPERIMENTS), choices=list(EXPERIMENTS))
    p.add_argument("--seeds", type=int, default=5, help="independent seeds per experiment (each its own warm start)")
    p.add_argument("--seed-offset", type=int, default=0)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results folder (default benchmarks/learning_rl_runs; git keeps the records there and in a pilot's "
        "benchmarks/learning_rl_runs_NAME)",
    )
    p.add_argument("--report", action="store_true", help="aggregate the finished seeds; run nothing")
    p.add_argument(
        "--in-progress",
        action="store_true",
        help="print the newest checkpoint of each run cut midway under --out, one per line (for `git add -f`, to go "
        "on from them on another clone); run nothing",
    )
    p.add_argument("--quick", action="store_true", help="a few steps on a few tasks: the pipeline end to end")
    p.add_argument("--demos", type=int, default=4000, help="oracle demonstrations (task seeds 0 … N-1)")
    p.add_argument("--train-tasks", type=int, default=4000, help="GRPO/RFT training task seeds 0 … N-1")
    p.add_argument("--validation-tasks", type=int, default=64)
    p.add_argument("--eval-tasks", type=int, default=64, help="held-out tasks per condition")
    p.add_argument("--eval-samples", type=int, default=2, help="episodes per held-out task")
    p.add_argument("--pass-k-tasks", type=int, default=16)
    p.add_argument("--pass-k-samples", type=int, default=64, help="samples per task of the pass@k curves (k ≤ this)")
    p.add_argument("--probe-tasks", type=int, default=64)
    p.add_argument("--probe-threshold", type=float, default=0.5, help="the warm start's probe must reach this")
    p.add_argument("--warm-chunk", type=int, default=150, help="warm-start SFT steps between probes")
    p.add_argument("--warm-max-steps", type=int, default=2100, help="the warm start's cap")
    p.add_argument("--warm-learning-rate", type=float, default=3e-3)
    p.add_argument("--warm-warmup-steps", type=int, default=20, help="the warm start's linear learning-rate warm-up")
    p.add_argument(
        "--warm-schedule",
        choices=["cosine", "constant"],
        default="cosine",
        help="the warm start's learning rate after its warm-up: a cosine to 0 at --warm-max-steps, or constant",
    )
    p.add_argument(
        "--warm-attempts",
        type=int,
        default=5,
        help="initialisations tried: a fresh one when a warm start fails the pilot gate (--ignore-gate: its probe)",
    )
    p.add_argument(
        "--gate", type=float, default=0.02, help="the pilot gate: warm start's solve rate on the hard condition"
    )
    p.add_argument("--gate-tasks", type=int, default=64)
    p.add_argument("--gate-samples", type=int, default=8, help="episodes per gate task (64 × 8: a 2 % rate is 10)")
    p.add_argument("--ignore-gate", action="store_true", help="run the arms even when the pilot gate fails")
    p.add_argument(
        "--arms",
        nargs="+",
        default=list(ARMS),
        choices=list(ARMS),
        help="run only these arms (a pilot); the seed's JSON is written once every arm has run",
    )
    p.add_argument("--grpo-steps", type=int, default=80)
    p.add_argument("--grpo-batch-size", type=int, default=32, help="episodes per GRPO step")
    p.add_argument("--num-generations", type=int, default=8, help="GRPO's group size; RFT's samples per task")
    p.add_argument("--rft-rounds", type=int, default=8)
    p.add_argument("--rft-steps-per-round", type=int, default=40)
    p.add_argument(
        "--learning-rates",
        type=float,
        nargs="+",
        default=[1e-4, 5e-4],
        help="every arm's learning-rate grid (the same search budget for each; constant rates): on --search-seed each "
        "arm runs at every rate and keeps the one its validation score is best at (OUT/EXP/search.json); the other "
        "seeds run each arm at its kept rate",
    )
    p.add_argument(
        "--search-seed", type=int, default=0, help="the seed whose validation scores choose each arm's learning rate"
    )
    p.add_argument("--sft-batch-size", type=int, default=16)
    p.add_argument("--plateau-every", type=int, default=150, help="SFT steps between validation evaluations")
    p.add_argument("--patience", type=int, default=2, help="evaluations without improvement that end SFT")
    p.add_argument(
        "--plateau-min-steps",
        type=int,
        default=1200,
        help="SFT to its plateau runs at least this many steps before its patience can end it (validation on "
        "--validation-tasks is noisy, and SFT at a new rate often dips first: a patience spent on those is no plateau)",
    )
    p.add_argument(
        "--plateau-max-steps", type=int, default=3000, help="SFT to its plateau stops here if its patience has not"
    )
    p.add_argument("--baseline-seconds", type=float, default=None, help="cap the compute-matched SFT's CPU time")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--max-completion-tokens", type=int, default=512)
    p.add_argument("--eval-concurrency", type=int, default=64)
    p.add_argument("--vocab-size", type=int, default=2048, help="the tiny tokenizer's BPE vocabulary (at most)")
    p.add_argument(
        "--pretrain-steps",
        type=int,
        default=0,
        help="steps of synthetic copying-and-recall pretraining of each initialisation before its warm start "
        "(benchmarks/learning_rl/pretraining.py)",
    )
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--num-heads", type=int, default=4)
    p.add_argument("--bootstrap-reps", type=int, default=2000)
    return p


QUICK = {
    "seeds": 1,
    "demos": 8,
    "train_tasks": 16,
    "validation_tasks": 2,
    "eval_tasks": 2,
    "eval_samples": 1,
    "pass_k_tasks": 2,
    "pass_k_samples": 4,
    "probe_tasks": 2,
    "probe_threshold": 0.0,
    "warm_chunk": 2,
    "warm_max_steps": 2,
    "gate": 0.0,
    "gate_tasks": 2,
    "gate_samples": 1,
    "grpo_steps": 2,
    "grpo_batch_size": 4,
    "num_generations": 2,
    "rft_rounds": 2,
    "rft_steps_per_round": 1,
    "sft_batch_size": 4,
    "plateau_every": 1,
    "patience": 1,
    "plateau_min_steps": 0,
    "plateau_max_steps": 2,
    "baseline_seconds": 1.0,
    "max_new_tokens": 8,
    "max_turns": 3,
    "max_completion_tokens": 64,
    "bootstrap_reps": 50,
}
"""``--quick``: every size shrunk so the whole pipeline runs in a few minutes (figures meaningless; the gates let
everything through)."""


RESUMABLE_WITH_OTHER = ("experiments", "seeds", "seed_offset", "out", "report", "in_progress", "arms", "search_seed")
"""Flags a resumed run may change: which experiments, seeds and arms it runs, not how (which seed searched is bound
by the experiment's ``search.json``, not by its settings: a gated search seed leaves the choice to another)."""


SHAPING_PACKAGES = ("torch", "transformers", "trl", "tokenizers", "accelerate")
"""The packages whose version is part of a run's protocol: an upgrade of one can change what the same seed trains.
(A's seed 0 warm start, the same code and init seed on another machine with transformers 5.24.0 where 5.23.0 had
been installed before, never passed the probe it had passed after 1,350 steps.)"""

VERSION_KEY = "version:"
"""The prefix of a package version's key in ``args.json``."""


def versions() -> dict[str, str]:
    """The installed versions of :data:`SHAPING_PACKAGES`, as ``args.json`` records them."""
    return {f"{VERSION_KEY}{name}": metadata.version(name) for name in SHAPING_PACKAGES}


def same_protocol(path: Path, args: argparse.Namespace, exp: Experiment) -> None:
    """Record an experiment's settings in ``path``: the flags, the experiment's own definition (its env configs,
    fields of :class:`.experiments.Experiment` but its name and title) and the versions of the packages that shape a
    run (:data:`SHAPING_PACKAGES`); exit with one line when an earlier run there used other ones (a resumed run that
    changed a setting would mix two protocols in one experiment's seeds). A setting one record has and the other
    lacks is a difference too (a flag added or removed since the earlier run)."""
    flags = {k: v for k, v in vars(args).items() if k not in RESUMABLE_WITH_OTHER}
    settings = {**json.loads(json.dumps(flags, default=str)), **definition(exp), **versions()}
    if path.exists():
        before = json.loads(path.read_text())
        absent = object()
        changed = [k for k in dict.fromkeys([*settings, *before]) if before.get(k, absent) != settings.get(k, absent)]
        if changed:
            was = ", ".join(f"{_named(k)} {_shown(before, k)} (now {_shown(settings, k)})" for k in changed)
            versions_were = [k for k in changed if k.startswith(VERSION_KEY) and k in before]
            install = " ".join(f"{k.removeprefix(VERSION_KEY)}=={before[k]}" for k in versions_were)
            fix = f" (pip install {install})" if install else ""
            raise SystemExit(
                f"error: {path.parent} was run with {was}: resume with the same settings{fix}, or start anew with "
                "another --out"
            )
    write_whole(path, json.dumps(settings, indent=1))


def _named(key: str) -> str:
    """A recorded setting's name as :func:`same_protocol`'s message shows it: its flag, or the experiment's field."""
    if key.startswith(EXPERIMENT_KEY):
        return f"the experiment's {key.removeprefix(EXPERIMENT_KEY)}"
    if key.startswith(VERSION_KEY):
        return key.removeprefix(VERSION_KEY)
    return f"--{key.replace('_', '-')}"


def _shown(settings: dict[str, Any], key: str) -> str:
    """A recorded setting as :func:`same_protocol`'s message shows it: its repr, or ``absent``."""
    return repr(settings[key]) if key in settings else "absent"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run (or, with ``--report``, aggregate) the experiments; returns the report's summary (with ``--in-progress``,
    print the checkpoints of runs cut midway and return ``{}``)."""
    args = parser().parse_args(argv)
    if args.quick:
        defaults = parser().parse_args([])
        for key, value in QUICK.items():
            if getattr(args, key) == getattr(defaults, key):
                setattr(args, key, value)
    if set(MATCHED_TO_GRPO) & set(args.arms) and "grpo" not in args.arms:
        raise SystemExit(f"error: --arms {' and '.join(MATCHED_TO_GRPO)} are matched to GRPO's run: add grpo to --arms")
    out = args.out or (Path(tempfile.mkdtemp(prefix="envkit-learning-rl-")) if args.quick else DEFAULT_OUT)
    if args.in_progress:
        for checkpoint in in_progress(out):
            print(checkpoint)
        return {}
    out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for name in args.experiments:
            exp = EXPERIMENTS[name]
            (out / name).mkdir(exist_ok=True)
            same_protocol(out / name / "args.json", args, exp)
            if not (out / name / "canaries.json").exists():
                write_whole(out / name / "canaries.json", json.dumps(canaries(exp), indent=1))
            for seed in range(args.seed_offset, args.seed_offset + args.seeds):
                path = out / name / f"seed-{seed}.json"
                with claimed(out / name / f"seed-{seed}") as holder:
                    if holder is not None:
                        who = f"process {holder}" if holder > 0 else "another process"
                        print(f"[{name} seed {seed}] {who} is running it: skipped", flush=True)
                        continue
                    if path.exists():
                        print(f"[{name} seed {seed}] finished earlier: {path}", flush=True)
                        continue
                    result = Seed(exp, seed, args, out).run()
                    if result.get("partial"):
                        print(
                            f"[{name} seed {seed}] --arms {' '.join(args.arms)} done; {path.name} waits for the rest",
                            flush=True,
                        )
                        continue
                    write_whole(path, json.dumps(result, indent=1, default=str))
                    print(f"[{name} seed {seed}] written: {path}", flush=True)
    return report(out, args)


CLAIM_FILE = ".running"
"""In a seed's folder while a process runs that seed: its ``flock`` and that process's id (git ignores it)."""


@contextlib.contextmanager
def claimed(seed_dir: Path) -> Iterator[int | None]:
    """Claim the seed in ``seed_dir`` for this process while the block runs, whatever arms it runs; yields ``None``
    when claimed, or the id of the process that holds it. Two runs on one output folder (to use more cores: one per
    seed) then never work on one seed at once, which would train its shared phases twice and mix their checkpoints
    and records. The kernel drops the claim when its holder exits, however it ends."""
    import fcntl

    seed_dir.mkdir(parents=True, exist_ok=True)
    with open(seed_dir / CLAIM_FILE, "a+") as claim:
        try:
            fcntl.flock(claim, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            claim.seek(0)
            holder = claim.read().strip()
            yield int(holder) if holder.isdigit() else -1
            return
        claim.truncate(0)
        claim.write(str(os.getpid()))
        claim.flush()
        try:
            yield None
        finally:
            claim.truncate(0)
            fcntl.flock(claim, fcntl.LOCK_UN)
