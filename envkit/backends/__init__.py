"""Generation backends: token ids in, token ids and the sampled tokens' logprobs out (and, for evaluation only, a
chat endpoint: messages in, a message out).

The contract is :mod:`~envkit.backends.base`'s: a token backend is a :class:`Backend` (``generate(prompts, sampling,
*, seeds=None, max_new_tokens=None) -> list[Generation]``); what else it can do it declares by the typed protocols it
satisfies (:class:`AsyncBackend`: ``agenerate(..., timeout_s=)``, which the rollout engine then awaits per episode
instead of batching; :class:`HasContextLength`, :class:`Closable`, :class:`Checkable`, :class:`ReportsTokens`).
Prompts are token ids (already rendered by the chat template), so what the model sees is exactly what the trajectory
records. They are the engine's own lists, one per episode, extended in place after each call returns (a copy per turn
would cost O(history) per step): a backend reads them during the call, in ``generate`` and ``agenerate`` alike, and
copies one to keep it. Logprobs are *processed* logprobs: of the distribution actually sampled from (after
temperature, top-k and top-p), which is what TRL's importance-sampling correction expects (vLLM's
``logprobs_mode="processed_logprobs"``).

* :class:`TransformersBackend` — a Hugging Face model in this process (batched ``generate`` with left padding).
* :class:`VLLMBackend` — an in-process ``vllm.LLM`` (the engine micro-batches its calls).
* :class:`AsyncVLLMBackend` — an in-process vLLM ``AsyncLLM`` on its own event loop: each episode's request enters
  vLLM's continuous batching as soon as the episode is ready (``agenerate``).
* :class:`OpenAIBackend` — one or several OpenAI-compatible servers (vLLM's, or ``envkit serve``) through
  ``/v1/completions``; :class:`SGLangBackend` — SGLang servers through ``/generate``. Both are thin wire formats over
  :class:`~envkit.backends.http.HTTPBackend` (routing over several servers, cooldowns, retries with
  :class:`~envkit.backends.http.Retryable`, deadlines, concurrency slots, ``stats``).
* :class:`ChatCompletionsBackend` — any OpenAI-compatible ``/v1/chat/completions`` endpoint: messages and tools in,
  the assistant's message out (:class:`ChatBackend`). For evaluation (:class:`~envkit.rollout.ChatRolloutEngine`),
  simulated users and judges; refused for training (:data:`NOT_TOKEN_EXACT`).
* :class:`ScriptedBackend`, :class:`RecordingBackend`, :class:`FaultyBackend` — for tests and benchmarks: scripted
  replies (a text, token ids, or a function of each prompt), a recorder of every call around any backend, and the
  faults of real backends on demand (prompts that break their batch, failing, slow and hung calls).

Backends are registered by name in :mod:`~envkit.backends.registry` (what ``envkit eval --backend`` offers).
"""

from envkit.backends.base import (
    NOT_TOKEN_EXACT,
    SAMPLING_RANGES,
    AsyncBackend,
    Backend,
    BackendError,
    ChatBackend,
    Checkable,
    Closable,
    Generation,
    GenerationTimeout,
    HasContextLength,
    ReportsTokens,
    SamplingParams,
    SamplingRangeError,
    finish_reason,
    request_budgets,
    request_seed,
    request_seeds,
)
from envkit.backends.chat_completions import ChatCompletionsBackend, ChatReply
from envkit.backends.http import HTTPBackend, Retryable, TokenHTTPBackend
from envkit.backends.openai import OpenAIBackend
from envkit.backends.scripted import (
    FaultyBackend,
    RecordedCall,
    RecordingBackend,
    ScriptedBackend,
    ScriptedRequest,
)
from envkit.backends.sglang import SGLangBackend
from envkit.backends.transformers import TransformersBackend
from envkit.backends.vllm import AsyncVLLMBackend, VLLMBackend

__all__ = [
    "NOT_TOKEN_EXACT",
    "SAMPLING_RANGES",
    "AsyncBackend",
    "AsyncVLLMBackend",
    "Backend",
    "BackendError",
    "ChatBackend",
    "ChatCompletionsBackend",
    "ChatReply",
    "Checkable",
    "Closable",
    "FaultyBackend",
    "Generation",
    "GenerationTimeout",
    "HTTPBackend",
    "HasContextLength",
    "OpenAIBackend",
    "RecordedCall",
    "RecordingBackend",
    "ReportsTokens",
    "Retryable",
    "SGLangBackend",
    "SamplingParams",
    "SamplingRangeError",
    "ScriptedBackend",
    "ScriptedRequest",
    "TokenHTTPBackend",
    "TransformersBackend",
    "VLLMBackend",
    "finish_reason",
    "request_budgets",
    "request_seed",
    "request_seeds",
]
