"""The models: oracle demonstrations, the tiny tokenizer's corpus, ``envkit sft``'s masked SFT (by steps or CPU time,
with checkpoint selection, resumable from its last checkpoint), and saving and loading a model with its tokenizer."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import envkit

from .experiments import Experiment
from .files import write_whole

RESUME_FOLDER = "resume"
"""The subfolder of a run's folder where :func:`sft_keep_best` keeps its checkpoints while it runs (ignored by git: a
checkpoint with its optimizer is three times the model); :func:`discard_checkpoints` removes it."""
PARTS_FOLDER = "parts"
"""The subfolder of a seed's folder where a phase keeps its work in progress (:meth:`.seed.Seed.parts`; ignored by git:
it is only valid with the weights on this machine)."""
SELECTION_FILE = "selection.json"
""":func:`sft_keep_best`'s selection so far (its scores, the best, whether it had stopped), saved in each checkpoint."""
BEST_WEIGHTS_FILE = "best.pt"
"""The weights of the best score so far (``torch.save`` of the state dict), saved in each checkpoint."""
CPU_SPENT_FILE = "cpu_spent.json"
"""In each checkpoint of a run by CPU time (:func:`sft_for_cpu`): the CPU seconds of training spent when it was saved,
so a resumed run spends only what is left of the budget."""


def oracle_demos(factory: Callable[[], envkit.Env], tokenizer: Any, seeds: list[int]) -> list[Any]:
    """Token-exact oracle episodes of ``seeds`` (``envkit sft``'s demonstrations)."""
    from envkit.demos import oracle_episodes

    return oracle_episodes(factory, tokenizer, seeds)


def tokenizer_corpus(exp: Experiment, seeds: list[int]) -> list[str]:
    """Oracle episodes of the demonstration and training conditions as the chat template renders them (the
    tokenizer's corpus): the system prompt and tool schemas every sequence starts with become few tokens."""
    from envkit.models.tiny import ADDED_TOKENS, SPECIAL_TOKENS
    from envkit.testing import build_tokenizer

    renderer = build_tokenizer()  # only its chat template is used: the rendered text is what the real one must split
    corpus = []
    for config in (exp.demo, exp.train):
        for episode in oracle_demos(exp.factory(config), renderer, seeds):
            text = renderer.apply_chat_template(episode.messages, tools=episode.tools, tokenize=False)
            for token in (*SPECIAL_TOKENS, *ADDED_TOKENS):  # single tokens already: no merges spent on them
                text = text.replace(token, "\n")
            corpus.append(text)
    return corpus


def sft_steps(
    model: Any,
    tokenizer: Any,
    episodes: list[Any],
    steps: int,
    args: argparse.Namespace,
    seed: int,
    *,
    learning_rate: float,
    cpu_seconds: float | None = None,
    every: int | None = None,
    at_every: Callable[[int], bool] | None = None,
    warmup_steps: int = 0,
    decay: bool = False,
    checkpoints: Path | None = None,
    on_save: Callable[[Path, int], None] | None = None,
    resume_from: Path | None = None,
    clock: Callable[[], float] = time.process_time,
) -> int:
    """``steps`` optimizer steps (or ``cpu_seconds`` of this process's CPU time) of ``envkit sft``'s masked SFT
    (:func:`envkit.adapters.trl.sft.demonstrations_dataset`) at a constant learning rate, or with ``decay`` one
    falling along a cosine to 0 at ``steps`` (either after ``warmup_steps`` of linear warm-up); returns the steps
    run (counted from the first step, a resumed run's included).

    With ``every`` and ``at_every``, ``at_every(steps_so_far)`` runs after every ``every`` steps and after the last
    (the model in eval mode) and training stops when it returns True; one optimizer throughout. With
    ``checkpoints`` (and ``every``), TRL saves a checkpoint there after each ``at_every`` (weights, optimizer,
    schedule, random states, its place in the data; the latest two kept), then calls
    ``on_save(checkpoint_folder, steps)``; ``resume_from`` (one of those folders) goes on from there as if never
    stopped.

    With ``cpu_seconds``, each checkpoint also records the CPU seconds spent (:data:`CPU_SPENT_FILE`, read back by a
    run resumed from it, which spends only the rest). Writing checkpoints is not counted, so a run that saves them
    gets the same training time as one that does not. ``clock``: the CPU clock (tests give a counter)."""
    from transformers import TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    from envkit.adapters.trl.sft import demonstrations_dataset

    spent_before = 0.0
    if resume_from is not None and (resume_from / CPU_SPENT_FILE).exists():
        spent_before = json.loads((resume_from / CPU_SPENT_FILE).read_text())["cpu_seconds"]
    started = clock()

    class DeadlineAndCheckpoints(TrainerCallback):
        spent = spent_before
        step_ended = started
        not_training = 0.0  # the CPU of writing checkpoints

        def on_step_end(self, _args: Any, state: Any, control: Any, **_: Any) -> None:
            self.step_ended = clock()
            self.spent = spent_before + self.step_ended - started - self.not_training
            if cpu_seconds is not None and self.spent >= cpu_seconds:
                control.should_training_stop = True
            # The last step is scored too, so that the checkpoint TRL saves there holds its own score.
            last = state.global_step >= state.max_steps
            if every and at_every is not None and (state.global_step % every == 0 or last):
                model.eval()
                if at_every(state.global_step):
                    control.should_training_stop = True
                model.train()

        def on_save(self, args: Any, state: Any, control: Any, **_: Any) -> None:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if cpu_seconds is not None:
                write_whole(folder / CPU_SPENT_FILE, json.dumps({"cpu_seconds": self.spent}))
            if on_save is not None:
                on_save(folder, state.global_step)
            self.not_training += clock() - self.step_ended

    saving = checkpoints is not None and bool(every)
    with tempfile.TemporaryDirectory() if checkpoints is None else nullcontext(str(checkpoints)) as output_dir:
        trainer = SFTTrainer(
            model=model,
            args=SFTConfig(
                output_dir=output_dir,
                max_steps=steps,
                learning_rate=learning_rate,
                lr_scheduler_type="cosine" if decay else "constant_with_warmup" if warmup_steps else "constant",
                warmup_steps=warmup_steps,
                per_device_train_batch_size=args.sft_batch_size,
                save_strategy="steps" if saving else "no",
                save_steps=every if saving else 500,
                save_total_limit=2,  # a cut while the newest is written leaves the one before
                report_to="none",
                bf16=False,
                use_cpu=True,
                max_length=None,
                activation_checkpointing=False,  # a model this small fits; recomputing would cost ~30 % per step
                logging_steps=10**6,
                disable_tqdm=True,
                seed=seed,
            ),
            train_dataset=demonstrations_dataset(episodes),
            processing_class=tokenizer,
            callbacks=[DeadlineAndCheckpoints()],
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train(resume_from_checkpoint=str(resume_from) if resume_from is not None else None)
    model.eval()
    return int(trainer.state.global_step)


def sft_for_cpu(
    model: Any,
    tokenizer: Any,
    episodes: list[Any],
    args: argparse.Namespace,
    seed: int,
    *,
    learning_rate: float,
    cpu_seconds: float,
    checkpoints: Path | None = None,
    every: int = 100,
    on_resume: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.process_time,
) -> int:
    """:func:`sft_steps` at a constant ``learning_rate`` for ``cpu_seconds`` of training CPU time (the compute-matched
    SFT's budget); returns the steps run in all.

    With ``checkpoints`` (by convention the run folder's :data:`RESUME_FOLDER`) the run survives a cut: a checkpoint
    every ``every`` steps records the CPU spent, and a later call with the same arguments calls ``on_resume(steps)``
    and goes on from the newest with the rest of the budget, to the weights of a run never cut. Its step count differs
    as two runs' CPU clocks do, and by its second start-up (building the trainer and loading the checkpoint: seconds
    against a budget of about a thousand), which the budget counts as it counts the first. The caller removes the
    folder (:func:`discard_checkpoints`) once it has saved the model."""
    resume_from = latest_checkpoint(checkpoints, CPU_SPENT_FILE) if checkpoints is not None else None
    if resume_from is not None and on_resume is not None:
        on_resume(checkpoint_steps(resume_from))
    return sft_steps(
        model,
        tokenizer,
        episodes,
        10**6,
        args,
        seed,
        learning_rate=learning_rate,
        cpu_seconds=cpu_seconds,
        every=every if checkpoints is not None else None,
        checkpoints=checkpoints,
        resume_from=resume_from,
        clock=clock,
    )


@dataclass
class Selection:
    """What :func:`sft_keep_best` ran and kept."""

    steps: int
    """Optimizer steps run."""
    curve: list[list[float]]
    """``[steps, score]`` of every evaluation."""
    best_step: int
    """The steps of the checkpoint kept (the best score; the earliest of equals)."""
    best: float
    """Its score."""


def sft_keep_best(
    model: Any,
    tokenizer: Any,
    episodes: list[Any],
    args: argparse.Namespace,
    seed: int,
    *,
    max_steps: int,
    every: int,
    learning_rate: float,
    score: Callable[[], float],
    stop: Callable[[float, int], bool],
    min_steps: int = 0,
    score_first: bool = False,
    on_score: Callable[[int, float], None] | None = None,
    warmup_steps: int = 0,
    decay: bool = False,
    checkpoints: Path | None = None,
    on_resume: Callable[[int], None] | None = None,
) -> Selection:
    """:func:`sft_steps` with one optimizer, ``score()`` after every ``every`` steps and after the last (and, with
    ``score_first``, before the first); the best-scoring weights end up in ``model``. Training stops early when
    ``stop(score, evaluations_since_the_best)`` is True at an evaluation after ``min_steps`` or more steps (a dip
    that comes first, as SFT at a new learning rate often does, does not end it; the evaluations that do not beat the
    best still count, so one at ``min_steps`` can stop it).

    With ``checkpoints`` (by convention the run folder's :data:`RESUME_FOLDER`) the run survives a cut: each
    evaluation's checkpoint is saved there with the selection so far, and a later call with the same arguments finds
    the latest, calls ``on_resume(its_steps)``, and goes on from it (without training when the run had ended, e.g.
    cut during what its caller did next). The caller removes the folder (:func:`discard_checkpoints`) once it has
    saved what it keeps."""
    import torch

    curve: list[list[float]] = []
    best: tuple[float, int, dict[str, Any]] | None = None  # score, steps, weights
    since_best, stopped = 0, False
    resume_from = latest_checkpoint(checkpoints) if checkpoints is not None else None
    if resume_from is not None:
        saved = json.loads((resume_from / SELECTION_FILE).read_text())
        curve, since_best, stopped = saved["curve"], saved["since_best"], saved["stopped"]
        best = (saved["best"], saved["best_step"], torch.load(resume_from / BEST_WEIGHTS_FILE))
        if on_resume is not None:
            on_resume(saved["steps"])

    def checkpoint(steps: int) -> bool:
        nonlocal best, since_best, stopped
        value = score()
        curve.append([steps, value])
        if on_score is not None:
            on_score(steps, value)
        if best is None or value > best[0]:
            best, since_best = (value, steps, {k: v.detach().clone() for k, v in model.state_dict().items()}), 0
        else:
            since_best += 1
        stopped = steps >= min_steps and stop(value, since_best)
        return stopped

    def save_selection(folder: Path, steps: int) -> None:
        assert best is not None  # a checkpoint is saved only after an evaluation
        torch.save(best[2], folder / BEST_WEIGHTS_FILE)
        selection = {"steps": steps, "curve": curve, "best": best[0], "best_step": best[1]}
        selection |= {"since_best": since_best, "stopped": stopped}
        write_whole(folder / SELECTION_FILE, json.dumps(selection))  # last: the file marks the checkpoint complete

    if score_first and resume_from is None:
        checkpoint(0)
    if resume_from is not None and (stopped or saved["steps"] >= max_steps):
        steps = saved["steps"]
    else:
        steps = sft_steps(
            model,
            tokenizer,
            episodes,
            max_steps,
            args,
            seed,
            learning_rate=learning_rate,
            every=every,
            at_every=checkpoint,
            warmup_steps=warmup_steps,
            decay=decay,
            checkpoints=checkpoints,
            on_save=save_selection,
            resume_from=resume_from,
        )
    assert best is not None and curve[-1][0] == steps  # sft_steps scores the last step too
    model.load_state_dict(best[2])
    model.eval()
    return Selection(steps=steps, curve=curve, best_step=best[1], best=best[0])


def latest_checkpoint(folder: Path, marker: str = SELECTION_FILE) -> Path | None:
    """The checkpoint in ``folder`` with the most steps whose ``marker`` file was saved with it (written last: a cut
    while a checkpoint was written leaves it without): :data:`SELECTION_FILE` for :func:`sft_keep_best`'s,
    :data:`CPU_SPENT_FILE` for :func:`sft_for_cpu`'s. None when there is none."""
    complete = [c for c in folder.glob("checkpoint-*") if (c / marker).exists()]
    return max(complete, key=checkpoint_steps, default=None)


def checkpoint_steps(checkpoint: Path) -> int:
    """The steps a ``checkpoint-N`` folder was saved after."""
    return int(checkpoint.name.removeprefix("checkpoint-"))


def discard_checkpoints(run_folder: Path) -> None:
    """Remove a run's :data:`RESUME_FOLDER` (its checkpoints), once what the run keeps is saved."""
    shutil.rmtree(run_folder / RESUME_FOLDER, ignore_errors=True)


def load(path: Path) -> tuple[Any, Any]:
    """A saved model and its tokenizer (fp32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32), AutoTokenizer.from_pretrained(
        str(path)
    )


def save(model: Any, tokenizer: Any, path: Path) -> None:
    """Save a model and its tokenizer."""
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
