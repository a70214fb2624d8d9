"""The generation deadline counts from when a request enters the backend, never time queued behind healthy calls; a
backend call abandoned by its run (past its deadline, or the run cancelled) keeps the backend to itself until it
returns, across runs and engines (issue 22 item 6)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from helpers import RELEASE_CAP_S, CounterEnv, backend_is_free, wait_until

from envkit.backends import FaultyBackend, OpenAIBackend, RecordingBackend, SamplingParams, ScriptedBackend
from envkit.rollout import RolloutEngine


def timed_calls(tokenizer, seconds: float, first_s: float | None = None) -> RecordingBackend:
    """A batch backend replying ``Done.`` whose calls take ``seconds`` each (the first ``first_s``); the recorder
    counts calls and the calls inside at once."""
    done = ScriptedBackend("Done.<|im_end|>", tokenizer=tokenizer)
    return RecordingBackend(FaultyBackend(done, delay_s=seconds, first_delay_s=first_s))


class StaggeredEnv(CounterEnv):
    """Every episode but task 0 resets once task 0's backend call has started (``backend``: the recorder), so its
    request queues behind that running call (ordered by the call, not by a delay)."""

    backend: RecordingBackend

    def reset(self, *, seed=None, options=None):
        if seed:
            wait_until(lambda: self.backend.calls, "task 0's backend call started")
        return super().reset(seed=seed, options=options)


def test_requests_queued_behind_a_healthy_batch_call_do_not_time_out(local_tokenizer):
    """Task 0's call takes 1.4 s and the next 1 s, under a 2 s limit: the episodes that wait for task 0's call to
    finish before theirs starts (~1.4 s, then 1 s of their own) were failed as hung (their wait counted); the deadline
    is each call's own, so all 8 finish. Each call is 0.6 s or more inside its limit: a loaded machine does not
    stretch a sleep that far."""
    backend = timed_calls(local_tokenizer, 1.0, first_s=1.4)
    StaggeredEnv.backend = backend
    engine = RolloutEngine(StaggeredEnv, backend, local_tokenizer, max_turns=1, generate_timeout_s=2.0, gather_s=0.0)
    episodes = engine.run(list(range(8)), 1, SamplingParams())
    assert [e.error for e in episodes] == [None] * 8
    assert len(backend.calls) >= 2 and len(backend.calls[0].prompts) == 1  # task 0 alone, the others queued behind


class SlowServer:
    """An OpenAI-compatible completion server taking ``seconds`` per request (one reply: ``Done.<|im_end|>``)."""

    def __init__(self, tokenizer, seconds: float) -> None:
        tokens = tokenizer.encode("Done.<|im_end|>", add_special_tokens=False)
        logprobs = {"tokens": [f"token_id:{t}" for t in tokens], "token_logprobs": [-1.0] * len(tokens)}
        choice = {"finish_reason": "stop", "token_ids": tokens, "logprobs": logprobs}
        payload = json.dumps({"choices": [choice]}).encode()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format, *args):
                return

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(seconds)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def test_requests_queued_for_an_openai_backend_slot_do_not_time_out(local_tokenizer):
    """One request at a time (``max_concurrency=1``), 0.8 s each, a 2 s limit: the fourth request waits 2.4 s for its
    slot, which is not the server hanging; the deadline starts when the request gets its slot. (1.2 s to spare per
    request: a loaded machine does not stretch a 0.8 s sleep that far.)"""
    with SlowServer(local_tokenizer, 0.8) as server:
        backend = OpenAIBackend(server.url, "tiny", max_concurrency=1)
        engine = RolloutEngine(CounterEnv, backend, local_tokenizer, max_turns=1, generate_timeout_s=2.0)
        episodes = engine.run([0, 1, 2, 3], 1, SamplingParams())
    assert [e.error for e in episodes] == [None] * 4


def test_an_openai_request_past_its_own_deadline_still_times_out(local_tokenizer):
    with SlowServer(local_tokenizer, 1.0) as server:
        backend = OpenAIBackend(server.url, "tiny")
        engine = RolloutEngine(CounterEnv, backend, local_tokenizer, max_turns=1, generate_timeout_s=0.3)
        episodes = engine.run([0, 1], 1, SamplingParams())
    assert all(e.finish_reason == "error" and "generation took longer than 0.3s" in e.error for e in episodes)
    assert all("raise generate_timeout_s" in e.error for e in episodes)


def test_after_a_run_whose_deadline_fired_the_backend_is_never_called_beside_the_abandoned_call(local_tokenizer):
    """The first call hangs (until the test releases it) past a 2 s deadline. Runs that start while it still runs,
    on the same engine or on a new engine over the same backend (the next GRPO step, an eval), fail at once instead of
    calling the backend beside it; once it returned, the backend serves again (well within its 2 s)."""
    hung = FaultyBackend(ScriptedBackend("Done.<|im_end|>", tokenizer=local_tokenizer), hang_calls=1)
    backend = RecordingBackend(hung)
    engine = RolloutEngine(CounterEnv, backend, local_tokenizer, max_turns=1, generate_timeout_s=2.0)
    try:
        first = engine.run([0, 1], 1, SamplingParams())
        assert all(e.finish_reason == "error" and "took longer than 2s" in e.error for e in first)
        again = engine.run([0, 1], 1, SamplingParams())
        other = RolloutEngine(CounterEnv, backend, local_tokenizer, max_turns=1, generate_timeout_s=2.0)
        beside = other.run([0, 1], 1, SamplingParams())
    finally:
        hung.release()
    for episode in again + beside:
        assert episode.finish_reason == "error" and "still running past its 2s deadline" in episode.error
    assert backend.max_inside == 1 and len(backend.calls) == 1
    wait_until(lambda: backend_is_free(backend), "the released call returned")
    after = other.run([0, 1], 1, SamplingParams())
    assert [e.error for e in after] == [None, None] and backend.max_inside == 1


def test_a_call_left_running_by_a_cancelled_run_is_waited_for_by_the_next_run(local_tokenizer):
    """A run cancelled while its backend call runs (well within its deadline: it blocks until the test releases it)
    leaves that call running: the next run waits for it instead of calling the backend beside it, and then succeeds.
    The call is released once the next run's envs are open (on a thread: the run blocks this one)."""
    hung = FaultyBackend(ScriptedBackend("Done.<|im_end|>", tokenizer=local_tokenizer), hang_calls=1)
    backend = RecordingBackend(hung)
    resets = []

    class Counted(CounterEnv):
        def reset(self, *, seed=None, options=None):
            resets.append(seed)
            return super().reset(seed=seed, options=options)

    engine = RolloutEngine(Counted, backend, local_tokenizer, max_turns=1, generate_timeout_s=30.0)

    async def cancelled() -> None:
        run = asyncio.ensure_future(engine.arun([0, 1], 1, SamplingParams()))
        give_up = time.monotonic() + RELEASE_CAP_S
        while not backend.inside:
            assert time.monotonic() < give_up and not run.done(), "the run never called the backend"
            await asyncio.sleep(0.01)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    def release_once_the_next_run_is_open(opened: int) -> None:
        wait_until(lambda: len(resets) == opened + 2, "the next run's resets")
        hung.release()

    releaser = None
    try:
        asyncio.run(cancelled())
        assert backend.inside == 1  # the cancelled run's call is still in the backend
        releaser = threading.Thread(target=release_once_the_next_run_is_open, args=(len(resets),))
        releaser.start()
        episodes = engine.run([0, 1], 1, SamplingParams())
    finally:
        hung.release()
    if releaser is not None:
        releaser.join()
    assert [e.error for e in episodes] == [None, None]
    assert backend.max_inside == 1 and len(backend.calls) >= 2  # never two at once (one batch or two)
