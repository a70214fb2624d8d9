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
import math
import secrets
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
    gradients. Sampling follows :class:`SamplingParams` alone: nothing sampling-related is inherited from the model's
    ``generation_config`` (a shipped ``repetition_penalty`` or ``min_p`` would make the samples come from a
    distribution the trainer's loss does not model). Each row samples with its own ``torch.Generator`` (seeded per
    request), so the global RNG is never touched, and the recorded logprob is of the distribution actually sampled
    from: after repetition penalty, temperature, top-k, top-p and min-p (transformers' own logits warpers).
    """

    model: Any
    tokenizer: Any
    max_batch_size: int = 64
    stop_token_ids: list[int] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

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

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, *, seeds: list[int] | None = None
    ) -> list[Generation]:
        """Batched sampling; one :class:`Generation` per prompt. Without ``seeds``, ``sampling.seed`` (if set) seeds
        prompt ``i`` with ``request_seed(seed, i)``; with neither, each row draws a fresh random seed."""
        seeds = [s if s is not None else secrets.randbits(63) for s in _request_seeds(sampling, seeds, len(prompts))]
        results: list[Generation] = []
        for start in range(0, len(prompts), self.max_batch_size):
            end = start + self.max_batch_size
            results += self._generate_batch(prompts[start:end], sampling, seeds[start:end])
        return results

    def _generate_batch(self, prompts: list[list[int]], sampling: SamplingParams, seeds: list[int]) -> list[Generation]:
        import torch
        from transformers import GenerationConfig, LogitsProcessorList

        if not prompts:
            return []
        stops = sorted(set(self.eos_ids()) | set(sampling.stop_token_ids or []))
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else stops[0]
        width = max(len(p) for p in prompts)
        input_ids = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        device = next(self.model.parameters()).device
        sampler = _RowSampler(sampling, seeds, [width - len(p) for p in prompts], device)
        # Greedy decoding of the one-hot scores our sampler returns: transformers adds no sampling of its own.
        config = GenerationConfig(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=stops,
            pad_token_id=pad,
            return_dict_in_generate=True,
            stop_strings=sampling.stop or None,
        )
        was_training = self.model.training
        with self._lock, torch.no_grad():
            inherited, self.model.generation_config = self.model.generation_config, GenerationConfig()
            self.model.eval()
            try:
                output = self.model.generate(
                    input_ids=input_ids.to(device),
                    attention_mask=attention.to(device),
                    generation_config=config,
                    logits_processor=LogitsProcessorList([sampler]),
                    tokenizer=self.tokenizer if sampling.stop else None,
                )
            finally:
                self.model.generation_config = inherited
                if was_training:
                    self.model.train()
        new_tokens = output.sequences[:, width:].tolist()
        chosen = torch.stack(sampler.chosen, dim=1).tolist() if sampler.chosen else [[] for _ in prompts]
        logprobs = torch.stack(sampler.logprobs, dim=1).tolist() if sampler.logprobs else [[] for _ in prompts]
        stop_ids = set(stops)
        return [
            self._finish(tokens, picks, values, stop_ids, sampling)
            for tokens, picks, values in zip(new_tokens, chosen, logprobs, strict=True)
        ]

    def _finish(
        self, tokens: list[int], picks: list[int], values: list[float], stops: set[int], sampling: SamplingParams
    ) -> Generation:
        """Cut one row at its stop token or stop string (after it, transformers pads finished rows)."""
        longest = max((len(s) for s in sampling.stop or []), default=0)
        kept: list[int] = []
        for token, pick in zip(tokens, picks, strict=False):
            if token != pick:  # a padded step: the row had already finished
                return Generation(kept, values[: len(kept)], "stop")
            kept.append(token)
            if token in stops:
                return Generation(kept, values[: len(kept)], "stop")
            if longest:
                tail = self.tokenizer.decode(kept[-(4 * longest + 4) :], skip_special_tokens=False)
                if any(tail.endswith(s) for s in sampling.stop or []):
                    return Generation(kept, values[: len(kept)], "stop")
        return Generation(kept, values[: len(kept)], "length" if len(kept) >= sampling.max_new_tokens else "stop")


class _RowSampler:
    """The last logits processor of a :class:`TransformersBackend` call: samples every row with its own generator.

    It applies the repetition penalty (over each row's own tokens, never its left padding), then transformers'
    temperature / top-k / top-p / min-p warpers, records the chosen token and its logprob under that processed
    distribution, and returns scores where only the chosen token is finite, so greedy decoding picks it.
    """

    def __init__(self, sampling: SamplingParams, seeds: list[int], pad_widths: list[int], device: Any) -> None:
        import torch
        from transformers import (
            MinPLogitsWarper,
            RepetitionPenaltyLogitsProcessor,
            TemperatureLogitsWarper,
            TopKLogitsWarper,
            TopPLogitsWarper,
        )

        self.greedy = sampling.temperature <= 0
        self.penalty = (
            RepetitionPenaltyLogitsProcessor(sampling.repetition_penalty)
            if sampling.repetition_penalty != 1.0
            else None
        )
        self.warpers: list[Any] = []
        if not self.greedy:
            if sampling.temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_k:
                self.warpers.append(TopKLogitsWarper(int(sampling.top_k)))
            if sampling.top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(sampling.top_p))
            if sampling.min_p > 0.0:
                self.warpers.append(MinPLogitsWarper(sampling.min_p))
        self.generators = [torch.Generator(device=device).manual_seed(int(seed)) for seed in seeds]
        self.pad_widths = pad_widths
        self.chosen: list[Any] = []
        self.logprobs: list[Any] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        scores = scores.float()
        if self.penalty is not None:
            scores = torch.cat(
                [
                    self.penalty(input_ids[row : row + 1, pad:], scores[row : row + 1])
                    for row, pad in enumerate(self.pad_widths)
                ]
            )
        for warper in self.warpers:
            scores = warper(input_ids, scores)
        logprobs = scores.log_softmax(-1)
        if self.greedy:
            chosen = scores.argmax(-1)
        else:
            probs = logprobs.exp()
            chosen = torch.cat([torch.multinomial(probs[row], 1, generator=g) for row, g in enumerate(self.generators)])
        self.chosen.append(chosen)
        self.logprobs.append(logprobs.gather(1, chosen[:, None])[:, 0])
        onehot = torch.full_like(scores, -math.inf)
        return onehot.scatter_(1, chosen[:, None], 0.0)


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

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, *, seeds: list[int] | None = None
    ) -> list[Generation]:
        """One ``llm.generate`` call for the whole batch, one vLLM ``SamplingParams`` (with its seed) per prompt."""
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            VSamplingParams(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k if sampling.top_k else -1,
                min_p=sampling.min_p,
                repetition_penalty=sampling.repetition_penalty,
                max_tokens=sampling.max_new_tokens,
                stop=sampling.stop,
                stop_token_ids=sampling.stop_token_ids,
                seed=seed,
                logprobs=0,
                skip_special_tokens=False,
            )
            for seed in _request_seeds(sampling, seeds, len(prompts))
        ]
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

    def generate(
        self, prompts: list[list[int]], sampling: SamplingParams, *, seeds: list[int] | None = None
    ) -> list[Generation]:
        """Concurrent completion requests (each with its own seed), results in prompt order."""
        if not prompts:
            return []
        requests = list(zip(prompts, _request_seeds(sampling, seeds, len(prompts)), strict=True))
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(prompts))) as pool:
            return list(pool.map(lambda request: self._one(request[0], sampling, request[1]), requests))

    def _one(self, prompt: list[int], sampling: SamplingParams, seed: int | None) -> Generation:
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
        if sampling.min_p:
            body["min_p"] = sampling.min_p
        if sampling.repetition_penalty != 1.0:
            body["repetition_penalty"] = sampling.repetition_penalty
        if sampling.stop:
            body["stop"] = sampling.stop
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        if seed is not None:
            body["seed"] = seed
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


def _request_seeds(sampling: SamplingParams, seeds: list[int] | None, count: int) -> list[int | None]:
    """One seed per request: the given ``seeds``, else derived from ``sampling.seed``, else ``None`` (random)."""
    if seeds is not None:
        if len(seeds) != count:
            raise ValueError(f"{len(seeds)} seeds for {count} prompts")
        return list(seeds)
    if sampling.seed is None:
        return [None] * count
    return [request_seed(sampling.seed, i) for i in range(count)]
