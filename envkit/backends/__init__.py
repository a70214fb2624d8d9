"""Generation backends: token ids in, token ids and the sampled tokens' logprobs out.

A backend is any object with ``generate(prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]``
(optionally also ``async agenerate(prompt, sampling, seed) -> Generation``, which the rollout engine then awaits per
episode instead of batching). Prompts are token ids (already rendered by the chat template), so what the model sees is
exactly what the trajectory records. They are the engine's own lists, one per episode, extended in place after each
call returns (a copy per turn would cost O(history) per step): a backend reads them during the call, in ``generate``
and ``agenerate`` alike, and copies one to keep it. Logprobs are *processed* logprobs: of the distribution actually
sampled from (after temperature, top-k and top-p), which is what TRL's importance-sampling correction expects (vLLM's
``logprobs_mode="processed_logprobs"``).

* :class:`TransformersBackend` — a Hugging Face model in this process (batched ``generate`` with left padding).
* :class:`VLLMBackend` — an in-process ``vllm.LLM`` (the engine micro-batches its calls).
* :class:`AsyncVLLMBackend` — an in-process vLLM ``AsyncLLM`` on its own event loop: each episode's request enters
  vLLM's continuous batching as soon as the episode is ready (``agenerate``).
* :class:`OpenAIBackend` — one or several OpenAI-compatible servers (vLLM's, or ``envkit serve``) through
  ``/v1/completions``, over httpx, with least-loaded routing and retries.
* :class:`ScriptedBackend`, :class:`RecordingBackend`, :class:`FaultyBackend` — for tests and benchmarks: scripted
  replies (a text, token ids, or a function of each prompt), a recorder of every call around any backend, and the
  faults of real backends on demand (prompts that break their batch, failing, slow and hung calls).

Modules: :mod:`~envkit.backends.base` (:class:`SamplingParams`, :func:`request_seed`, :class:`Generation`,
:func:`finish_reason`, :class:`Backend`, :class:`BackendError`, :class:`GenerationTimeout`),
:mod:`~envkit.backends.transformers`, :mod:`~envkit.backends.vllm`, :mod:`~envkit.backends.openai`,
:mod:`~envkit.backends.scripted`.
"""

from envkit.backends.base import (
    Backend,
    BackendError,
    Generation,
    GenerationTimeout,
    SamplingParams,
    _request_budgets,
    _request_seeds,
    finish_reason,
    request_seed,
)
from envkit.backends.openai import OpenAIBackend
from envkit.backends.scripted import (
    FaultyBackend,
    RecordedCall,
    RecordingBackend,
    ScriptedBackend,
    ScriptedRequest,
)
from envkit.backends.transformers import TransformersBackend
from envkit.backends.vllm import AsyncVLLMBackend, VLLMBackend

__all__ = [
    "AsyncVLLMBackend",
    "Backend",
    "BackendError",
    "FaultyBackend",
    "Generation",
    "GenerationTimeout",
    "OpenAIBackend",
    "RecordedCall",
    "RecordingBackend",
    "SamplingParams",
    "ScriptedBackend",
    "ScriptedRequest",
    "TransformersBackend",
    "VLLMBackend",
    "_request_budgets",
    "_request_seeds",
    "finish_reason",
    "request_seed",
]
