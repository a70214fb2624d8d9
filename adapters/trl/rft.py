"""Rejection-sampling fine-tuning (RFT, also called expert iteration or RAFT): sample, keep the good, fine-tune.

Each round samples episodes of an env with the rollout engine, keeps those that scored at least a threshold (and did
not fail), and fine-tunes the model on them token-exactly, with the same masked SFT ``envkit sft`` runs
(:func:`envkit.adapters.trl.sft.demonstrations_dataset`: the env's tokens are masked out of the loss, the model's own
tokens are learned exactly as it sampled them). The next round samples from the fine-tuned model. Where a model
already solves a task now and then, this is the baseline RL is measured against (and a warm start for it); it needs no
oracle. ``envkit rft ENV --model PATH --output-dir DIR --rounds 4 --episodes-per-round 64 --threshold 1`` runs it.

Sampling goes through any backend: by default the model being trained samples itself (on-policy, through
:class:`~envkit.backends.TransformersBackend`); ``backend_factory`` swaps in another one, e.g. a served teacher.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envkit.backends import SamplingParams
from envkit.core.env import Env
from envkit.models.loading import check_saved_tokenizer
from envkit.rollout import Episode, RolloutEngine

ROUNDS_FILE = "rft_rounds.json"
"""The per-round record (:class:`RFTRound` as JSON) written beside the saved model."""


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
) -> None:
    """Raise :class:`RFTConfigError` (one line naming the fix) for settings that cannot run, or that would run without
    fine-tuning on anything (a threshold above 1, the top score)."""
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
    if threshold > 1.0:
        raise RFTConfigError(f"threshold {threshold:g} keeps nothing: scores are in [0, 1] (1.0 keeps solved episodes)")
    if not learning_rate > 0:
        raise RFTConfigError(f"learning rate must be above 0, got {learning_rate:g}")
    if batch_size < 1:
        raise RFTConfigError(f"batch size must be at least 1, got {batch_size}")


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
        **sft_args: Further fields of TRL's ``SFTConfig``.

    Raises:
        RFTConfigError: For settings that cannot run.
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
    )
    sampling = sampling or SamplingParams(temperature=1.0, top_k=None, max_new_tokens=128)
    base_seed = sampling.seed if sampling.seed is not None else seed
    tasks_per_round = episodes_per_round // samples_per_task
    records: list[RFTRound] = []
    buffer: list[Episode] = []
    sampled = 0
    for index in range(rounds):
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
        )
        records.append(record)
        trained = f"{steps} steps on {len(buffer)}, loss {loss:.4f}" if loss is not None else "nothing to learn"
        log(
            f"rft round {record.round}/{rounds}: {record.episodes} episodes, mean score {record.mean_score:.3f}, "
            f"kept {record.kept} (score >= {threshold:g}); {trained}"
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
    return records


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

    from envkit.adapters.trl.sft import demonstrations_dataset

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
        use_cpu=sft_args.pop("use_cpu", True),
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
