"""Thread workers abandon a hung call at its deadline but cannot stop its thread: the threads (and envs) still hung are
counted, a call that finally returns is no longer counted, and past the limit the run stops in one line that
recommends process workers."""

from __future__ import annotations

import threading
import time

import pytest
from helpers import ENGINE_DEADLINE_S, RELEASE_CAP_S
from test_score_contract import says_done

import envkit
from envkit.rollout import RolloutEngine, SamplingParams
from envkit.workers import LeakedThreadsError, ThreadWorkers

HANGS: dict[int, threading.Event] = {}  # task seed -> released when set


class HangsOnSomeSeeds(envkit.Env):
    """One turn; the step of a seed in ``HANGS`` blocks until its event is set."""

    max_turns = 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": "Say done."}], {}

    def step(self, action):
        if self.np_random_seed in HANGS:
            HANGS[self.np_random_seed].wait()
        return [], 0.0, True, False, {}

    def score(self):
        return 1.0


def _wait_for(condition, seconds: float = RELEASE_CAP_S) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_hung_threads_are_counted_released_ones_are_not_and_past_the_limit_the_run_stops(local_tokenizer):
    HANGS.clear()
    workers = ThreadWorkers(4, max_leaked=3)
    # Only a step blocked on its event may come near the deadline; each run waits it out once (its hung steps together).
    engine = RolloutEngine(
        HangsOnSomeSeeds,
        says_done(local_tokenizer),
        local_tokenizer,
        step_timeout_s=ENGINE_DEADLINE_S,
        env_workers=workers,
    )
    try:
        for run, hung in enumerate((2, 1)):  # five tasks per run, the first ``hung`` of them hang
            seeds = [10 * run + i for i in range(5)]
            HANGS.update({seed: threading.Event() for seed in seeds[:hung]})
            episodes = engine.run(seeds, 1, SamplingParams())
            assert [e.finish_reason for e in episodes] == ["timeout"] * hung + ["done"] * (5 - hung)
            assert workers.leaked == engine.leaked_threads == 2 + run  # the threads still hung, not fewer
        # 3 leaked: at the limit, not past it (that run went on)
        HANGS[0].set()  # the first hung step returns at last: its thread is free again, no longer a leak
        assert _wait_for(lambda: workers.leaked == 2)
        assert workers.abandoned == 3

        HANGS[30], HANGS[31] = threading.Event(), threading.Event()
        with pytest.raises(LeakedThreadsError) as raised:  # two more hang: 4 leaked, past the limit
            engine.run([30, 31, 32, 33], 1, SamplingParams())
        message = str(raised.value)
        assert "\n" not in message
        assert message.startswith("4 env calls that timed out are still running on abandoned threads")
        assert "use --env-workers processes" in message
        with pytest.raises(LeakedThreadsError):  # every run after it stops too, while the threads stay hung
            engine.run([34], 1, SamplingParams())
    finally:
        for event in HANGS.values():
            event.set()
    assert _wait_for(lambda: workers.leaked == 0)
    episodes = engine.run([40, 41], 1, SamplingParams())  # the hung calls all returned: runs go on again
    assert [e.error for e in episodes] == [None, None]


def test_the_default_limit_scales_with_concurrency():
    assert ThreadWorkers(4).max_leaked == 64
    assert ThreadWorkers(100).max_leaked == 200
    assert ThreadWorkers(4, max_leaked=0).max_leaked == 0
