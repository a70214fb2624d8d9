"""The five arms' training runs from a seed's warm start (GRPO, RFT, SFT to its plateau, compute-matched SFT; the
privileged arm is SFT to its plateau on other demonstrations), each at a given learning rate, saved under the run's
name (:func:`.search.run_name`) in the seed's folder."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envkit.util.options import as_flags

from .evaluation import evaluate
from .files import write_whole
from .search import run_name
from .training import (
    RESUME_FOLDER,
    discard_checkpoints,
    load,
    oracle_demos,
    save,
    sft_for_cpu,
    sft_keep_best,
)

if TYPE_CHECKING:
    from .seed import Seed


ELAPSED_FILE = "learning_rl_elapsed.json"
"""In each of GRPO's checkpoints: the wall-clock and CPU seconds the run had taken when it was saved (the
compute-matched SFT gets GRPO's CPU time, so a run resumed from a checkpoint adds what the cut one had spent)."""


def _checkpoints(out: Path) -> dict[int, Path]:
    """Trainer's ``checkpoint-N`` folders in ``out``, by step."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    prefix = f"{PREFIX_CHECKPOINT_DIR}-"
    found = {c.name.removeprefix(prefix): c for c in out.glob(f"{prefix}*")}
    return {int(step): folder for step, folder in found.items() if step.isdigit()}


def last_grpo_checkpoint(out: Path) -> Path | None:
    """The newest checkpoint in ``out`` whose :data:`ELAPSED_FILE` was written (a cut between a checkpoint and that
    file leaves the one before it, kept by ``--save-total-limit 2``)."""
    done = {step: folder for step, folder in _checkpoints(out).items() if (folder / ELAPSED_FILE).exists()}
    return done[max(done)] if done else None


def _elapsed_callback(out: Path, elapsed: Callable[[], dict[str, float]]) -> Any:
    """A TrainerCallback writing ``elapsed()`` into each checkpoint as it is saved (:data:`ELAPSED_FILE`)."""
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    class KeepElapsed(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            folder = out / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            if folder.is_dir():
                write_whole(folder / ELAPSED_FILE, json.dumps(elapsed()))

    return KeepElapsed()


def grpo(seed: Seed, learning_rate: float, callbacks: Sequence[Any] = ()) -> dict[str, Any]:
    """``envkit train`` (GRPO) from the warm start on the training condition. It saves a checkpoint every eighth of
    its steps, and a run cut midway goes on from the last one (CPU's resume ends with the uncut run's weights), its
    time added to the cut run's. ``callbacks``: more TrainerCallbacks (tests)."""
    from envkit.adapters.trl import train

    args = seed.args
    out = seed.dir / run_name("grpo", learning_rate)
    resume = last_grpo_checkpoint(out)
    before = json.loads((resume / ELAPSED_FILE).read_text()) if resume else {"seconds": 0.0, "cpu_seconds": 0.0}
    started, cpu = time.perf_counter(), time.process_time()

    def elapsed() -> dict[str, float]:
        return {
            "seconds": before["seconds"] + time.perf_counter() - started,
            "cpu_seconds": before["cpu_seconds"] + time.process_time() - cpu,
        }

    if resume is not None:
        seed.log(f"{out.name}: going on from {resume.name}")
    train.run(
        as_flags(
            env=seed.exp.spec,
            env_config=seed.exp.train,
            model=seed.dir / "warm",
            output_dir=out,
            no_lora=True,
            learning_rate=learning_rate,
            warmup_steps=0,
            max_steps=args.grpo_steps,
            per_device_train_batch_size=args.grpo_batch_size,
            gradient_checkpointing=False,
            num_iterations=1,
            rl_num_generations=args.num_generations,
            rl_max_new_tokens=args.max_new_tokens,
            max_turns=args.max_turns,
            max_completion_tokens=args.max_completion_tokens,
            rl_kl_coef=0.0,
            rl_top_k=0,
            eval_tasks=0,
            train_tasks=args.train_tasks,
            seed=seed.seed,
            disable_tqdm=True,
            logging_steps=1,
            save_strategy="steps",
            save_steps=max(1, args.grpo_steps // 8),
            save_total_limit=2,
            resume_from_checkpoint=resume,
        ),
        log=lambda _: None,
        callbacks=[_elapsed_callback(out, elapsed), *callbacks],
    )
    spent = elapsed()
    for checkpoint in _checkpoints(out).values():  # not kept: the run's weights are in OUT itself
        shutil.rmtree(checkpoint)
    history = json.loads((out / "log_history.json").read_text())
    # One optimizer step per batch of per-device-batch-size episodes (num_iterations 1, no accumulation).
    curve = [[e["step"] * args.grpo_batch_size, e["envkit/mean_score"]] for e in history if "envkit/mean_score" in e]
    seed.log(
        f"{out.name}: {args.grpo_steps} steps, {args.grpo_steps * args.grpo_batch_size} episodes, "
        f"{spent['seconds']:.0f}s"
    )
    return {"env_episodes": args.grpo_steps * args.grpo_batch_size, "curve": curve, **spent}


def rft(seed: Seed, learning_rate: float, env_episodes: int) -> dict[str, Any]:
    """``envkit rft`` from the warm start on the training condition, with ``env_episodes`` episodes in all. A run cut
    between rounds goes on from its last finished round (``resume=True``)."""
    from envkit.adapters.trl.rft import ROUNDS_FILE, RFTRound, rejection_sampling_fine_tune
    from envkit.backends import SamplingParams

    args = seed.args
    out = seed.dir / run_name("rft", learning_rate)
    if (out / ROUNDS_FILE).exists():  # finished, then cut before its record was written
        records = [RFTRound(**r) for r in json.loads((out / ROUNDS_FILE).read_text())]
    else:
        model, tokenizer = load(seed.dir / "warm")
        per_round = max(
            args.num_generations, env_episodes // args.rft_rounds // args.num_generations * args.num_generations
        )
        records = rejection_sampling_fine_tune(
            model,
            tokenizer,
            seed.exp.factory(seed.exp.train),
            seeds=seed.train_seeds,
            output_dir=str(out),
            rounds=args.rft_rounds,
            episodes_per_round=per_round,
            samples_per_task=args.num_generations,
            threshold=1.0,
            steps_per_round=args.rft_steps_per_round,
            learning_rate=learning_rate,
            batch_size=args.sft_batch_size,
            sampling=SamplingParams(temperature=1.0, top_k=None, max_new_tokens=args.max_new_tokens, seed=seed.seed),
            max_turns=args.max_turns,
            max_completion_tokens=args.max_completion_tokens,
            seed=seed.seed,
            log=lambda line: seed.log(f"{run_name('rft', learning_rate)}: {line}"),
            disable_tqdm=True,
            activation_checkpointing=False,
            resume=True,
        )
    return {
        "env_episodes": records[-1].env_episodes,
        "rounds": [r.__dict__ for r in records],
        "curve": [[r.env_episodes, r.mean_score] for r in records],
    }


def sft_plateau(seed: Seed, name: str, config: dict[str, Any], learning_rate: float) -> dict[str, Any]:
    """SFT from the warm start on oracle demonstrations of ``config`` until the validation score stops improving
    (``--patience`` evaluations, after at least ``--plateau-min-steps``) or ``--plateau-max-steps``; the best
    checkpoint is saved as ``NAME`` (the run's :func:`.search.run_name`). A run cut during it goes on from its last
    evaluation's checkpoint (in ``NAME/``:data:`.training.RESUME_FOLDER`)."""
    exp, args = seed.exp, seed.args
    model, tokenizer = load(seed.dir / "warm")
    demos = oracle_demos(exp.factory(config), tokenizer, seed.demo_seeds)
    validation = exp.factory(exp.train)
    val_seeds = seed.validation_seeds[: args.validation_tasks]

    def score() -> float:
        return evaluate(model, tokenizer, validation, val_seeds, 1, args, seed.seed + 3)["mean_score"]

    kept = sft_keep_best(
        model,
        tokenizer,
        demos,
        args,
        seed.seed,
        max_steps=args.plateau_max_steps,
        every=args.plateau_every,
        learning_rate=learning_rate,
        score=score,
        stop=lambda _, since_best: since_best >= args.patience,
        min_steps=args.plateau_min_steps,
        score_first=True,
        on_score=lambda steps, value: seed.log(f"{name}: {steps} SFT steps, validation {value:.3f}"),
        checkpoints=seed.dir / name / RESUME_FOLDER,
        on_resume=lambda steps: seed.log(f"{name}: going on from its checkpoint after {steps} SFT steps"),
    )
    save(model, tokenizer, seed.dir / name)
    discard_checkpoints(seed.dir / name)
    seed.log(f"{name}: best validation {kept.best:.3f} at step {kept.best_step} of {kept.steps}")
    return {
        "curve": kept.curve,
        "best_step": kept.best_step,
        "steps": kept.steps,
        "validation": kept.best,
        "demos": len(demos),
    }


def sft_compute(seed: Seed, learning_rate: float, grpo: dict[str, Any]) -> dict[str, Any]:
    """SFT from the warm start on the available demonstrations for the CPU time of ``grpo`` (the seed's GRPO run,
    at GRPO's learning rate, whose name the record keeps as ``matched_to``). A run cut midway goes on from its last
    checkpoint (every 100 steps, in ``NAME/``:data:`.training.RESUME_FOLDER`) with the CPU time it had left."""
    exp, args = seed.exp, seed.args
    model, tokenizer = load(seed.dir / "warm")
    demos = oracle_demos(exp.factory(exp.demo), tokenizer, seed.demo_seeds)
    cpu_seconds = grpo["cpu_seconds"]
    budget = cpu_seconds if args.baseline_seconds is None else min(cpu_seconds, args.baseline_seconds)
    name = run_name("sft_compute", learning_rate)
    steps = sft_for_cpu(
        model,
        tokenizer,
        demos,
        args,
        seed.seed,
        learning_rate=learning_rate,
        cpu_seconds=budget,
        checkpoints=seed.dir / name / RESUME_FOLDER,
        on_resume=lambda steps: seed.log(f"{name}: going on from its checkpoint after {steps} SFT steps"),
    )
    save(model, tokenizer, seed.dir / name)
    discard_checkpoints(seed.dir / name)
    seed.log(f"{name}: {steps} steps in {budget:.0f} CPU-s ({grpo['run']}'s)")
    return {"steps": steps, "cpu_budget": budget, "matched_to": grpo["run"]}
