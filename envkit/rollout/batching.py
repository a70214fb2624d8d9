"""One-prompt async generation over a backend that generates in batches.

:class:`MicroBatcher` turns ``backend.generate(prompts, sampling, seeds=...)`` into ``await batcher(prompt, sampling,
seed)``. Requests queue up; whenever the backend is free, everything waiting (with the same sampling settings) goes
as one batch, so a fast episode never waits for a full round of slow ones. A batch that raises is bisected, so one
prompt that breaks the backend fails only its own request, and a backend that fails every call fails the batch in five
calls, not one per prompt. A batch that runs past ``timeout_s`` fails its requests with :class:`GenerationTimeout`
(not bisected: a hung backend is not one prompt's fault) and is abandoned on its daemon thread, so a hung backend
ends episodes instead of stalling the run, and never keeps the process from exiting.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envkit._sync import DeadlinePassed, within
from envkit.backends import Generation, SamplingParams
from envkit.workers import DaemonPool

logger = logging.getLogger(__name__)


class GenerationTimeout(TimeoutError):
    """A generation did not come back within its deadline (a hung backend or server)."""


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    seed: int | None
    future: asyncio.Future[Generation]


class MicroBatcher:
    """Continuous batching in front of a batch backend (transformers, an in-process ``vllm.LLM``, any custom one).

    Args:
        backend: Has ``generate(prompts, sampling)`` and optionally a ``seeds=`` keyword.
        gather_s: When a batch is about to start while env calls are still running, wait up to this long for them to
            join (a fuller batch is worth a few milliseconds when generation dominates).
        envs_busy: How many episodes are inside env calls right now (the engine keeps the count).
        timeout_s: Deadline of one ``backend.generate`` call (None: none). Past it the call's requests fail with
            :class:`GenerationTimeout` and the call is abandoned.
    """

    def __init__(
        self,
        backend: Any,
        *,
        gather_s: float = 0.05,
        envs_busy: Callable[[], int] = lambda: 0,
        timeout_s: float | None = None,
    ) -> None:
        self.backend = backend
        self.gather_s = gather_s
        self.envs_busy = envs_busy
        self.timeout_s = timeout_s
        self._threads = DaemonPool()
        self.takes_seeds = "seeds" in inspect.signature(backend.generate).parameters
        self._queue: list[_Request] = []
        self._worker: asyncio.Task[None] | None = None
        self._arrived: asyncio.Event | None = None
        self._warned_seeds = False
        self.batches = 0
        """Backend calls made (a measure of batching)."""
        self.timed_out = 0
        """Backend calls abandoned past ``timeout_s``."""
        self._abandoned: threading.Event | None = None  # set when the last abandoned call returns

    async def __call__(self, prompt: list[int], sampling: SamplingParams, seed: int | None = None) -> Generation:
        """Generate one continuation of ``prompt``."""
        loop = asyncio.get_running_loop()
        request = _Request(list(prompt), sampling, seed, loop.create_future())
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
            key = _sampling_key(self._queue[0].sampling)
            batch = [r for r in self._queue if _sampling_key(r.sampling) == key]
            self._queue = [r for r in self._queue if _sampling_key(r.sampling) != key]
            await self._run(batch)
        self._arrived = None

    async def _run(self, batch: list[_Request]) -> None:
        try:
            results = await self._call([r.prompt for r in batch], batch[0].sampling, [r.seed for r in batch])
        except Exception as error:
            await self._isolate(batch, error)
            return
        for request, result in zip(batch, results, strict=True):
            _settle(request, result)

    async def _isolate(self, batch: list[_Request], error: Exception) -> None:
        """``batch`` raised ``error``: find the prompt(s) that break the backend by bisection, so the others still
        get answers in about 2·log2(n) calls. When both halves, and then one prompt of each, fail with the batch's
        error, the backend itself is broken: every request fails at once (five calls) instead of a call each. A
        timeout is the backend's, not a prompt's: it fails the whole batch, unbisected."""
        batch = [r for r in batch if not r.future.done()]
        if len(batch) <= 1 or isinstance(error, GenerationTimeout):
            _fail(batch, error)
            return
        middle = len(batch) // 2
        failures: list[tuple[list[_Request], Exception]] = []
        for half in (batch[:middle], batch[middle:]):
            try:
                results = await self._call([r.prompt for r in half], half[0].sampling, [r.seed for r in half])
            except GenerationTimeout as timeout:
                _fail(half, timeout)
                continue
            except Exception as half_error:
                failures.append((half, half_error))
                continue
            for request, result in zip(half, results, strict=True):
                _settle(request, result)
        if len(failures) == 2 and _same_error(*(e for _, e in failures), error):
            # Both halves fail alike: a broken backend, or a bad prompt in each. One prompt from each half tells.
            probe_errors = []
            for request in (batch[0], batch[middle]):
                try:
                    (result,) = await self._call([request.prompt], request.sampling, [request.seed])
                except GenerationTimeout as timeout:
                    _settle(request, error=timeout)
                    continue
                except Exception as probe_error:
                    probe_errors.append(probe_error)
                    _settle(request, error=probe_error)
                else:
                    _settle(request, result)
            if len(probe_errors) == 2 and _same_error(*probe_errors, error):
                _fail(batch, error)
                return
        for half, half_error in failures:
            await self._isolate(half, half_error)

    async def _call(self, prompts: list[list[int]], sampling: SamplingParams, seeds: list[int | None]) -> list[Any]:
        self.batches += 1
        kwargs: dict[str, Any] = {}
        if any(s is not None for s in seeds):
            if self.takes_seeds:
                kwargs["seeds"] = seeds
            elif not self._warned_seeds:
                self._warned_seeds = True
                logger.warning(
                    "%s.generate takes no seeds=: SamplingParams.seed cannot make its samples reproducible",
                    type(self.backend).__name__,
                )
        results = await self._on_thread(lambda: self.backend.generate(prompts, sampling, **kwargs))
        if len(results) != len(prompts):
            raise RuntimeError(f"returned {len(results)} generations for {len(prompts)} prompts")
        return list(results)

    async def _on_thread(self, function: Callable[[], Any]) -> Any:
        """``function()`` on a daemon thread (a hung call is abandoned: it never blocks the loop's shutdown or the
        interpreter's exit, as the loop's default executor would), within ``timeout_s``. While an abandoned call is
        still running, the backend is not called again (in-process engines are not safe to call from two threads):
        requests fail at once instead."""
        name = type(self.backend).__name__
        if self._abandoned is not None and not self._abandoned.is_set():
            raise GenerationTimeout(
                f"generation not attempted: an earlier {name}.generate call is still running past its "
                f"{self.timeout_s:g}s deadline (a hung backend)"
            )
        returned = threading.Event()

        def call() -> Any:
            try:
                return function()
            finally:
                returned.set()

        try:
            return await within(self._threads.future(asyncio.get_running_loop(), call), self.timeout_s)
        except DeadlinePassed:
            self.timed_out += 1
            self._abandoned = returned
            raise GenerationTimeout(
                f"generation took longer than {self.timeout_s:g}s ({name}.generate did not return: a hung backend?)"
            ) from None


def _fail(requests: list[_Request], error: BaseException) -> None:
    for request in requests:
        _settle(request, error=error)


def _same_error(*errors: BaseException) -> bool:
    return len({(type(e), str(e)) for e in errors}) == 1


def _sampling_key(sampling: SamplingParams) -> str:
    return repr(dataclasses.replace(sampling, seed=None))


def _settle(request: _Request, result: Any = None, *, error: BaseException | None = None) -> None:
    if request.future.done():  # the episode gave up waiting (cancelled)
        return
    if error is not None:
        request.future.set_exception(error)
    else:
        request.future.set_result(result)
