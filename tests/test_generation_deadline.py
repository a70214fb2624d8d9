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
from helpers import CounterEnv

from envkit.backends import FaultyBackend, OpenAIBackend, RecordingBackend, SamplingParams, ScriptedBackend
from envkit.rollout import RolloutEngine


def timed_calls(tokenizer, seconds: float, first_s: float | None = None) -> RecordingBackend:
    """A batch backend replying ``Done.`` whose calls take ``seconds`` each (the first ``first_s``); the recorder
    counts calls and the calls inside at once."""
    done = ScriptedBackend("Done.<|im_end|>", tokenizer=tokenizer, accepts=())
    return RecordingBackend(FaultyBackend(done, delay_s=seconds, first_delay_s=first_s))


class StaggeredEnv(CounterEnv):
    """Every episode but task 0 resets 0.1 s late, so its request queues behind task 0's running backend call."""

    def reset(self, *, seed=None, options=None):
        if seed:
            time.sleep(0.1)
        return super().reset(seed=seed, options=options)


def test_requests_queued_behind_a_healthy_batch_call_do_not_time_out(local_tokenizer):
    """Every call takes 0.81 s under a 1 s limit: the episodes that wait for task 0's call to finish before theirs
    starts were failed as hung (their wait counted); the deadline is each call's own, so all 8 finish."""
    backend = timed_calls(local_tokenizer, 0.81)
    engine = RolloutEngine(StaggeredEnv, backend, local_tokenizer, max_turns=1, generate_timeout_s=1.0, gather_s=0.0)
    episodes = engine.run(list(range(8)), 1, SamplingParams())
    assert [e.error for e in episodes] == [None] * 8
    assert len(backend.calls) >= 2  # some episodes did queue behind a running call


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
    """One request at a time (``max_concurrency=1``), 0.4 s each, a 1 s limit: the fourth request waits 1.2 s for its
    slot, which is not the server hanging; the deadline starts when the request gets its slot."""
    with SlowServer(local_tokenizer, 0.4) as server:
        backend = OpenAIBackend(server.url, "tiny", max_concurrency=1)
        engine = RolloutEngine(CounterEnv, backend, local_tokenizer, max_turns=1, generate_timeout_s=1.0)
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
    """The first call hangs for 1 s past a 0.3 s deadline. Runs that start while it still runs, on the same engine
    or on a new engine over the same backend (the next GRPO step, an eval), fail at once instead of calling the
    backend beside it; once it returned, the backend serves again."""
    backend = timed_calls(local_tokenizer, 0.0, first_s=1.3)
    engine = RolloutEngine(CounterEnv, backend, local_tokenizer, max_turns=1, generate_timeout_s=0.3)
    first = engine.run([0, 1], 1, SamplingParams())
    assert all(e.finish_reason == "error" and "took longer than 0.3s" in e.error for e in first)
    again = engine.run([0, 1], 1, SamplingParams())
    other = RolloutEngine(CounterEnv, backend, local_tokenizer, max_turns=1, generate_timeout_s=0.3)
    beside = other.run([0, 1], 1, SamplingParams())
    for episode in again + beside:
        assert episode.finish_reason == "error" and "still running past its 0.3s deadline" in episode.error
    assert backend.max_inside == 1 and len(backend.calls) == 1
    backend.wait_idle()
    after = other.run([0, 1], 1, SamplingParams())
    assert [e.error for e in after] == [None, None] and backend.max_inside == 1


def test_a_call_left_running_by_a_cancelled_run_is_waited_for_by_the_next_run(local_tokenizer):
    """A run cancelled while its backend call runs (well within its deadline) leaves that call running: the next
    run waits for it instead of calling the backend beside it, and then succeeds."""
    backend = timed_calls(local_tokenizer, 0.0, first_s=0.8)
    engine = RolloutEngine(CounterEnv, backend, local_tokenizer, max_turns=1, generate_timeout_s=30.0)

    async def cancelled() -> None:
        await asyncio.wait_for(engine.arun([0, 1], 1, SamplingParams()), 0.4)

    with pytest.raises(asyncio.TimeoutError):
        asyncio.run(cancelled())
    assert backend.inside == 1  # the cancelled run's call is still in the backend
    episodes = engine.run([0, 1], 1, SamplingParams())
    assert [e.error for e in episodes] == [None, None]
    assert backend.max_inside == 1 and len(backend.calls) == 2
