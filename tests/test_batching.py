"""MicroBatcher, the engine's front to batch backends: requests that wait together share one backend call, a prompt
that breaks the backend fails only its own request, and an episode that gave up is not generated for."""

from __future__ import annotations

import asyncio
import threading

import pytest

from envkit.backends import Generation, SamplingParams
from envkit.rollout.batching import GenerationTimeout, MicroBatcher

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=4)


class RecordingBackend:
    """Echoes each prompt's last token; raises on prompts containing ``bad``; holds the first call until released."""

    def __init__(self, bad: int | None = None, hold_first: bool = False) -> None:
        self.calls: list[list[list[int]]] = []
        self.bad = bad
        self.release = threading.Event()
        if not hold_first:
            self.release.set()

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        self.calls.append([list(p) for p in prompts])
        if len(self.calls) == 1:
            self.release.wait(5)
        if self.bad is not None and any(self.bad in p for p in prompts):
            raise RuntimeError("this prompt breaks the backend")
        return [Generation(token_ids=[p[-1]], logprobs=[0.0], finish_reason="stop") for p in prompts]


def test_waiting_requests_share_one_call_and_a_bad_prompt_fails_alone():
    backend = RecordingBackend(bad=666)
    batcher = MicroBatcher(backend)

    async def main():
        return await asyncio.gather(*(batcher([1, n], SAMPLING) for n in (10, 666, 30)), return_exceptions=True)

    results = asyncio.run(main())
    assert [r.token_ids for r in (results[0], results[2])] == [[10], [30]]
    assert isinstance(results[1], RuntimeError)
    assert backend.calls[0] == [[1, 10], [1, 666], [1, 30]]  # one batch first, then one prompt at a time


def test_a_cancelled_request_is_not_generated():
    """An episode cancelled while its request waits behind a running batch costs the backend nothing."""
    backend = RecordingBackend(hold_first=True)
    batcher = MicroBatcher(backend)

    async def main():
        first = asyncio.ensure_future(batcher([1, 1], SAMPLING))
        await asyncio.sleep(0.05)  # the first batch is running (held)
        doomed = asyncio.ensure_future(batcher([2, 2], SAMPLING))
        kept = asyncio.ensure_future(batcher([3, 3], SAMPLING))
        await asyncio.sleep(0.01)
        doomed.cancel()
        backend.release.set()
        return await first, await kept

    first, kept = asyncio.run(main())
    assert (first.token_ids, kept.token_ids) == ([1], [3])
    assert backend.calls == [[[1, 1]], [[3, 3]]]


class FailingBackend:
    """Raises on any batch holding a prompt whose last token is in ``bad`` (with that token in the message, unless
    ``same_message``), or on every call when ``broken``; counts its calls."""

    def __init__(self, bad: set[int] = frozenset(), broken: bool = False, same_message: bool = False) -> None:
        self.bad, self.broken, self.same_message, self.calls = bad, broken, same_message, 0

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        self.calls += 1
        if self.broken:
            raise RuntimeError("engine dead")
        for prompt in prompts:
            if prompt[-1] in self.bad:
                which = "a prompt" if self.same_message else f"prompt {prompt[-1]}"
                raise RuntimeError(f"{which} breaks the backend")
        return [Generation(token_ids=[p[-1]], logprobs=[0.0], finish_reason="stop") for p in prompts]


def run_batch(backend, count: int = 16) -> list:
    """``count`` requests that wait together, so they go as one batch."""
    batcher = MicroBatcher(backend)

    async def main():
        return await asyncio.gather(*(batcher([0, n], SAMPLING) for n in range(count)), return_exceptions=True)

    return asyncio.run(main())


def test_one_bad_prompt_in_a_batch_is_found_by_bisection():
    backend = FailingBackend(bad={11})
    results = run_batch(backend)
    assert [i for i, r in enumerate(results) if isinstance(r, Exception)] == [11]
    assert [r.token_ids for i, r in enumerate(results) if i != 11] == [[i] for i in range(16) if i != 11]
    assert backend.calls <= 1 + 2 * 4  # the batch, then two halves per level: not 1 + 16 single calls


def test_two_bad_prompts_in_different_halves_fail_alone():
    backend = FailingBackend(bad={2, 13})
    results = run_batch(backend)
    assert [i for i, r in enumerate(results) if isinstance(r, Exception)] == [2, 13]
    assert "prompt 13 breaks" in str(results[13])


@pytest.mark.parametrize("count", [8, 16])
def test_bad_prompts_where_the_bisection_looks_first_fail_alone(count):
    """Bad prompts at 0 and count/2 raising the same message: the first prompt of each half fails alike, which is no
    proof that the backend is broken (the other prompts work): only the two bad ones fail."""
    backend = FailingBackend(bad={0, count // 2}, same_message=True)
    results = run_batch(backend, count)
    assert [i for i, r in enumerate(results) if isinstance(r, Exception)] == [0, count // 2]
    assert [r.token_ids for i, r in enumerate(results) if i not in (0, count // 2)] == [
        [i] for i in range(count) if i not in (0, count // 2)
    ]


@pytest.mark.parametrize(("count", "calls"), [(16, 9), (64, 13)])
def test_a_broken_backend_fails_the_batch_fast(count, calls):
    """A backend that fails every call: 1 + 2·log2(n) calls fail all n requests (one each would cost n + 1), the
    error kept."""
    backend = FailingBackend(broken=True)
    results = run_batch(backend, count)
    assert all(isinstance(r, RuntimeError) and "engine dead" in str(r) for r in results)
    assert backend.calls == calls


def test_a_hung_backend_call_fails_at_the_deadline_and_the_backend_is_not_called_again_until_it_returns():
    backend = RecordingBackend(hold_first=True)  # the first call hangs until released, long after its deadline
    batcher = MicroBatcher(backend, timeout_s=0.3)

    async def main():
        first = asyncio.ensure_future(batcher([1, 10], SAMPLING))
        await asyncio.sleep(0.05)  # the first batch is in the backend now
        second = asyncio.ensure_future(batcher([1, 20], SAMPLING))
        outcomes = await asyncio.gather(first, second, return_exceptions=True)
        backend.release.set()  # the hung call returns at last (its result is dropped)
        await asyncio.sleep(0.1)
        return [*outcomes, await batcher([1, 30], SAMPLING)]

    try:
        first, second, third = asyncio.run(main())
    finally:
        backend.release.set()
    assert isinstance(first, GenerationTimeout) and "took longer than 0.3s" in str(first)
    # An in-process engine is not safe to call from a second thread while the first call still runs in it: the
    # requests that come meanwhile fail at once, naming the hung call, instead of stepping the same engine.
    assert isinstance(second, GenerationTimeout) and "still running past its 0.3s deadline" in str(second)
    assert third.token_ids == [30] and len(backend.calls) == 2  # once it returned, the backend serves again
    assert batcher.timed_out == 1


def test_a_timeout_error_the_backend_raises_itself_is_its_error_not_the_deadline():
    class SocketTimeouts(RecordingBackend):
        def generate(self, prompts, sampling):
            if any(666 in p for p in prompts):
                raise TimeoutError("socket read timed out")
            return super().generate(prompts, sampling)

    batcher = MicroBatcher(SocketTimeouts(), timeout_s=30)

    async def main():
        return await asyncio.gather(*(batcher([1, n], SAMPLING) for n in (10, 666, 30)), return_exceptions=True)

    good, bad, other = asyncio.run(main())
    assert type(bad) is TimeoutError and str(bad) == "socket read timed out"  # bisected to its prompt, as it is
    assert good.token_ids == [10] and other.token_ids == [30] and batcher.timed_out == 0
