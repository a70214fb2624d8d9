"""One-prompt async generation over a backend that generates in batches.

:class:`MicroBatcher` turns ``backend.generate(prompts, sampling, seeds=...)`` into ``await batcher(prompt, sampling,
seed)``. Requests queue up; whenever the backend is free, everything waiting (with the same sampling settings) goes
as one batch, so a fast episode never waits for a full round of slow ones. Requests that differ only in
``max_new_tokens`` share a batch (the backend contract gives each prompt its own budget). A
batch that raises is bisected, so one prompt that breaks the backend fails only its own request; a backend that fails
every call (no call succeeds, down to a single prompt) fails the batch in ``1 + 2·log2(n)`` calls, not one per prompt.

Deadlines count from when a batch's backend call starts, never time queued behind other calls. A batch that runs past
``timeout_s`` fails its requests with :class:`GenerationTimeout` (not bisected: a hung backend is not one prompt's
fault) and is abandoned on its daemon thread, so a hung backend ends episodes instead of stalling the run, and never
keeps the process from exiting. A call abandoned any other way (its run cancelled or ended) is still running too. The
backend object is never called while one of its calls runs, whichever batcher, engine or run made it: a new call
waits for it up to that call's own deadline, and past it fails at once (a hung backend).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from envkit.backends import Generation, SamplingParams
from envkit.backends.base import Backend, GenerationTimeout
from envkit.util.background import DeadlinePassed, within
from envkit.workers import DaemonPool

__all__ = ["GenerationTimeout", "MicroBatcher", "generate_within"]

logger = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    seed: int | None
    future: asyncio.Future[Generation]
    key: str
    """Requests with equal keys go in one backend call (``MicroBatcher._key``, computed once per request)."""


@dataclass
class _Running:
    """One ``backend.generate`` call on its thread: set ``returned`` when it returns; its deadline (monotonic)."""

    returned: threading.Event
    deadline: float | None
    timeout_s: float | None


_RUNNING_LOCK = threading.Lock()
_RUNNING: weakref.WeakKeyDictionary[Any, _Running] = weakref.WeakKeyDictionary()
_RUNNING_BY_ID: dict[int, _Running] = {}  # backends that cannot be weakly referenced (e.g. __slots__ classes)


def _running(backend: Any) -> _Running | None:
    try:
        return _RUNNING.get(backend)
    except TypeError:
        return _RUNNING_BY_ID.get(id(backend))


def _set_running(backend: Any, running: _Running | None) -> None:
    try:
        if running is None:
            _RUNNING.pop(backend, None)
        else:
            _RUNNING[backend] = running
    except TypeError:
        if running is None:
            _RUNNING_BY_ID.pop(id(backend), None)
        else:
            _RUNNING_BY_ID[id(backend)] = running


@dataclass
class _Bisection:
    """What the bisection of one failed batch has learnt: whether any call succeeded (the backend works), and
    whether it concluded that the backend is broken (every call failed with the batch's error, a single prompt too)."""

    error: Exception
    worked: bool = False
    broken: bool = False


class MicroBatcher:
    """Continuous batching in front of a batch backend (transformers, an in-process ``vllm.LLM``, any custom one).

    Args:
        backend: A :class:`~envkit.backends.base.Backend`: ``generate(prompts, sampling, seeds=, max_new_tokens=)``
            (one seed, one token budget per prompt).
        gather_s: When a batch is about to start while env calls are still running, wait up to this long for them to
            join (a fuller batch is worth a few milliseconds when generation dominates).
        envs_busy: How many episodes are inside env calls right now (the engine keeps the count).
        hold: While it returns True, no batch starts (the engine holds a run's first batch until every episode that
            has an env slot has asked for its first turn: episodes that open their envs later than the others
            would otherwise generate in batches of their own for the rest of the run, never re-merging).
        timeout_s: Deadline of one ``backend.generate`` call, from when it starts (None: none). Past it the call's
            requests fail with :class:`GenerationTimeout` and the call is abandoned.
    """

    def __init__(
        self,
        backend: Backend,
        *,
        gather_s: float = 0.05,
        envs_busy: Callable[[], int] = lambda: 0,
        timeout_s: float | None = None,
        hold: Callable[[], bool] = lambda: False,
    ) -> None:
        self.backend = backend
        self.gather_s = gather_s
        self.envs_busy = envs_busy
        self.hold = hold
        self.timeout_s = timeout_s
        self._threads = DaemonPool()
        self._queue: list[_Request] = []
        self._worker: asyncio.Task[None] | None = None
        self._arrived: asyncio.Event | None = None
        self.batches = 0
        """Backend calls made (a measure of batching)."""
        self.timed_out = 0
        """Backend calls abandoned past ``timeout_s``."""

    async def __call__(self, prompt: list[int], sampling: SamplingParams, seed: int | None = None) -> Generation:
        """Generate one continuation of ``prompt`` (read, not copied: leave it unchanged until the call returns)."""
        loop = asyncio.get_running_loop()
        request = _Request(prompt, sampling, seed, loop.create_future(), self._key(sampling))
        self._queue.append(request)
        if self._arrived is not None:
            self._arrived.set()
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._drain())
        return await request.future

    def notify(self) -> None:
        """An env call finished: a batch waiting for stragglers may start early."""
        if self._arrived is not None:
            self._arrived.set()

    async def _drain(self) -> None:
        self._arrived = asyncio.Event()
        while self._queue:
            await asyncio.sleep(0)  # coroutines made ready by the last batch enqueue first
            while self.hold():  # woken by each arrival and env call's end; re-checked now and then regardless
                self._arrived.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), max(self.gather_s, 0.01))
            deadline = asyncio.get_running_loop().time() + self.gather_s
            while self.envs_busy() > 0:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except asyncio.TimeoutError:
                    break
            self._queue = [r for r in self._queue if not r.future.done()]  # episodes that gave up (cancelled)
            if not self._queue:
                break
            key = self._queue[0].key
            batch = [r for r in self._queue if r.key == key]
            self._queue = [r for r in self._queue if r.key != key]
            await self._run(batch)
        self._arrived = None

    def _key(self, sampling: SamplingParams) -> str:
        """Requests with equal keys go in one backend call: their sampling but for the seed and the token budget."""
        return repr(dataclasses.replace(sampling, seed=None, max_new_tokens=0))

    async def _run(self, batch: list[_Request]) -> None:
        try:
            results = await self._call(batch)
        except Exception as error:
            await self._isolate(batch, error)
            return
        for request, result in zip(batch, results, strict=True):
            _settle(request, result)

    async def _isolate(self, batch: list[_Request], error: Exception) -> None:
        """``batch`` raised ``error``: find the prompt(s) that break the backend by bisection, so the others still
        get answers in about 2·log2(n) calls per bad prompt. Once any call succeeds, the backend works and every
        failure is its prompts'. While none has, and a single prompt fails with the batch's error too, the backend
        itself is broken: every request left fails at once (``1 + 2·log2(n)`` calls in all, not a call each). A
        timeout is the backend's, not a prompt's: it fails its requests, unbisected."""
        await self._bisect(batch, error, _Bisection(error))

    async def _bisect(self, batch: list[_Request], error: Exception, state: _Bisection) -> None:
        batch = [r for r in batch if not r.future.done()]
        if state.broken:
            _fail(batch, state.error)
            return
        if len(batch) <= 1 or isinstance(error, GenerationTimeout):
            _fail(batch, error)
            if len(batch) == 1 and not state.worked and _same_error(error, state.error):
                state.broken = True  # every call failed alike, down to one prompt: not the prompts' fault
            return
        middle = len(batch) // 2
        failures: list[tuple[list[_Request], Exception]] = []
        for half in (batch[:middle], batch[middle:]):
            try:
                results = await self._call(half)
            except GenerationTimeout as timeout:
                _fail(half, timeout)
                continue
            except Exception as half_error:
                failures.append((half, half_error))
                continue
            state.worked = True
            for request, result in zip(half, results, strict=True):
                _settle(request, result)
        for half, half_error in failures:
            await self._bisect(half, half_error, state)

    async def _call(self, batch: list[_Request]) -> list[Any]:
        """One ``backend.generate`` call for ``batch`` (its seeds, and its token budgets when they differ)."""
        self.batches += 1
        prompts = [r.prompt for r in batch]
        seeds = [r.seed for r in batch]
        sampling = batch[0].sampling
        kwargs: dict[str, Any] = {}
        if any(s is not None for s in seeds):
            kwargs["seeds"] = seeds
        budgets = [r.sampling.max_new_tokens for r in batch]
        if len(set(budgets)) > 1:
            sampling = dataclasses.replace(sampling, max_new_tokens=max(budgets))
            kwargs["max_new_tokens"] = budgets
        results = await self._on_thread(lambda: self.backend.generate(prompts, sampling, **kwargs))
        if len(results) != len(prompts):
            raise RuntimeError(f"returned {len(results)} generations for {len(prompts)} prompts")
        return list(results)

    async def _on_thread(self, function: Callable[[], Any]) -> Any:
        """``function()`` on a daemon thread (a hung call is abandoned: it never blocks the loop's shutdown or the
        interpreter's exit, as the loop's default executor would), within ``timeout_s`` from its start.

        In-process engines are not safe to call from two threads, and a call abandoned past its deadline or by a
        cancelled run still runs: the backend is never called while one of its calls runs (whichever batcher made
        it). This call waits for it until that call's own deadline; past it, it fails at once (a hung backend)."""
        name = type(self.backend).__name__
        returned = threading.Event()
        pause = 0.001
        while True:
            with _RUNNING_LOCK:
                running = _running(self.backend)
                if running is None or running.returned.is_set():
                    deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
                    mine = _Running(returned, deadline, self.timeout_s)
                    _set_running(self.backend, mine)
                    break
            if running.deadline is not None and time.monotonic() >= running.deadline:
                raise GenerationTimeout(
                    f"generation not attempted: an earlier {name}.generate call is still running past its "
                    f"{running.timeout_s:g}s deadline (a hung backend)"
                )
            await asyncio.sleep(pause)
            pause = min(2 * pause, 0.02)

        def call() -> Any:
            try:
                return function()
            finally:
                with _RUNNING_LOCK:
                    returned.set()
                    if _running(self.backend) is mine:
                        _set_running(self.backend, None)

        try:
            return await within(self._threads.future(asyncio.get_running_loop(), call), self.timeout_s)
        except DeadlinePassed:
            self.timed_out += 1
            raise GenerationTimeout(
                f"generation took longer than {self.timeout_s:g}s ({name}.generate did not return: a hung backend?)"
            ) from None


def _fail(requests: list[_Request], error: BaseException) -> None:
    for request in requests:
        _settle(request, error=error)


def _same_error(*errors: BaseException) -> bool:
    return len({(type(e), str(e)) for e in errors}) == 1


def _settle(request: _Request, result: Any = None, *, error: BaseException | None = None) -> None:
    if request.future.done():  # the episode gave up waiting (cancelled)
        return
    if error is not None:
        request.future.set_exception(error)
    else:
        request.future.set_result(result)


async def generate_within(
    generate: MicroBatcher | Callable[..., Awaitable[Generation]],
    prompt: list[int],
    sampling: SamplingParams,
    seed: int | None,
    timeout_s: float | None,
) -> Generation:
    """``await generate(prompt, sampling, seed)`` with a deadline of ``timeout_s`` (None: none) counted from when the
    request enters the backend, not while it queues behind healthy calls; past it :class:`GenerationTimeout`.

    A :class:`MicroBatcher` times each backend call itself (its own ``timeout_s``); anything else is an
    :class:`~envkit.backends.base.AsyncBackend`'s ``agenerate``, handed the deadline (the backend counts it from when
    the request enters it: a server request from when it gets one of its ``max_concurrency`` slots).
    """
    if isinstance(generate, MicroBatcher):
        return await generate(prompt, sampling, seed)
    return await generate(prompt, sampling, seed, timeout_s=timeout_s)
