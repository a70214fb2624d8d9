"""Generation backends: token ids in, token ids and the sampled tokens' logprobs out.

A backend is any object with ``generate(prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]``.
Prompts are token ids (already rendered by the chat template), so what the model sees is exactly what the trajectory
records. Logprobs are *processed* logprobs: of the distribution actually sampled from (after temperature, top-k and
top-p), which is what TRL's importance-sampling correction expects (vLLM's ``logprobs_mode="processed_logprobs"``).

* :class:`TransformersBackend` — a Hugging Face model in this process (batched ``generate`` with left padding).
* :class:`VLLMBackend` — an in-process ``vllm.LLM``.
* :class:`OpenAIBackend` — an OpenAI-compatible server (vLLM's, or ``envkit serve``) through ``/v1/completions``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass
class SamplingParams:
    """How to sample one assistant turn.

    ``top_k=0`` (or ``None``), ``top_p=1.0``, ``min_p=0.0`` and ``repetition_penalty=1.0`` disable those knobs;
    ``temperature=0`` is greedy decoding. Recorded logprobs are of the distribution actually sampled from, after every
    knob (what TRL's importance-sampling correction compares against). ``stop`` lists extra stop strings;
    ``stop_token_ids`` extra stop tokens (the rollout engine adds the chat template's end-of-turn token here).

    ``seed`` makes sampling reproducible without touching global RNG state: the rollout engine derives one seed per
    request from it (:func:`request_seed`: task seed, group member and turn), so members of a group never share a
    sample, and hands the backend one seed per prompt.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    max_new_tokens: int = 128
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None


def request_seed(seed: int, *parts: int) -> int:
    """A 63-bit seed for one generation request, derived from a base ``seed`` and the request's coordinates
    (e.g. task seed, group index, turn): distinct coordinates give independent streams."""
    digest = hashlib.blake2b(repr((int(seed), *map(int, parts))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


@dataclass
class Generation:
    """One generated turn: the new token ids, the logprob of each, and why generation stopped."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    """``"stop"`` (an end-of-turn/stop token or string) or ``"length"`` (``max_new_tokens`` reached)."""


@runtime_checkable
class Backend(Protocol):
    """Anything that turns token-id prompts into :class:`Generation` objects."""

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, *, seeds: list[int] | None = None
    ) -> list[Generation]:
        """Generate one continuation per prompt, in order; ``seeds`` (one per prompt) when ``sampling.seed`` is set."""
        ...


class BackendError(RuntimeError):
    """A backend could not generate (server down, out of memory, …); the message says which and why."""


@dataclass
class TransformersBackend:
    """Generate with a Hugging Face causal LM in this process.

    Prompts are left-padded into batches of at most ``max_batch_size``; generation runs in eval mode without
    gradients. Logprobs come from the processed scores (``output_scores``), i.e. after temperature/top-k/top-p.
    """

    model: Any
    tokenizer: Any
    max_batch_size: int = 64
    stop_token_ids: list[int] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _seeded_with: int | None = field(default=None, repr=False)

    @property
    def max_model_len(self) -> int | None:
        """The model's context length, when its config says."""
        return getattr(getattr(self.model, "config", None), "max_position_embeddings", None)

    def eos_ids(self) -> list[int]:
        """Token ids that end a turn: ``stop_token_ids``, else the tokenizer's and generation config's EOS ids."""
        if self.stop_token_ids:
            return list(self.stop_token_ids)
        ids = {self.tokenizer.eos_token_id}
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        ids.update(configured if isinstance(configured, list) else [configured])
        return sorted(i for i in ids if i is not None)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        """Batched sampling; one :class:`Generation` per prompt."""
        results: list[Generation] = []
        for start in range(0, len(prompts), self.max_batch_size):
            results += self._generate_batch(prompts[start : start + self.max_batch_size], sampling)
        return results

    def _generate_batch(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        import torch

        if not prompts:
            return []
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids()[0]
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        device = next(self.model.parameters()).device
        eos = self.eos_ids()
        greedy = sampling.temperature <= 0
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "do_sample": not greedy,
            "eos_token_id": eos,
            "pad_token_id": pad,
            "output_scores": True,
            "return_dict_in_generate": True,
        }
        if not greedy:
            kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k or 0)
        else:
            kwargs.update(temperature=None, top_p=None, top_k=None)
        if sampling.stop:
            kwargs.update(stop_strings=sampling.stop, tokenizer=self.tokenizer)
        was_training = self.model.training
        with self._lock, torch.no_grad():
            if sampling.seed is not None and sampling.seed != self._seeded_with:
                # Seed the stream once: re-seeding every call would replay the same draws turn after turn.
                torch.manual_seed(sampling.seed)
                self._seeded_with = sampling.seed
            self.model.eval()
            try:
                output = self.model.generate(
                    input_ids=input_ids.to(device), attention_mask=attention.to(device), **kwargs
                )
            finally:
                if was_training:
                    self.model.train()
        new_tokens = output.sequences[:, width:].tolist()
        logprobs = torch.stack(output.scores, dim=1).float().log_softmax(-1)  # (batch, steps, vocab)
        generations = []
        for row, tokens in enumerate(new_tokens):
            kept, values, reason = [], [], "length"
            for step, token in enumerate(tokens):
                kept.append(token)
                values.append(float(logprobs[row, step, token]))
                if token in eos:
                    reason = "stop"
                    break
            else:
                if sampling.stop and any(self.tokenizer.decode(kept).endswith(s) for s in sampling.stop):
                    reason = "stop"
            generations.append(Generation(kept, values, reason))
        return generations


@dataclass
class VLLMBackend:
    """Generate with an in-process ``vllm.LLM`` from token-id prompts (``TokensPrompt``).

    Build the engine with ``logprobs_mode="processed_logprobs"`` to get logprobs after temperature/top-k/top-p
    (what TRL's importance sampling expects); vLLM's default is raw logprobs.
    """

    llm: Any

    @property
    def max_model_len(self) -> int | None:
        """The engine's context length."""
        try:
            return int(self.llm.llm_engine.model_config.max_model_len)
        except AttributeError:
            return None

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        """One ``llm.generate`` call for the whole batch."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        params = VSamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k else -1,
            max_tokens=sampling.max_new_tokens,
            stop=sampling.stop,
            seed=sampling.seed,
            logprobs=0,
            skip_special_tokens=False,
        )
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        generations = []
        for output in outputs:
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            logprobs = [
                float(step[token].logprob) for step, token in zip(completion.logprobs or [], tokens, strict=False)
            ]
            generations.append(
                Generation(tokens, logprobs, "length" if completion.finish_reason == "length" else "stop")
            )
        return generations


@dataclass
class OpenAIBackend:
    """Generate through an OpenAI-compatible ``/v1/completions`` endpoint with token-id prompts.

    Works with vLLM's server (``python -m vllm.entrypoints.openai.api_server``) and ``envkit serve``. Prompts are sent
    as token ids; token ids come back through vLLM's ``return_token_ids`` (or ``token_id:N`` logprob tokens). One
    request per prompt, ``max_concurrency`` at a time, so the server batches them continuously.
    """

    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 600.0
    max_concurrency: int = 64
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        self.base_url = self.base_url.rstrip("/")
        if self.base_url.endswith("/v1"):
            self.base_url = self.base_url[: -len("/v1")]

    def check(self) -> None:
        """Raise :class:`BackendError` unless the server answers ``GET /v1/models``."""
        try:
            self._request("GET", "/v1/models", None, timeout=10)
        except BackendError as error:
            raise BackendError(f"the server at {self.base_url} does not answer: {error}") from None

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Generation]:
        """Concurrent completion requests, results in prompt order."""
        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(prompts))) as pool:
            return list(pool.map(lambda p: self._one(p, sampling), prompts))

    def _one(self, prompt: list[int], sampling: SamplingParams) -> Generation:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if sampling.top_k:
            body["top_k"] = sampling.top_k
        if sampling.stop:
            body["stop"] = sampling.stop
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        response = self._request("POST", "/v1/completions", body, timeout=self.timeout_s)
        try:
            choice = response["choices"][0]
            logprobs = choice.get("logprobs") or {}
            tokens = choice.get("token_ids")
            if tokens is None:
                tokens = [int(str(t).removeprefix("token_id:")) for t in logprobs.get("tokens", [])]
            values = [float(v) if v is not None else 0.0 for v in logprobs.get("token_logprobs", [])]
        except (KeyError, IndexError, TypeError, ValueError) as error:
            raise BackendError(
                f"unexpected completion response from {self.base_url}: {error}: {response!r:.300}"
            ) from None
        if len(values) != len(tokens):
            raise BackendError(f"the server returned {len(tokens)} tokens but {len(values)} logprobs")
        reason = "length" if choice.get("finish_reason") == "length" else "stop"
        return Generation(list(tokens), values, reason)

    def _request(self, method: str, path: str, body: dict[str, Any] | None, timeout: float) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as reply:
                return json.loads(reply.read())
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")[:500]
            raise BackendError(f"{method} {path} → HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as error:
            raise BackendError(f"{method} {self.base_url}{path} failed: {error}") from None
