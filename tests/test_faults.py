"""Faults stay in their episode: hung envs, a backend that fails one prompt, late writes — and nothing is lost."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import CounterEnv

from envkit.backends import FaultyBackend, RecordingBackend, ScriptedBackend
from envkit.rollout import RolloutEngine, SamplingParams


def run_in_subprocess(tmp_path: Path, setup: str, run: str) -> tuple[dict, float]:
    """Run ``setup`` (which builds ``engine``) and ``episodes = engine.run(...)`` (``run``) in a fresh interpreter;
    return its report (seconds the run took, each episode's finish_reason and error) and how long after the run
    returned the process exited. Fails the test when the run, or the process after it, never ends."""
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
        "    'reasons': [e.finish_reason for e in episodes], 'errors': [e.error for e in episodes]}), flush=True)\n"
    )
    process = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the run (or the process after it) never ended")
    assert process.returncode == 0 and out, out
    report = json.loads(out.splitlines()[0])
    return report, time.time() - report["returned_at"]


def test_every_env_hangs_forever_and_the_run_still_returns_and_the_process_exits(tmp_path):
    """16 episodes on 2 workers, every one hangs: 2 in reset (they hold both workers), 14 in their first step. A hung
    call is abandoned at its 1 s timeout and the calls queued behind a stuck pool give up instead of each waiting for
    a turn, so the run returns within two timeouts (the resets', then the steps', which jam together) plus load; a
    timeout per round of 2 calls would take 8 s (1 + 14 / 2), and no timeout at all never returns."""
    timeout_s, workers, episodes = 1.0, 2, 16
    report, exited_after = run_in_subprocess(
        tmp_path,
        f"""
        class HangsForever(CounterEnv):
            def reset(self, *, seed=None, options=None):
                if seed % 8 == 0:
                    time.sleep(3600)  # seeds 0 and 8 hang in reset
                return super().reset(seed=seed, options=options)

            def step(self, action):
                time.sleep(3600)  # the others hang in their first step

        tokenizer = build_tokenizer()
        done = ScriptedBackend("Done.<|im_end|>", tokenizer=tokenizer)
        engine = RolloutEngine(HangsForever, done, tokenizer, concurrency={workers}, step_timeout_s={timeout_s})
        """,
        f"engine.run(list(range({episodes})), 1, SamplingParams())",
    )
    # Two timeouts, plus two more of margin for a loaded 2-core CI machine (thread starts, rendering, generation
    # batches): measured 2.0-2.1 s idle, 2.1-2.3 s at load 10; a timeout per round of calls takes 8 s, twice the bound.
    assert report["seconds"] < 4 * timeout_s, report
    assert report["reasons"] == ["timeout"] * episodes, report
    assert all("longer than 1s" in error for error in report["errors"]), report
    # A process that waited for its hung threads would never exit (the 60 s limit); 20 s leaves room for interpreter
    # teardown on a loaded CI machine (measured 0.8-0.9 s idle, up to 4.0 s at load 7), as below.
    assert exited_after < 20.0, exited_after


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
    engine = RolloutEngine(slow_step_env(1.0), adds_one(local_tokenizer), local_tokenizer, step_timeout_s=0.3)
    episodes = engine.run([0, 1], 1, SamplingParams())
    snapshot = [e.to_json() for e in episodes]
    assert all(e.finish_reason == "timeout" for e in episodes)
    time.sleep(1.5)  # the abandoned steps finish now
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
    """asyncio.wait_for around arun cancels it mid-episode: every env opened so far is closed, none runs on."""
    import asyncio

    closed = []

    class Tracked(CounterEnv):
        def close(self):
            closed.append(self)

    slow = FaultyBackend(_done_reply(local_tokenizer), delay_s=0.5)
    engine = RolloutEngine(Tracked, slow, local_tokenizer, max_turns=3)

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engine.arun([0, 1, 2, 3], 1, SamplingParams()), 0.3)

    asyncio.run(main())
    time.sleep(0.2)  # env.close() runs on a daemon thread
    assert len(closed) == 4


def test_a_prompt_over_the_budget_is_an_error_not_a_silent_zero(local_tokenizer):
    episodes = RolloutEngine(CounterEnv, _done_reply(local_tokenizer), local_tokenizer, max_episode_tokens=10).run(
        [0], 2, SamplingParams()
    )
    assert all(e.finish_reason == "max_episode_tokens" and e.score == 0.0 for e in episodes)
    assert all("leaving no room under max_episode_tokens=10" in e.error for e in episodes)


def test_many_episodes_on_few_workers_wait_their_turn_without_timing_out(local_tokenizer):
    # 12 episodes whose step takes 0.2 s, on 2 env workers with a 1 s timeout: the last steps queue for ~1.2 s behind
    # healthy ones. That is load, not a hung env: every episode finishes.
    engine = RolloutEngine(
        slow_step_env(0.2), adds_one(local_tokenizer), local_tokenizer, max_turns=1, concurrency=2, step_timeout_s=1.0
    )
    episodes = engine.run(list(range(12)), 1, SamplingParams())
    assert [e.error for e in episodes] == [None] * 12
    assert {e.finish_reason for e in episodes} == {"max_turns"}


def test_a_hung_backend_ends_its_episodes_with_an_error_and_the_process_still_exits(tmp_path):
    report, exited_after = run_in_subprocess(
        tmp_path,
        """
        # an in-process engine that deadlocked, a server that stopped answering
        hangs_forever = FaultyBackend(ScriptedBackend([0]), hang_calls=float("inf"))
        engine = RolloutEngine(CounterEnv, hangs_forever, build_tokenizer(), generate_timeout_s=1.0)
        """,
        "engine.run([0, 1], 2, SamplingParams())",
    )
    assert report["seconds"] < 3.0, report  # one deadline, not retried
    assert report["reasons"] == ["error"] * 4, report
    assert all("generation took longer than 1s" in error for error in report["errors"]), report
    # A process that waited for the hung call would never exit (the 60 s limit above); 20 s leaves room for interpreter
    # teardown on a loaded CI machine (9 s seen with every core busy).
    assert exited_after < 20.0, exited_after
