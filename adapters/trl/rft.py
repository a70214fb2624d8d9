"""Rejection-sampling fine-tuning (RFT, also called expert iteration or RAFT): sample, keep the good, fine-tune.

Each round samples episodes of an env with the rollout engine, keeps those that scored at least a threshold (and did
not fail), and fine-tunes the model on them token-exactly, with the same masked SFT ``envkit sft`` runs
(:func:`envkit.adapters.trl.sft.demonstrations_dataset`: the env's tokens are masked out of the loss, the model's own
tokens are learned exactly as it sampled them). The next round samples from the fine-tuned model. Where a model
already solves a task now and then, this is the baseline RL is measured against (and a warm start for it); it needs no
oracle. ``envkit rft ENV --model PATH --output-dir DIR --rounds 4 --episodes-per-round 64 --threshold 1`` runs it.

A run cut between rounds goes on from its last finished round with ``resume=True`` (``envkit rft --resume``): each
round's model, records and kept episodes go to :data:`CHECKPOINT_FOLDER` in the output folder, and the rounds left
play as the uncut run would have played them.

Sampling goes through any backend: by default the model being trained samples itself (on-policy, through
:class:`~envkit.backends.TransformersBackend`); ``backend_factory`` swaps in another one, e.g. a served teacher.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envkit.adapters.trl.metrics import ErrorRateExceeded, check_error_rate
from envkit.backends import SamplingParams
from envkit.core.env import Env
from envkit.models.loading import check_saved_tokenizer
from envkit.rollout import Episode, RolloutEngine

ROUNDS_FILE = "rft_rounds.json"
"""The per-round record (:class:`RFTRound` as JSON) written beside the saved model."""

CHECKPOINT_FOLDER = "rft-checkpoint"
"""In the output folder: the model, records and kept episodes after the last finished round (what ``resume=True``
goes on from); removed once every round has run."""


@dataclass
class RFTRound:
    """What one round of rejection-sampling fine-tuning did."""

    round: int
    """1-based."""
    episodes: int
    """Episodes sampled this round."""
    env_episodes: int
    """Episodes sampled so far, this round's included: the x axis of a learning curve against env interaction."""
    mean_score: float
    """Mean score of this round's sampled episodes (before this round's fine-tuning)."""
    kept: int
    """Episodes kept this round (score at least the threshold, no error)."""
    trained_on: int
    """Episodes the round fine-tuned on (``kept``, or every kept episode so far with ``accumulate``)."""
    steps: int
    """Optimizer steps run (0 when nothing was kept)."""
    loss: float | None
    """TRL's mean training loss of the round (None when it did not train)."""
    failed: int = 0
    """Episodes of this round that ended with an error (the env raised or timed out, generation failed): never kept,
    and counted 0 in ``mean_score``."""


class RFTConfigError(ValueError):
    """A rejection-sampling fine-tuning setting that cannot work (the message names the setting and the fix)."""


def round_tasks(seeds: Sequence[int], round_index: int, tasks_per_round: int) -> list[int]:
    """The task seeds of round ``round_index`` (0-based): the next ``tasks_per_round`` of ``seeds``, cycling, so
    successive rounds see new tasks until the list runs out."""
    start = round_index * tasks_per_round
    return [seeds[(start + i) % len(seeds)] for i in range(tasks_per_round)]


def keep(episodes: Sequence[Episode], threshold: float) -> list[Episode]:
    """The episodes worth imitating: scored at least ``threshold``, ended without an error, with model tokens."""
    return [e for e in episodes if e.error is None and e.score >= threshold and any(e.env_mask)]


def check_settings(
    *,
    seeds: Sequence[int],
    rounds: int,
    episodes_per_round: int,
    samples_per_task: int,
    steps_per_round: int,
    threshold: float = 1.0,
    learning_rate: float = 5e-4,
    batch_size: int = 8,
    seed: int = 0,
) -> None:
    """Raise :class:`RFTConfigError` (one line naming the fix) for settings that cannot run, or that would run without
    fine-tuning on anything (a threshold above 1, the top score). ``seed`` seeds round ``i``'s training with
    ``seed + i``, which must stay within numpy's seeds (0 to 2**32 - 1)."""
    if rounds < 1:
        raise RFTConfigError(f"rounds must be at least 1, got {rounds}")
    if samples_per_task < 1:
        raise RFTConfigError(f"samples per task must be at least 1, got {samples_per_task}")
    if episodes_per_round < samples_per_task or episodes_per_round % samples_per_task:
        raise RFTConfigError(
            f"episodes per round ({episodes_per_round}) must be a positive multiple of the samples per task "
            f"({samples_per_task}): each task is sampled that many times"
        )
    if steps_per_round < 1:
        raise RFTConfigError(f"steps per round must be at least 1, got {steps_per_round}")
    if not seeds:
        raise RFTConfigError("no task seeds to sample: give at least one")
    if math.isnan(threshold):
        raise RFTConfigError("threshold is NaN: give a score in [0, 1] (1.0 keeps solved episodes)")
    if threshold > 1.0:
        raise RFTConfigError(f"threshold {threshold:g} keeps nothing: scores are in [0, 1] (1.0 keeps solved episodes)")
    if not 0 < learning_rate < math.inf:  # inf trained to NaN weights and saved them
        raise RFTConfigError(f"learning rate must be a finite number above 0, got {learning_rate:g}")
    if batch_size < 1:
        raise RFTConfigError(f"batch size must be at least 1, got {batch_size}")
    if not 0 <= seed <= 2**32 - rounds:  # past it, the last rounds' training raised after a whole sampling round
        raise RFTConfigError(
            f"seed must be 0 to {2**32 - rounds} ({rounds} rounds train with seed + round), got {seed}"
        )


def rejection_sampling_fine_tune(
    model: Any,
    tokenizer: Any,
    env_factory: Callable[[], Env],
    *,
    seeds: Sequence[int],
    output_dir: str,
    rounds: int = 4,
    episodes_per_round: int = 64,
    samples_per_task: int = 4,
    threshold: float = 1.0,
    steps_per_round: int = 50,
    learning_rate: float = 5e-4,
    batch_size: int = 8,
    accumulate: bool = False,
    sampling: SamplingParams | None = None,
    max_turns: int | None = None,
    max_completion_tokens: int | None = None,
    backend_factory: Callable[[Any], Any] | None = None,
    seed: int = 0,
    save: bool = True,
    progress: bool = False,
    log: Callable[[str], None] = print,
    on_round: Callable[[RFTRound, Any], None] | None = None,
    resume: bool = False,
    max_error_rate: float | None = 0.5,
    **sft_args: Any,
) -> list[RFTRound]:
    """Fine-tune ``model`` in place by ``rounds`` rounds of rejection sampling; return the rounds' records.

    Args:
        model: A causal LM (transformers), trained in place.
        tokenizer: Its tokenizer (the chat template renders prompts and env messages).
        env_factory: ``env_factory()`` returns a fresh env (one per episode).
        seeds: Task seeds to sample from; each round takes the next ``episodes_per_round // samples_per_task`` of
            them (cycling).
        output_dir: Where TRL writes and, with ``save``, the model, tokenizer and ``rft_rounds.json`` go.
        rounds: Sample-filter-fine-tune rounds.
        episodes_per_round: Episodes sampled per round (the env interaction a round costs).
        samples_per_task: Episodes per task seed within a round.
        threshold: An episode is kept when its score is at least this.
        steps_per_round: Optimizer steps on the kept episodes per round.
        learning_rate: AdamW learning rate (constant; a fresh optimizer each round).
        batch_size: Sequences per optimizer step (at most the kept count).
        accumulate: Fine-tune on every episode kept so far (expert iteration's growing buffer) instead of only this
            round's (RAFT).
        sampling: Sampling parameters of every turn (default: temperature 1, no top-k, 128 new tokens); its ``seed``
            (default ``seed``) is varied per round.
        max_turns: Assistant turns per episode (default: the env's).
        max_completion_tokens: Cap on one episode's completion tokens (as ``envkit train``'s flag).
        backend_factory: ``backend_factory(model)`` returns the backend a round samples with (default: the model
            itself through :class:`~envkit.backends.TransformersBackend`, on-policy).
        seed: Seeds sampling and training.
        save: Save the model, tokenizer and ``rft_rounds.json`` to ``output_dir`` and check the saved tokenizer
            (as ``envkit sft`` does).
        progress: Show the rollout engine's progress bar while sampling (TRL's own bar shows training unless
            ``disable_tqdm`` is passed).
        log: Called with one line per round.
        on_round: Called with each round's record and the model after the round's fine-tuning (e.g. to evaluate).
        resume: Go on from the last round finished in ``output_dir`` (its :data:`CHECKPOINT_FOLDER`, which ``save``
            writes after every round): ``model`` takes that round's weights and the rounds left run with the uncut
            run's task seeds, sampling seeds and training seeds. Every argument above except ``model``,
            ``env_factory``, ``backend_factory``, ``progress``, ``log`` and ``on_round`` must be the cut run's (the
            tokenizer's vocabulary is compared too); ``env_factory`` must build the same env. Without a checkpoint
            there, the run starts at round 1.
        max_error_rate: Stop (:class:`~envkit.adapters.trl.ErrorRateExceeded`, naming the round and the first error)
            when more than this fraction of a round's episodes failed, as ``envkit train`` stops; ``None``: never.
        **sft_args: Further fields of TRL's ``SFTConfig``.

    Raises:
        RFTConfigError: For settings that cannot run, ``resume`` without ``save``, or a checkpoint saved with other
            settings.
    """
    from envkit.backends import TransformersBackend

    check_settings(
        seeds=seeds,
        rounds=rounds,
        episodes_per_round=episodes_per_round,
        samples_per_task=samples_per_task,
        steps_per_round=steps_per_round,
        threshold=threshold,
        learning_rate=learning_rate,
        batch_size=batch_size,
        seed=seed,
    )
    if resume and not save:
        raise RFTConfigError("resume goes on from the checkpoints that save writes: it needs save=True")
    if max_error_rate is not None and not 0.0 <= max_error_rate <= 1.0:
        raise RFTConfigError(f"max_error_rate must be between 0 and 1 (or None: never stop), got {max_error_rate}")
    sampling = sampling or SamplingParams(temperature=1.0, top_k=None, max_new_tokens=128)
    base_seed = sampling.seed if sampling.seed is not None else seed
    tasks_per_round = episodes_per_round // samples_per_task
    settings = {
        "seeds": [int(s) for s in seeds],
        "rounds": rounds,
        "episodes_per_round": episodes_per_round,
        "samples_per_task": samples_per_task,
        "threshold": threshold,
        "steps_per_round": steps_per_round,
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "accumulate": accumulate,
        "sampling": asdict(sampling),
        "max_turns": max_turns,
        "max_completion_tokens": max_completion_tokens,
        "seed": seed,
        "sft_args": sft_args,
        "tokenizer": _vocabulary_digest(tokenizer),
    }
    # As JSON now (what the checkpoint holds): a setting JSON cannot hold fails before round 1, not after it.
    settings = json.loads(json.dumps(settings, default=repr))
    checkpoint = Path(output_dir, CHECKPOINT_FOLDER)
    records: list[RFTRound] = []
    buffer: list[Episode] = []
    if resume:
        records, buffer = _resume(checkpoint, settings, model, log)
    sampled = records[-1].env_episodes if records else 0
    for index in range(len(records), rounds):
        model.eval()
        backend = backend_factory(model) if backend_factory is not None else TransformersBackend(model, tokenizer)
        engine = RolloutEngine(
            env_factory,
            backend,
            tokenizer,
            max_turns=max_turns,
            max_completion_tokens=max_completion_tokens,
            progress=progress,
        )
        round_sampling = SamplingParams(**{**asdict(sampling), "seed": base_seed * 1_000_003 + index})
        try:
            episodes = engine.run(round_tasks(seeds, index, tasks_per_round), samples_per_task, round_sampling)
        finally:
            engine.close()
        try:
            check_error_rate(episodes, max_error_rate)
        except ErrorRateExceeded as error:
            raise ErrorRateExceeded(f"rft round {index + 1}: {error}") from None
        sampled += len(episodes)
        kept = keep(episodes, threshold)
        buffer = [*buffer, *kept] if accumulate else kept
        steps, loss = 0, None
        if buffer:
            steps, loss = _fine_tune(
                model,
                tokenizer,
                buffer,
                output_dir,
                steps=steps_per_round,
                learning_rate=learning_rate,
                batch_size=batch_size,
                seed=seed + index,
                **dict(sft_args),
            )
        record = RFTRound(
            round=index + 1,
            episodes=len(episodes),
            env_episodes=sampled,
            mean_score=sum(e.score for e in episodes) / len(episodes),
            kept=len(kept),
            trained_on=len(buffer),
            steps=steps,
            loss=loss,
            failed=sum(e.error is not None for e in episodes),
        )
        records.append(record)
        if save:
            _save_checkpoint(checkpoint, settings, model, records, buffer)
        trained = f"{steps} steps on {len(buffer)}, loss {loss:.4f}" if loss is not None else "nothing to learn"
        failures = f" ({record.failed} failed, counted 0)" if record.failed else ""
        log(
            f"rft round {record.round}/{rounds}: {record.episodes} episodes{failures}, mean score "
            f"{record.mean_score:.3f}, kept {record.kept} (score >= {threshold:g}); {trained}"
        )
        if on_round is not None:
            on_round(record, model)
    model.eval()
    if save:
        model.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
        Path(output_dir, ROUNDS_FILE).write_text(json.dumps([asdict(r) for r in records], indent=1))
        sample = _sample_text(buffer)
        if sample:  # as envkit sft: the saved tokenizer must give the ids the model was trained on
            check_saved_tokenizer(tokenizer, output_dir, sample)
        shutil.rmtree(checkpoint, ignore_errors=True)
    return records


def resume_point(output_dir: str) -> int:
    """The rounds a cut run in ``output_dir`` finished (its :data:`CHECKPOINT_FOLDER`'s), 0 when there is no checkpoint;
    what ``resume=True`` goes on from, read without loading anything.

    Raises:
        RFTConfigError: ``output_dir`` holds a finished run (nothing to resume).
    """
    state = Path(output_dir, CHECKPOINT_FOLDER, "state.json")
    if state.exists():
        return len(json.loads(state.read_text(encoding="utf-8"))["records"])
    if Path(output_dir, ROUNDS_FILE).exists():
        raise RFTConfigError(f"{output_dir} holds a finished run: nothing to resume (use another output folder)")
    return 0


def _vocabulary_digest(tokenizer: Any) -> str:
    """A digest of the tokenizer's vocabulary and special tokens: a checkpoint's kept episodes are token ids, which
    only the run's own tokenizer reads back."""
    import hashlib

    vocabulary = sorted(tokenizer.get_vocab().items())
    special = sorted(map(str, getattr(tokenizer, "all_special_tokens", [])))
    return hashlib.sha256(json.dumps([vocabulary, special]).encode()).hexdigest()


def _save_checkpoint(
    folder: Path, settings: dict[str, Any], model: Any, records: list[RFTRound], buffer: list[Episode]
) -> None:
    """Write the state after ``records[-1]``'s round to ``folder``: its weights and kept episodes under names of
    their own, then ``state.json`` naming them (replaced in one step), then the previous round's files go; a cut at
    any point leaves a complete checkpoint. Each file reaches the disk before the next step relies on it
    (``fsync``), so a machine stopped outright (a preempted VM loses what only its page cache held) leaves one too."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    done = records[-1].round
    weights, episodes = f"weights-round-{done}.pt", f"episodes-round-{done}.jsonl"
    torch.save({name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}, folder / weights)
    (folder / episodes).write_text("".join(episode.to_json() + "\n" for episode in buffer), encoding="utf-8")
    state = {"settings": settings, "records": [asdict(r) for r in records], "weights": weights, "episodes": episodes}
    temporary = folder / "state.json.tmp"
    temporary.write_text(json.dumps(state), encoding="utf-8")
    for path in (folder / weights, folder / episodes, temporary):
        _sync(path)
    os.replace(temporary, folder / "state.json")
    _sync(folder)  # the rename itself
    for path in folder.iterdir():
        if path.name not in ("state.json", weights, episodes):
            path.unlink()


def _sync(path: Path) -> None:
    """Flush ``path`` (a file, or a folder's entries) to the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _resume(
    folder: Path, settings: dict[str, Any], model: Any, log: Callable[[str], None]
) -> tuple[list[RFTRound], list[Episode]]:
    """The records and kept episodes of the checkpoint in ``folder``, its weights loaded into ``model``; nothing
    (and a line saying so) when there is none. Raises :class:`RFTConfigError` when it was saved with other settings,
    or the output folder holds a finished run."""
    import torch

    if not resume_point(str(folder.parent)):
        log(f"rft: no checkpoint in {folder}: starting at round 1")
        return [], []
    state = json.loads((folder / "state.json").read_text(encoding="utf-8"))
    changed = sorted(key for key in settings if state["settings"].get(key) != settings[key])
    if changed:
        raise RFTConfigError(
            f"the checkpoint in {folder} was saved with other settings ({', '.join(changed)}): resume with the run's "
            "own settings, or start afresh in another output folder"
        )
    try:
        model.load_state_dict(torch.load(folder / state["weights"], map_location="cpu"))
    except RuntimeError as error:  # another architecture or size: load_state_dict lists every tensor
        first = str(error).strip().splitlines()[0]
        raise RFTConfigError(f"the checkpoint in {folder} holds another model's weights ({first})") from None
    lines = (folder / state["episodes"]).read_text(encoding="utf-8").splitlines()
    records = [RFTRound(**record) for record in state["records"]]
    log(f"rft: going on from {folder} after round {records[-1].round}")
    return records, [Episode(**json.loads(line)) for line in lines]


def _sample_text(episodes: Sequence[Episode]) -> str:
    """Raw message text of a kept episode (what the saved tokenizer is checked on)."""
    for episode in episodes:
        text = "\n".join(str(m.get("content") or "") for m in episode.messages)
        if text.strip():
            return text
    return ""


def _fine_tune(
    model: Any,
    tokenizer: Any,
    episodes: list[Episode],
    output_dir: str,
    *,
    steps: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    **sft_args: Any,
) -> tuple[int, float]:
    """``steps`` optimizer steps of ``envkit sft``'s masked SFT on ``episodes``; returns (steps run, mean loss)."""
    from trl import SFTConfig, SFTTrainer

    from envkit.adapters.trl.sft import demonstrations_dataset, on_cpu_unless_cuda

    config = SFTConfig(
        output_dir=output_dir,
        max_steps=steps,
        learning_rate=learning_rate,
        per_device_train_batch_size=min(batch_size, len(episodes)),
        lr_scheduler_type=sft_args.pop("lr_scheduler_type", "constant"),
        warmup_steps=sft_args.pop("warmup_steps", 0),
        logging_steps=sft_args.pop("logging_steps", max(1, steps // 10)),
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=sft_args.pop("use_cpu", on_cpu_unless_cuda()),
        max_length=None,
        seed=seed,
        **sft_args,
    )
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=demonstrations_dataset(episodes), processing_class=tokenizer
    )
    result = trainer.train()
    model.eval()
    loss = float(result.metrics.get("train_loss", math.nan))
    return int(trainer.state.global_step), loss
