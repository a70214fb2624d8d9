"""Batching on multiplexed process workers: a run's episodes generate together, whichever of the pool's workers were
already running when it began.

The engine starts the worker processes a run needs before its episodes open their envs (``ProcessWorkers.prepare``):
before that, the sessions placed on the workers already running began while the others waited for theirs to start,
ran ahead in batches of their own and never re-merged (32 episodes x 5 turns: 10-28 backend calls instead of 5 in
``benchmarks/sweep.py``). The model is scripted (deterministic and instant), so what is counted is the engine's
batching: the bounds are on backend calls, never on time."""

from __future__ import annotations

import pytest
from test_process_workers import add_one

from envkit.backends import RecordingBackend
from envkit.rollout import RolloutEngine, SamplingParams
from envkit.workers import EnvFactory
from envkit.workers.processes import ProcessWorkers

EPISODES, TURNS, PROCESSES = 32, 5, 4


@pytest.mark.parametrize("step_delay_s", [0.0, 0.2], ids=["instant", "slow-step"])
def test_episodes_on_partly_started_process_workers_batch_together(local_tokenizer, step_delay_s):
    """One worker process of four is running (a one-episode run started it); then 32 episodes x 5 turns of an env
    whose step is instant, or sleeps 0.2 s (four times the batcher's 50 ms gather window). About one backend call
    per turn: measured 5 (one of 9, on a machine at load 9, where a worker descheduled past the gather window in
    round 2 split its 8 episodes off for the rest of the run); before the engine started the workers together and
    held the run's first batch for episodes still opening their envs: 15-22 calls (instant), 11 (slow step)."""
    workers = ProcessWorkers(EPISODES, processes=PROCESSES)
    factory = EnvFactory("worker_envs:Faulty", {"delay": step_delay_s})
    try:
        engine = RolloutEngine(
            factory, add_one(local_tokenizer), local_tokenizer, max_turns=1, concurrency=EPISODES, env_workers=workers
        )
        engine.run([0], 1, SamplingParams())
        assert len(workers.pids) == 1
        backend = RecordingBackend(add_one(local_tokenizer))
        engine = RolloutEngine(
            factory,
            backend,
            local_tokenizer,
            max_turns=TURNS,
            concurrency=EPISODES,
            step_timeout_s=60.0,
            env_workers=workers,
        )
        episodes = engine.run(list(range(EPISODES)), 1, SamplingParams())
        assert [e.error for e in episodes if e.error] == []
        assert all(e.turns == TURNS for e in episodes)
        assert len(workers.pids) == PROCESSES
        assert sum(backend.batch_sizes) == EPISODES * TURNS
        assert len(backend.calls) < 2 * TURNS, backend.batch_sizes
    finally:
        workers.close()
