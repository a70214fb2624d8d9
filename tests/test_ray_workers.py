"""Env workers as Ray actors (one local Ray instance for the module): token-exact with threads, and a hang, a crash,
a killed actor and an env exception each stay in their episode while the pool keeps its size."""

from __future__ import annotations

import os
import time

import pytest

ray = pytest.importorskip(
    "ray", reason="Ray is not installed (pip install -e '.[ray]'): the Ray env worker tests are skipped"
)

from test_process_workers import add_one, comparable, scripted  # noqa: E402

from envkit.rollout import RolloutEngine, SamplingParams  # noqa: E402
from envkit.workers import EnvFactory  # noqa: E402
from envkit.workers.ray_actors import RayWorkers  # noqa: E402

ACTORS = 2


@pytest.fixture(scope="module")
def ray_workers():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    workers = RayWorkers(ACTORS)
    yield workers
    workers.close()
    ray.shutdown()


def run(workers, tokenizer, factory, seeds, *, backend=None, timeout_s=5.0):
    engine = RolloutEngine(
        factory,
        backend or add_one(tokenizer),
        tokenizer,
        max_turns=3,
        concurrency=ACTORS,
        step_timeout_s=timeout_s,
        env_workers=workers,
    )
    return engine.run(seeds, 1, SamplingParams())


def test_episodes_on_ray_actors_are_token_exact_equal_to_threads(ray_workers, local_tokenizer):
    factory = EnvFactory("worker_envs:WhoAmI")
    seeds = [0, 1, 2]
    threaded = run("threads", local_tokenizer, factory, seeds, backend=scripted(factory, local_tokenizer, seeds))
    remote = run(ray_workers, local_tokenizer, factory, seeds, backend=scripted(factory, local_tokenizer, seeds))
    assert all(e.error is None and e.score == 1.0 for e in remote), [e.error for e in remote]
    assert [comparable(e) for e in remote] == [comparable(e) for e in threaded]
    assert os.getpid() not in {e.info["pid"] for e in remote}
    assert {e.info["pid"] for e in remote} <= set(ray_workers.pids)


def test_hangs_crashes_and_env_errors_on_ray_stay_in_their_episodes(ray_workers, local_tokenizer):
    faults = {1: "hang", 2: "exit", 3: "sigkill", 4: "raise"}
    episodes = run(ray_workers, local_tokenizer, EnvFactory("worker_envs:Faulty", {"faults": faults}), list(range(6)))
    assert len(episodes) == 6
    hung, exited, killed, raised = episodes[1:5]
    assert hung.finish_reason == "timeout" and hung.error.startswith("env step took longer than 5s"), hung.error
    for lost in (exited, killed):
        assert lost.finish_reason == "error", lost.error
        assert lost.error.startswith("EnvWorkerLost: env worker Ray actor ") and "died during step()" in lost.error
    assert raised.error == "ValueError: step failed on seed 4"
    assert all(e.error is None and e.turns == 3 for e in (episodes[0], episodes[5]))
    deadline = time.monotonic() + 90
    while len(ray_workers.pids) < ACTORS and time.monotonic() < deadline:  # replacements start in the background
        time.sleep(0.2)
    assert len(ray_workers.pids) == ACTORS and ray_workers.pool.replaced == 3
