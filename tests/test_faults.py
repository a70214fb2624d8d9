"""Faults stay in their episode: hung envs, a backend that fails one prompt, late writes — and nothing is lost."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from helpers import RELEASE_CAP_S, CounterEnv, wait_until

from envkit.backends import FaultyBackend, RecordingBackend, ScriptedBackend
from envkit.rollout import RolloutEngine, SamplingParams


def run_in_subprocess(tmp_path: Path, setup: str, run: str) -> tuple[dict, float]:
    """Run ``setup`` (which builds ``engine``, and may define ``extra()``: a dict of more to report) and ``episodes =
    engine.run(...)`` (``run``) in a fresh interpreter; return its report (each episode's finish_reason and error,
    and ``extra()``'s dict) and how long after the run returned the process exited. Fails the test when the run, or
    the process after it, never ends (a cap of minutes: what it catches hangs for an hour)."""
    script = tmp_path / "run.py"
    script.write_text(
        "import json, sys, time\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from helpers import CounterEnv\n"
        "from envkit.backends import FaultyBackend, ScriptedBackend\n"
        "from envkit.rollout import RolloutEngine, SamplingParams\n"
        "from envkit.testing import build_tokenizer\n"
        + textwrap.dedent(setup)
        + "start = time.perf_counter()\n"
        + f"episodes = {run}\n"
        + "print(json.dumps({'seconds': time.perf_counter() - start, 'returned_at': time.time(),\n"
        "    'reasons': [e.finish_reason for e in episodes], 'errors': [e.error for e in episodes],\n"
        "    'extra': globals().get('extra', dict)()}), flush=True)\n"
    )
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = process.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the run (or the process after it) never ended")
    assert process.returncode == 0 and out, out
    report = json.loads(out.splitlines()[0])
    return report, time.time() - report["returned_at"]


def test_every_env_hangs_forever_and_the_run_still_returns_and_the_process_exits(tmp_path):
    """16 episodes in flight on 2 thread workers (ThreadWorkers(2) under an engine of concurrency 16), every one
    hangs: 2 in reset (they hold both workers), 14 in their first step. A hung call is abandoned at its 1 s timeout and
    the calls queued behind a stuck pool give up instead of each waiting for a turn, so the run returns within about
    two timeouts; a timeout per round of 2 calls would run every episode's hanging call in turn (8 s), and no timeout
    at all never returns. Counted, not timed: calls that gave up in the queue never reached the env, so fewer calls
    hung than there are episodes."""
    timeout_s, workers, episodes = 1.0, 2, 16
    report, exited_after = run_in_subprocess(
        tmp_path,
        f"""
        HUNG = []  # one entry per env call that hung

        class HangsForever(CounterEnv):
            def reset(self, *, seed=None, options=None):
                if seed % 8 == 0:
                    HUNG.append(seed)
                    time.sleep(3600)  # seeds 0 and 8 hang in reset
                return super().reset(seed=seed, options=options)

            def step(self, action):
                HUNG.append(self.np_random_seed)
                time.sleep(3600)  # the others hang in their first step

        def extra():
            return {{"hung": len(HUNG)}}

        tokenizer = build_tokenizer()
        done = ScriptedBackend("Done.<|im_end|>", tokenizer=tokenizer)
        from envkit.workers import ThreadWorkers
        engine = RolloutEngine(
            HangsForever,
            done,
            tokenizer,
            concurrency={episodes},
            env_workers=ThreadWorkers({workers}),
            step_timeout_s={timeout_s},
        )
        """,
        f"engine.run(list(range({episodes})), 1, SamplingParams())",
    )
    assert report["reasons"] == ["timeout"] * episodes, report
    assert all("longer than 1s" in error for error in report["errors"]), report
    gave_up = [error for error in report["errors"] if f"for a free env worker while all {workers} were stuck" in error]
    assert gave_up and report["extra"]["hung"] <= episodes - len(gave_up), report
    # A process that waited for its hung threads would not exit for an hour; 60 s leaves room for interpreter teardown
    # on a loaded CI machine (measured 0.8-0.9 s idle, up to 4.0 s at load 7, 9 s with every core busy), as below.
    assert exited_after < 60.0, exited_after


def test_a_backend_that_fails_one_prompt_fails_only_that_episode(local_tokenizer):
    doomed = CounterEnv()
    doomed.reset(seed=3)
    poison = f"Bring the total to {doomed.target},"
    fails_one_prompt = RecordingBackend(
        FaultyBackend(
            _done_reply(local_tokenizer),
            fail_if=lambda r: RuntimeError("CUDA error: device-side assert triggered") if poison in r.text else None,
            tokenizer=local_tokenizer,
        )
    )
    episodes = RolloutEngine(CounterEnv, fails_one_prompt, local_tokenizer, max_turns=2).run(
        [1, 2, 3, 4], 2, SamplingParams()
    )
    assert len(episodes) == 8
    for episode in episodes:
        if episode.task_seed == 3:
            assert episode.finish_reason == "error" and "generation failed twice" in episode.error
            assert "device-side assert" in episode.error
        else:
            assert episode.error is None and episode.turns == 2, episode.error
    # the first batch held every episode; after it failed, prompts were retried one by one
    assert fails_one_prompt.batch_sizes[0] == 8


def slow_step_env(seconds: float) -> type[CounterEnv]:
    """CounterEnv whose every step sleeps ``seconds`` first."""

    class SlowStep(CounterEnv):
        def step(self, action):
            time.sleep(seconds)
            return super().step(action)

    return SlowStep


def adds_one(tokenizer) -> ScriptedBackend:
    """A backend whose every turn calls ``add(1)``."""
    return ScriptedBackend(
        '<tool_call>{"name": "add", "arguments": {"amount": 1}}</tool_call><|im_end|>', tokenizer=tokenizer
    )


def test_nothing_writes_to_an_episode_after_it_is_returned(local_tokenizer):
    # Every step blocks until the test releases it, past a 2 s timeout that nothing else comes near; once released,
    # the abandoned steps finish (counted) after their episodes were returned.
    release, finished = threading.Event(), []

    class Blocked(CounterEnv):
        def step(self, action):
            release.wait(RELEASE_CAP_S)
            try:
                return super().step(action)
            finally:
                finished.append(self.np_random_seed)

    engine = RolloutEngine(Blocked, adds_one(local_tokenizer), local_tokenizer, step_timeout_s=2.0)
    try:
        episodes = engine.run([0, 1], 1, SamplingParams())
        snapshot = [e.to_json() for e in episodes]
        assert all(e.finish_reason == "timeout" and "env step took longer" in e.error for e in episodes)
    finally:
        release.set()
    wait_until(lambda: len(finished) == 2, "the abandoned steps finished")
    assert [e.to_json() for e in episodes] == snapshot


def _done_reply(tokenizer) -> ScriptedBackend:
    return ScriptedBackend("Done.<|im_end|>", tokenizer=tokenizer)


def test_an_env_calling_sys_exit_ends_only_its_own_episode(local_tokenizer):
    class Exits(CounterEnv):
        def step(self, action):
            if self.np_random_seed == 1:
                raise SystemExit(3)
            return super().step(action)

    episodes = RolloutEngine(Exits, _done_reply(local_tokenizer), local_tokenizer, max_turns=2).run(
        [0, 1, 2], 1, SamplingParams()
    )
    assert [e.finish_reason for e in episodes] == ["done", "error", "done"]
    assert episodes[1].error == "EnvExited: SystemExit: 3"


def test_a_cancelled_run_gives_every_env_back(local_tokenizer):
    """A run cancelled mid-episode (its generation hangs until the test ends; cancelled once every env is open and
    the model called): every env opened so far is closed, none runs on."""
    import asyncio

    opened, closed = [], []

    class Tracked(CounterEnv):
        def reset(self, *, seed=None, options=None):
            opened.append(self)
            return super().reset(seed=seed, options=options)

        def close(self):
            closed.append(self)

    hung = FaultyBackend(_done_reply(local_tokenizer), hang_calls=math.inf)
    engine = RolloutEngine(Tracked, hung, local_tokenizer, max_turns=3)

    async def main():
        run = asyncio.ensure_future(engine.arun([0, 1, 2, 3], 1, SamplingParams()))
        give_up = time.monotonic() + RELEASE_CAP_S
        while not (len(opened) == 4 and hung.calls):
            assert time.monotonic() < give_up and not run.done(), "the run never reached the model with 4 envs open"
            await asyncio.sleep(0.01)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    try:
        asyncio.run(main())
    finally:
        hung.release()
    wait_until(lambda: len(closed) == 4, "every env closed")  # env.close() runs on a daemon thread
    assert {id(env) for env in closed} == {id(env) for env in opened}


def test_a_prompt_over_the_budget_is_an_error_not_a_silent_zero(local_tokenizer):
    episodes = RolloutEngine(CounterEnv, _done_reply(local_tokenizer), local_tokenizer, max_episode_tokens=10).run(
        [0], 2, SamplingParams()
    )
    assert all(e.finish_reason == "max_episode_tokens" and e.score == 0.0 for e in episodes)
    assert all("leaving no room under max_episode_tokens=10" in e.error for e in episodes)


def test_many_episodes_on_few_workers_wait_their_turn_without_timing_out(local_tokenizer):
    # 24 episodes whose step takes 0.2 s, on 2 env workers with a 2 s timeout (ten steps' time: a loaded machine does
    # not stretch a step to it): the last steps queue for ~2.4 s behind healthy ones. That is load, not a hung env:
    # every episode finishes.
    engine = RolloutEngine(
        slow_step_env(0.2), adds_one(local_tokenizer), local_tokenizer, max_turns=1, concurrency=2, step_timeout_s=2.0
    )
    episodes = engine.run(list(range(24)), 1, SamplingParams())
    assert [e.error for e in episodes] == [None] * 24
    assert {e.finish_reason for e in episodes} == {"max_turns"}


def test_a_hung_backend_ends_its_episodes_with_an_error_and_the_process_still_exits(tmp_path):
    report, exited_after = run_in_subprocess(
        tmp_path,
        """
        # an in-process engine that deadlocked, a server that stopped answering
        hangs_forever = FaultyBackend(ScriptedBackend([0]), hang_calls=float("inf"))
        engine = RolloutEngine(CounterEnv, hangs_forever, build_tokenizer(), generate_timeout_s=1.0)

        def extra():
            return {"calls": hangs_forever.calls}
        """,
        "engine.run([0, 1], 2, SamplingParams())",
    )
    assert report["extra"]["calls"] == 1, report  # one deadline, not retried
    assert report["reasons"] == ["error"] * 4, report
    assert all("generation took longer than 1s" in error for error in report["errors"]), report
    # A process that waited for the hung call would never exit (the 60 s limit above); 20 s leaves room for interpreter
    # teardown on a loaded CI machine (9 s seen with every core busy).
    assert exited_after < 20.0, exited_after
