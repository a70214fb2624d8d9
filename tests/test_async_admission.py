"""The rollout worker of ``envkit train --async`` generates only what can train within the staleness bound, and never
leaves the trainer waiting for good.

A sample that reaches the trainer's ``p``-th training slot trains at policy version ``v0 + p // samples_per_version``
(the trainer takes the queue in order, that many samples per version), so the worker starts a group only when its
samples land within ``max_staleness`` versions of the current one. Without that, a fast generator fills the queue
ahead of the trainer and most of what it made is dropped as stale where the trainer fetches it (measured before the
admission: 212 of 372 samples dropped in an 8-step run at staleness 1, 128 of 256 at staleness 2). And when groups
lose failed episodes, or the trainer drops a sample, the trainer may be one micro-batch short: the worker must then
start a group anyway, or both sides wait forever.

The engine here is envkit's real one over a scripted backend (an instant model); the trainer is played by the test
the way TRL's ``AsyncGRPOTrainer`` with envkit's gate consumes the queue: micro-batches in order, the next one fetched
before the current one trains (accelerate's fetch-ahead), each sample checked against the version it will train
under and dropped past the bound, one version per ``samples_per_version`` samples.
"""

from __future__ import annotations

import itertools
import queue
import random
import time

import pytest
from helpers import CounterEnv

from envkit.adapters.trl.async_grpo import EnvkitRolloutWorker
from envkit.backends import SamplingParams, ScriptedBackend, request_seed
from envkit.rollout import RolloutEngine

pytest.importorskip("trl.experimental.async_grpo")

GROUP = 4
PER_VERSION = 8


class Versions:
    """The publisher as the worker sees it: no adapter names here, so every turn gets the fallback version."""

    def version_of(self, name: str) -> int | None:
        return None


class FlakyCounterEnv(CounterEnv):
    """Every fifth episode fails in reset: its group yields fewer samples than the group size."""

    opened = itertools.count()

    def reset(self, *, seed=None, options=None):
        if next(self.opened) % 5 == 3:
            raise RuntimeError("this env failed to open")
        return super().reset(seed=seed, options=options)


def _worker(local_tokenizer, *, max_staleness: int, admission: bool, env=CounterEnv) -> EnvkitRolloutWorker:
    engine = RolloutEngine(env, ScriptedBackend("Done.<|im_end|>", tokenizer=local_tokenizer), local_tokenizer)
    return EnvkitRolloutWorker(
        engine,
        Versions(),
        list(range(64)),
        group_size=GROUP,
        sampling=SamplingParams(max_new_tokens=8),
        max_staleness=max_staleness,
        max_inflight_groups=16,
        queue_maxsize=256,
        max_error_rate=None,
        samples_per_version=PER_VERSION if admission else None,
    )


def _reaches(worker: EnvkitRolloutWorker, expected: int, deadline_s: float = 60.0, hold_s: float = 1.0) -> int:
    """Wait (up to ``deadline_s``) until the worker has queued ``expected`` samples, then ``hold_s`` more; the count."""
    end = time.monotonic() + deadline_s
    while worker.counts["samples"] < expected and time.monotonic() < end:
        time.sleep(0.02)
    time.sleep(hold_s)
    return worker.counts["samples"]


class Trainer:
    """TRL's consumption of the queue, with envkit's gate (see the module): ``microbatch`` samples per micro-batch,
    ``accumulation`` micro-batches per step, a sync (version + 1) after every step."""

    def __init__(self, worker: EnvkitRolloutWorker, *, microbatch: int, accumulation: int, max_staleness: int):
        self.worker, self.microbatch, self.accumulation = worker, microbatch, accumulation
        self.max_staleness = max_staleness
        self.yielded = self.dropped = 0
        self.staleness: list[int] = []
        self.first_version = worker.model_version
        worker.consumed = lambda: self.yielded

    def _take(self, trains_at: int, timeout_s: float):
        while True:
            sample = self.worker.rollout_buffer.get(timeout=timeout_s)  # queue.Empty: the trainer starved
            if trains_at - sample.model_version > self.max_staleness:
                self.dropped += 1
                continue
            self.yielded += 1
            self.staleness.append(trains_at - sample.model_version)
            return sample

    def _fetch(self, index: int, timeout_s: float) -> list:
        trains_at = self.first_version + index // self.accumulation
        return [self._take(trains_at, timeout_s) for _ in range(self.microbatch)]

    def train(self, steps: int, timeout_s: float = 30.0) -> None:
        fetched = self._fetch(0, timeout_s)
        for index in range(steps * self.accumulation):
            fetched = self._fetch(index + 1, timeout_s)  # accelerate fetches the next micro-batch first
            if (index + 1) % self.accumulation == 0:  # the step ends: sync
                self.worker.update_model_version(self.worker.model_version + 1)
        del fetched


@pytest.mark.parametrize(("max_staleness", "first_version"), [(1, 0), (2, 0), (1, 1)])
def test_the_worker_generates_no_more_than_can_train_within_the_bound(local_tokenizer, max_staleness, first_version):
    """``first_version`` 1: TRL's trainer syncs once before it starts the worker, so position 0 trains under 1."""
    worker = _worker(local_tokenizer, max_staleness=max_staleness, admission=True)
    worker.update_model_version(first_version)
    worker.start()
    try:
        # Positions up to (max_staleness + 1) * PER_VERSION - 1 train within max_staleness versions of the first.
        assert _reaches(worker, (max_staleness + 1) * PER_VERSION) == (max_staleness + 1) * PER_VERSION
        assert worker.counts["episodes"] == (max_staleness + 1) * PER_VERSION  # nothing started beyond it
        position, version, staleness = 0, first_version, []
        worker.consumed = lambda: position
        for _ in range(6):  # the trainer, without fetch-ahead: one version's samples, then a sync
            for _ in range(PER_VERSION):
                sample = worker.rollout_buffer.get(timeout=30)
                staleness.append(first_version + position // PER_VERSION - sample.model_version)
                position += 1
            version += 1
            worker.update_model_version(version)
        assert max(staleness) <= max_staleness and min(staleness) >= 0
        expected = (version - first_version + max_staleness + 1) * PER_VERSION
        assert _reaches(worker, expected) == expected  # again exactly what can train
    finally:
        worker.stop()
    assert worker.counts["failed"] == 0 and worker.counts["dropped_stale"] == 0


class SlowSeedsEnv(CounterEnv):
    """Episodes of the task seeds in ``slow`` take a second longer (in their first step, after the first batch)."""

    slow: frozenset[int] = frozenset()

    def reset(self, *, seed=None, options=None):
        self.task_seed = seed
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.task_seed in self.slow:
            time.sleep(1.0)
        return super().step(action)


def test_a_group_that_finishes_late_still_trains_within_the_bound(local_tokenizer):
    """Groups finish out of order: a group started early can land in the queue behind groups started after it, one
    version later than planned. Here the third and fourth groups (admitted at version 0 for positions 8-15) are slow;
    after the first sync, groups admitted for positions 16-23 must wait for them, or they would take positions 8-15
    and push the slow ones to 16-23, where version-0 samples train at version 2 (before the fix: staleness 2, or the
    slow groups dropped as stale when they finish, depending on timing)."""
    order = list(range(64))
    random.Random(request_seed(0, 0)).shuffle(order)  # the worker's task order (seed 0, first epoch)
    SlowSeedsEnv.slow = frozenset(order[2:4])
    worker = _worker(local_tokenizer, max_staleness=1, admission=True, env=SlowSeedsEnv)
    position, staleness = 0, []
    worker.consumed = lambda: position
    worker.start()
    try:
        for version in range(3):  # the trainer without fetch-ahead: one version's samples, then a sync
            for _ in range(PER_VERSION):
                sample = worker.rollout_buffer.get(timeout=30)
                staleness.append(version - sample.model_version)
                position += 1
            worker.update_model_version(version + 1)
        time.sleep(1.5)  # every group started so far has finished
    finally:
        worker.stop()
    assert max(staleness) <= 1 and min(staleness) >= 0, staleness
    assert worker.counts["dropped_stale"] == 0  # nor did the slow groups arrive too late and get dropped


@pytest.mark.parametrize(("max_staleness", "microbatch", "accumulation"), [(1, 8, 1), (1, 4, 2), (2, 8, 1)])
def test_groups_short_of_failed_episodes_never_leave_the_trainer_waiting(
    local_tokenizer, max_staleness, microbatch, accumulation
):
    """Every fifth episode fails, so groups bring 3 samples instead of 4 and a micro-batch can be one sample short
    of what admission counted on: the worker must still feed the trainer (before the fix it waited forever at the
    first micro-batch fetched ahead), and what trains stays within the bound."""
    worker = _worker(local_tokenizer, max_staleness=max_staleness, admission=True, env=FlakyCounterEnv)
    trainer = Trainer(worker, microbatch=microbatch, accumulation=accumulation, max_staleness=max_staleness)
    worker.start()
    try:
        trainer.train(steps=8)
    except queue.Empty:
        pytest.fail(f"the trainer starved after {trainer.yielded} samples: the worker stopped generating")
    finally:
        worker.stop()
    assert worker.counts["failed"] > 0  # the scenario happened
    assert trainer.yielded == (8 * accumulation + 1) * microbatch
    assert max(trainer.staleness) <= max_staleness


def test_without_admission_a_fast_worker_runs_ahead_of_the_bound(local_tokenizer):
    """What the admission prevents: with only the in-flight cap, the queue fills far past what can train in time."""
    worker = _worker(local_tokenizer, max_staleness=1, admission=False)
    worker.start()
    try:
        queued = _reaches(worker, 4 * PER_VERSION, deadline_s=30)
    finally:
        worker.stop()
    assert queued >= 4 * PER_VERSION  # positions that would train 3+ versions late: dropped by the trainer


def test_samples_per_version_must_be_positive(local_tokenizer):
    with pytest.raises(ValueError, match="samples_per_version"):
        EnvkitRolloutWorker(
            RolloutEngine(CounterEnv, ScriptedBackend([1]), local_tokenizer),
            Versions(),
            [0],
            group_size=GROUP,
            sampling=SamplingParams(max_new_tokens=8),
            max_staleness=1,
            max_inflight_groups=1,
            samples_per_version=0,
        )
