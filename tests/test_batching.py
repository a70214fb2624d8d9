"""MicroBatcher, the engine's front to batch backends: requests that wait together share one backend call, a prompt
that breaks the backend fails only its own request, and an episode that gave up is not generated for."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
from helpers import RELEASE_CAP_S, backend_is_free, wait_until

from envkit.backends import FaultyBackend, RecordingBackend, SamplingParams, ScriptedBackend
from envkit.rollout.batching import GenerationTimeout, MicroBatcher

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=4)


def echo(**faults) -> FaultyBackend:
    """A backend that echoes each prompt's last token, with ``faults`` (``FaultyBackend``'s keywords)."""
    return FaultyBackend(ScriptedBackend(lambda request: request.ids[-1:], logprob=0.0), **faults)


def breaks_on(*tokens: int, error: type[Exception] = RuntimeError, message: str | None = None):
    """A ``fail_if``: a prompt whose last token is one of ``tokens`` breaks the batch it is in (with that token in the
    message, unless ``message`` is given)."""

    def fail_if(request):
        last = request.ids[-1]
        return error(message or f"prompt {last} breaks the backend") if last in tokens else None

    return fail_if


def test_waiting_requests_share_one_call_and_a_bad_prompt_fails_alone():
    backend = RecordingBackend(echo(fail_if=breaks_on(666)))
    batcher = MicroBatcher(backend)

    async def main():
        return await asyncio.gather(*(batcher([1, n], SAMPLING) for n in (10, 666, 30)), return_exceptions=True)

    results = asyncio.run(main())
    assert [r.token_ids for r in (results[0], results[2])] == [[10], [30]]
    assert isinstance(results[1], RuntimeError)
    assert backend.calls[0].prompts == [[1, 10], [1, 666], [1, 30]]  # one batch first, then one prompt at a time


def test_a_cancelled_request_is_not_generated():
    """An episode cancelled while its request waits behind a running batch costs the backend nothing."""
    faulty = echo(hang_calls=1)
    backend = RecordingBackend(faulty)
    batcher = MicroBatcher(backend)

    async def main():
        first = asyncio.ensure_future(batcher([1, 1], SAMPLING))
        await asyncio.sleep(0.05)  # the first batch is running (held)
        doomed = asyncio.ensure_future(batcher([2, 2], SAMPLING))
        kept = asyncio.ensure_future(batcher([3, 3], SAMPLING))
        await asyncio.sleep(0.01)
        doomed.cancel()
        faulty.release()
        return await first, await kept

    first, kept = asyncio.run(main())
    assert (first.token_ids, kept.token_ids) == ([1], [3])
    assert [call.prompts for call in backend.calls] == [[[1, 1]], [[3, 3]]]


def run_batch(backend, count: int = 16) -> list:
    """``count`` requests that wait together, so they go as one batch."""
    batcher = MicroBatcher(backend)

    async def main():
        return await asyncio.gather(*(batcher([0, n], SAMPLING) for n in range(count)), return_exceptions=True)

    return asyncio.run(main())


def test_one_bad_prompt_in_a_batch_is_found_by_bisection():
    backend = echo(fail_if=breaks_on(11))
    results = run_batch(backend)
    assert [i for i, r in enumerate(results) if isinstance(r, Exception)] == [11]
    assert [r.token_ids for i, r in enumerate(results) if i != 11] == [[i] for i in range(16) if i != 11]
    assert backend.calls <= 1 + 2 * 4  # the batch, then two halves per level: not 1 + 16 single calls


def test_two_bad_prompts_in_different_halves_fail_alone():
    backend = echo(fail_if=breaks_on(2, 13))
    results = run_batch(backend)
    assert [i for i, r in enumerate(results) if isinstance(r, Exception)] == [2, 13]
    assert "prompt 13 breaks" in str(results[13])


@pytest.mark.parametrize("count", [8, 16])
def test_bad_prompts_where_the_bisection_looks_first_fail_alone(count):
    """Bad prompts at 0 and count/2 raising the same message: the first prompt of each half fails alike, which is no
    proof that the backend is broken (the other prompts work): only the two bad ones fail."""
    backend = echo(fail_if=breaks_on(0, count // 2, message="a prompt breaks the backend"))
    results = run_batch(backend, count)
    assert [i for i, r in enumerate(results) if isinstance(r, Exception)] == [0, count // 2]
    assert [r.token_ids for i, r in enumerate(results) if i not in (0, count // 2)] == [
        [i] for i in range(count) if i not in (0, count // 2)
    ]


@pytest.mark.parametrize(("count", "calls"), [(16, 9), (64, 13)])
def test_a_broken_backend_fails_the_batch_fast(count, calls):
    """A backend that fails every call: 1 + 2·log2(n) calls fail all n requests (one each would cost n + 1), the
    error kept."""
    backend = echo(fail_calls=math.inf, error=RuntimeError("engine dead"))
    results = run_batch(backend, count)
    assert all(isinstance(r, RuntimeError) and "engine dead" in str(r) for r in results)
    assert backend.calls == calls


def test_a_hung_backend_call_fails_at_the_deadline_and_the_backend_is_not_called_again_until_it_returns():
    faulty = echo(hang_calls=1)  # the first call hangs until released, long after its deadline
    backend = RecordingBackend(faulty)
    batcher = MicroBatcher(backend, timeout_s=2.0)  # only the hung call may reach it

    async def main():
        first = asyncio.ensure_future(batcher([1, 10], SAMPLING))
        give_up = time.monotonic() + RELEASE_CAP_S
        while not backend.inside:  # the first batch is in the backend now
            assert time.monotonic() < give_up, "the first batch never reached the backend"
            await asyncio.sleep(0.01)
        second = asyncio.ensure_future(batcher([1, 20], SAMPLING))
        outcomes = await asyncio.gather(first, second, return_exceptions=True)
        faulty.release()  # the hung call returns at last (its result is dropped)
        await asyncio.to_thread(wait_until, lambda: backend_is_free(backend), "the released call returned")
        return [*outcomes, await batcher([1, 30], SAMPLING)]

    try:
        first, second, third = asyncio.run(main())
    finally:
        faulty.release()
    assert isinstance(first, GenerationTimeout) and "took longer than 2s" in str(first)
    # An in-process engine is not safe to call from a second thread while the first call still runs in it: the
    # requests that come meanwhile fail at once, naming the hung call, instead of stepping the same engine.
    assert isinstance(second, GenerationTimeout) and "still running past its 2s deadline" in str(second)
    assert third.token_ids == [30] and len(backend.calls) == 2  # once it returned, the backend serves again
    assert batcher.timed_out == 1


def test_a_timeout_error_the_backend_raises_itself_is_its_error_not_the_deadline():
    socket_timeouts = echo(fail_if=breaks_on(666, error=TimeoutError, message="socket read timed out"))
    batcher = MicroBatcher(socket_timeouts, timeout_s=30)

    async def main():
        return await asyncio.gather(*(batcher([1, n], SAMPLING) for n in (10, 666, 30)), return_exceptions=True)

    good, bad, other = asyncio.run(main())
    assert type(bad) is TimeoutError and str(bad) == "socket read timed out"  # bisected to its prompt, as it is
    assert good.token_ids == [10] and other.token_ids == [30] and batcher.timed_out == 0
