"""envkit's rollout worker for TRL's ``AsyncGRPOTrainer`` (its ``RolloutWorkerProtocol``).

A thread runs envkit's continuous rollout engine against the vLLM servers
(:class:`~envkit.adapters.vllm.weights.AdapterBackend`): up to ``max_inflight_groups`` GRPO groups play at once, each
task's ``group_size`` episodes together, and a new group starts as soon as one finishes. Each finished group becomes
``RolloutSample`` objects:

* ``input_ids`` = the episode's prompt + completion tokens exactly as generated and rendered (no re-tokenization),
  ``completion_mask`` = ``env_mask`` (prompt and env tokens 0), ``old_log_probs`` = the logprobs the server sampled
  with; env tokens after the model's last token are dropped, as in the synchronous path
  (:func:`envkit.adapters.trl.episodes_to_rollout`).
* ``advantage`` = the episode's score normalised within its group by
  :func:`~envkit.adapters.trl.advantages.group_advantages` (GRPOTrainer's default, the synchronous path's); failed
  episodes (env error or timeout, failed generation) are left out of the group's statistics and produce no sample, as
  the synchronous path gives them no gradient.
* ``model_version`` = the oldest policy version among the episode's turns (each turn's adapter is recorded:
  :attr:`envkit.rollout.Episode.turn_models`). A group whose oldest sample is more than ``max_staleness`` versions
  behind when it finishes is dropped here (``envkit/dropped_stale_total``); the trainer bounds it again where the
  sample is trained.

Metrics go through ``metrics_queue`` (one dict per group): ``envkit/mean_score``, ``envkit/mean_turns``,
``envkit/error_rate``, ``envkit/episodes_total``, ``envkit/dropped_stale_total``, ``envkit/spanning_sync_total``
(episodes whose turns came from more than one version), ``envkit/zero_variance_groups``.

Faults stay local as in the engine: a dead server or a failing env ends only its episodes. The worker itself fails
(and :meth:`EnvkitRolloutWorker.check_health` raises in the trainer) when more than ``max_error_rate`` of the last
``error_window`` episodes failed, when its loop raised, or when it stopped beating.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from envkit.adapters.trl.advantages import group_advantages
from envkit.adapters.trl.metrics import group_metrics
from envkit.backends import SamplingParams, request_seed
from envkit.rollout import Episode, RolloutEngine
from envkit.util.text import one_line

logger = logging.getLogger(__name__)


class RolloutWorkerFailed(RuntimeError):
    """The rollout worker stopped: too many failed episodes, a crash, or no heartbeat (one line)."""


def episode_versions(episode: Episode, version_of: Callable[[str], int | None], fallback: int) -> list[int]:
    """The policy version of each of the episode's turns (``fallback`` where a turn's model name is not a version)."""
    versions = []
    for name in episode.turn_models:
        version = version_of(name) if name else None
        versions.append(fallback if version is None else version)
    return versions


def samples_from_group(
    episodes: list[Episode],
    tokenizer: Any,
    *,
    group_id: int,
    version_of: Callable[[str], int | None],
    fallback_version: int,
) -> list[Any]:
    """The group's ``RolloutSample`` objects (see the module): one per episode that did not fail."""
    import numpy as np

    from envkit.adapters.trl import episodes_to_rollout
    from envkit.adapters.trl.async_grpo.trl_async import VERSION_KEY, RolloutSample

    every = group_advantages([None if e.error is not None else float(e.score) for e in episodes])
    ok = [e for e in episodes if e.error is None]
    if not ok:
        return []
    rollout = episodes_to_rollout(ok, tokenizer)
    advantages = [a for a, e in zip(every, episodes, strict=True) if e.error is None]
    now = time.time()
    samples = []
    for i, episode in enumerate(ok):
        prompt, completion = rollout["prompt_ids"][i], rollout["completion_ids"][i]
        versions = episode_versions(episode, version_of, fallback_version) or [fallback_version]
        samples.append(
            RolloutSample(
                prompt=list(episode.messages[:1]),
                completion=list(episode.messages[1:]),
                input_ids=np.asarray(prompt + completion, dtype=np.int64),
                completion_mask=np.asarray([0] * len(prompt) + rollout["env_mask"][i], dtype=np.int64),
                old_log_probs=np.asarray([0.0] * len(prompt) + rollout["logprobs"][i], dtype=np.float32),
                advantage=float(advantages[i]),
                model_version=min(versions),
                group_id=int(group_id),
                metrics={"envkit/score": float(episode.score), VERSION_KEY: float(min(versions))},
                enqueued_at=now,
            )
        )
    return samples


class _TakenQueue(queue.Queue):
    """The rollout buffer: a ``queue.Queue`` that reports each sample the trainer takes (``on_taken(sample)``)."""

    def __init__(self, maxsize: int, on_taken: Callable[[Any], None]) -> None:
        super().__init__(maxsize=maxsize)
        self.on_taken = on_taken

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        """``queue.Queue.get``, reported."""
        item = super().get(block, timeout)
        self.on_taken(item)
        return item


class EnvkitRolloutWorker:
    """Rollouts for TRL's ``AsyncGRPOTrainer`` from envkit's engine (see the module).

    Groups are numbered in the order they start; group ``g`` plays the ``g``-th task of the shuffled order and samples
    with seed ``request_seed(sampling.seed, g)``. A run resumed from a checkpoint plays the groups the cut run had
    not finished with (:meth:`resume_state`, saved with the checkpoint; :meth:`resume_at`): the tasks and seeds the
    uncut run would have played.

    Args:
        engine: The rollout engine (its backend an :class:`~.weights.AdapterBackend`).
        publisher: The run's :class:`~.weights.AdapterPublisher` (maps adapter names to versions).
        task_seeds: Training task seeds; played in a shuffled order, epoch after epoch.
        group_size: Episodes per task (``num_generations``).
        sampling: Sampling of every turn; its ``seed`` (when set) derives one seed per group.
        max_staleness: Versions a sample may lag when its group finishes.
        max_inflight_groups: Groups playing at once, at most.
        queue_maxsize: Samples waiting for the trainer before generation waits.
        samples_per_version: Samples the trainer consumes per policy version (``per_device_train_batch_size ×
            gradient_accumulation_steps × processes``). Given, a group starts only when its samples will train
            within ``max_staleness`` versions of now: the queue is first in, first out and the trainer takes this
            many samples per version, so a sample queued at position ``p`` trains at version ``v0 + p //
            samples_per_version`` (``v0``: the version at :meth:`start`); a group that would land later is not
            started (it would be generated only to be dropped), unless the trainer may be waiting (see
            :meth:`_admits`). Give it ``× weight_sync_steps`` when syncs are that many steps apart. ``None``: only
            ``max_inflight_groups`` bounds generation.
        max_error_rate: Fail when more than this fraction of the last ``error_window`` episodes failed (``None``:
            never).
        error_window: Episodes the error rate is measured over.
        seed: Shuffles the task order.
        on_group: Called (on the worker's thread) with each finished group's episodes and samples, before the
            staleness check (tests, benchmarks).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        publisher: Any,
        task_seeds: Sequence[int],
        *,
        group_size: int,
        sampling: SamplingParams,
        max_staleness: int,
        max_inflight_groups: int,
        queue_maxsize: int = 1024,
        max_error_rate: float | None = 0.5,
        error_window: int = 64,
        seed: int = 0,
        on_group: Callable[[list[Episode], list[Any]], None] | None = None,
        samples_per_version: int | None = None,
    ) -> None:
        if not task_seeds:
            raise ValueError("no training task seeds")
        if group_size < 1 or max_inflight_groups < 1 or max_staleness < 0:
            raise ValueError("group_size and max_inflight_groups must be at least 1, max_staleness at least 0")
        self.engine, self.publisher = engine, publisher
        self.task_seeds, self.group_size, self.sampling = list(task_seeds), int(group_size), sampling
        self.max_staleness, self.max_inflight_groups = int(max_staleness), int(max_inflight_groups)
        self.max_error_rate, self.seed, self.on_group = max_error_rate, int(seed), on_group
        if samples_per_version is not None and samples_per_version < 1:
            raise ValueError("samples_per_version must be at least 1")
        self.samples_per_version = samples_per_version
        self._queued_total = 0  # samples ever put in the rollout buffer: the next sample's queue position
        self._first_version = 0
        self._version_offset = 0  # samples a resumed run trains under its first version before the cut run would have
        self._admitted_at: dict[int, int] = {}  # running group id -> the policy version when it was admitted
        self.consumed: Callable[[], int] | None = None
        """Set by the trainer: how many samples it has taken into training slots (drops excluded). Admission then
        counts queue positions from it; without it, from the samples queued (exact only when nothing is dropped)."""
        self.rollout_buffer: queue.Queue = _TakenQueue(queue_maxsize, self._taken)
        self._next_group = 0  # the next group id to start (or skip): its place in the task order
        self._skip: frozenset[int] = frozenset()  # groups a resumed run does not play (the cut run finished them)
        self._open: dict[int, int | None] = {}  # group id -> its samples still queued (None: still playing)
        self._lock = threading.Lock()
        self.metrics_queue: queue.Queue = queue.Queue()
        self.model_version = 0
        self.counts = {"groups": 0, "episodes": 0, "failed": 0, "samples": 0, "dropped_stale": 0, "spanning": 0}
        """Since start: groups finished, episodes played, failed episodes, samples queued, samples dropped as
        stale, episodes spanning a sync."""
        self._recent: deque[bool] = deque(maxlen=max(int(error_window), 1))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._heartbeat = time.time()

    # ---- RolloutWorkerProtocol ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start playing groups (on a thread of its own)."""
        if self._thread is not None:
            return
        self._heartbeat = time.time()
        self._first_version = self.model_version  # what queue position 0 trains under (TRL syncs once before start)
        self._thread = threading.Thread(target=self._thread_main, name="envkit-rollout-worker", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop: running episodes are cancelled, the thread joined, the engine's env workers released."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=120)
        self.engine.close()

    def update_model_version(self, model_version: int) -> None:
        """The trainer's policy version now (after a sync)."""
        self.model_version = int(model_version)

    def resume_state(self) -> dict[str, Any]:
        """Where a resumed run starts (:meth:`resume_at`): ``next_group``, the first group the trainer has not finished
        with, and ``done_after``, the groups after it it has finished with (groups finish out of order); and what
        numbers the groups (``train_tasks``, ``seed``, ``num_generations``: a run resumed with others would map them
        to other tasks). A group is finished with once it was dropped, produced no sample, or had all its samples
        taken by the trainer (at most the micro-batch fetched ahead of training not yet trained)."""
        with self._lock:
            if self._open:
                first = min(self._open)
            else:
                first = self._next_group
                while first in self._skip:
                    first += 1
            done = [g for g in range(first + 1, self._next_group) if g not in self._open]
            done += [g for g in self._skip if g > first and g >= self._next_group]  # a resumed run's, not reached
            order = {"train_tasks": len(self.task_seeds), "seed": self.seed, "num_generations": self.group_size}
            return {"next_group": first, "done_after": sorted(done), **order}

    def resume_at(self, next_group: int, done_after: Iterable[int] = (), trained_into_version: int = 0) -> None:
        """Start at group ``next_group`` and skip the groups ``done_after`` (a cut run's :meth:`resume_state`), so the
        groups played are those the cut run had not finished with; before :meth:`start`.

        ``trained_into_version``: the samples the cut run had already trained under its last policy version (its global
        step modulo ``weight_sync_steps``, times the samples per step): the resumed run's first sync comes that much
        sooner, and admission counts queue positions from there."""
        if self._thread is not None:
            raise RuntimeError("resume_at() after start(): the worker is already playing")
        if next_group < 0:
            raise ValueError(f"a group is numbered 0 or more, got {next_group}")
        if trained_into_version < 0:
            raise ValueError(f"trained_into_version is 0 or more, got {trained_into_version}")
        self._next_group, self._skip = int(next_group), frozenset(int(g) for g in done_after)
        self._version_offset = int(trained_into_version)

    def check_health(self, stale_after_s: float) -> None:
        """Raise :class:`RolloutWorkerFailed` if the worker failed, died, or has not beaten for ``stale_after_s``."""
        if self._error is not None:
            raise RolloutWorkerFailed(f"the rollout worker stopped: {self._error}") from self._error
        if self._thread is not None and not self._thread.is_alive() and not self._stop.is_set():
            raise RolloutWorkerFailed("the rollout worker's thread exited")
        age = time.time() - self._heartbeat
        if age > stale_after_s:
            raise RolloutWorkerFailed(f"the rollout worker has not made progress for {age:.0f}s (> {stale_after_s:g}s)")

    # ---- the loop -----------------------------------------------------------------------------------------------
    def _thread_main(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:
            self._error = error
            logger.error("envkit rollout worker failed: %s: %s", type(error).__name__, error)

    def _groups(self) -> Iterator[tuple[int, int]]:
        """The groups to play, as (group id, task seed), from :attr:`_next_group` on, without :attr:`_skip`: group
        ``g`` plays the ``g``-th task of the order, each epoch the task seeds shuffled by ``seed`` and the epoch."""
        group = self._next_group
        epoch, offset = divmod(group, len(self.task_seeds))
        while True:
            order = list(self.task_seeds)
            random.Random(request_seed(self.seed, epoch)).shuffle(order)
            for task in order[offset:]:
                if group not in self._skip:
                    yield group, task
                group += 1
            offset = 0
            epoch += 1

    async def _main(self) -> None:
        groups = self._groups()
        running: set[asyncio.Task] = set()
        try:
            while not self._stop.is_set():
                while len(running) < self.max_inflight_groups and self._admits(len(running)):
                    group_id, task_seed = next(groups)
                    self._admitted_at[group_id] = self.model_version
                    with self._lock:
                        self._open[group_id] = None
                        self._next_group = group_id + 1
                    task = asyncio.ensure_future(self._group(task_seed, group_id))
                    task.add_done_callback(lambda _, done_id=group_id: self._admitted_at.pop(done_id, None))
                    running.add(task)
                if not running:  # nothing may start until the trainer moves on (admission)
                    self._heartbeat = time.time()
                    await asyncio.sleep(0.02)
                    continue
                done, running = await asyncio.wait(running, timeout=0.25, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # a bug in the worker itself: fail loudly
                self._heartbeat = time.time()
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    def _admits(self, running_groups: int) -> bool:
        """Whether one more group may start (see ``samples_per_version``): its samples take the queue positions after
        what the trainer has consumed, what waits in the queue and what the running groups will add. It starts when
        its last sample trains within ``max_staleness`` versions of the oldest version a running group started at
        (groups finish out of order: a group started earlier can land behind this one, at its last position); or,
        when nothing runs and the queue is empty (the trainer may be waiting: groups that lost failed episodes, or
        samples the trainer dropped, can leave it short of its next micro-batch), when its first sample does (the rest
        may then be dropped as stale)."""
        if self.samples_per_version is None:
            return True
        consumed = self.consumed
        base = consumed() + self.rollout_buffer.qsize() if consumed is not None else self._queued_total
        first = base + running_groups * self.group_size
        last = first + self.group_size - 1

        oldest = min([self.model_version, *self._admitted_at.values()])

        def within(position: int) -> bool:
            trains_at = self._first_version + (self._version_offset + position) // self.samples_per_version
            return trains_at - oldest <= self.max_staleness

        if within(last):
            return True
        return running_groups == 0 and self.rollout_buffer.empty() and within(first)

    async def _group(self, seed: int, group_id: int) -> None:
        sampling = self.sampling
        if sampling.seed is not None:
            sampling = dataclasses.replace(sampling, seed=request_seed(sampling.seed, group_id))
        started_at = self.model_version
        episodes = await self.engine.arun([seed], self.group_size, sampling)
        samples = samples_from_group(
            episodes,
            self.engine.tokenizer,
            group_id=group_id,
            version_of=self.publisher.version_of,
            fallback_version=started_at,
        )
        if self.on_group is not None:
            self.on_group(episodes, samples)
        self._account(episodes, samples)
        if samples and self.model_version - min(s.model_version for s in samples) > self.max_staleness:
            self.counts["dropped_stale"] += len(samples)
            self.metrics_queue.put({"envkit/dropped_stale_total": float(len(samples))})
            samples = []
        with self._lock:
            if samples:
                self._open[group_id] = len(samples)
            else:
                del self._open[group_id]
        for sample in samples:
            while True:
                try:
                    sample.enqueued_at = time.time()
                    self.rollout_buffer.put_nowait(sample)
                    self._queued_total += 1
                    break
                except queue.Full:  # the trainer is behind: generation waits (backpressure)
                    if self._stop.is_set():
                        return
                    await asyncio.sleep(0.05)
        self.counts["samples"] += len(samples)

    def _taken(self, sample: Any) -> None:
        """The trainer took ``sample`` from the rollout buffer: its group is done once all its samples are."""
        with self._lock:
            left = self._open.get(sample.group_id)
            if left is not None:
                if left <= 1:
                    del self._open[sample.group_id]
                else:
                    self._open[sample.group_id] = left - 1

    def _account(self, episodes: list[Episode], samples: list[Any]) -> None:
        failed = [e for e in episodes if e.error is not None]
        spanning = sum(len({m for m in e.turn_models if m}) > 1 for e in episodes)
        self.counts["groups"] += 1
        self.counts["episodes"] += len(episodes)
        self.counts["failed"] += len(failed)
        self.counts["spanning"] += spanning
        shared = group_metrics(episodes)  # as the synchronous run logs them
        metrics: dict[str, Any] = {
            "envkit/error_rate": (float(len(failed)), float(len(episodes))),
            "envkit/episodes_total": float(len(episodes)),
            "envkit/spanning_sync_total": float(spanning),
            "envkit/zero_variance_groups": (shared.pop("envkit/zero_variance_groups"), 1.0),
            **shared,
        }
        self.metrics_queue.put(metrics)
        self._recent.extend(e.error is not None for e in episodes)
        if self.max_error_rate is not None and len(self._recent) == self._recent.maxlen:
            rate = sum(self._recent) / len(self._recent)
            if rate > self.max_error_rate:
                first = one_line(failed[0].error if failed else "", 300)
                raise RolloutWorkerFailed(
                    f"{sum(self._recent)} of the last {len(self._recent)} episodes failed (error rate {rate:.2f} > "
                    f"--max-error-rate {self.max_error_rate:g}); last: {first} — fix the env or the vLLM servers, "
                    "or raise --max-error-rate"
                )
