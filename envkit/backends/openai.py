"""Generation through OpenAI-compatible ``/v1/completions`` servers (:class:`OpenAIBackend`), over httpx.

One request per prompt, sent as soon as its episode is ready (the rollout engine awaits :meth:`OpenAIBackend.agenerate`
per episode), so the server batches continuously. With several servers each request goes to the one with the fewest
requests in flight; a request that fails on a connection error, a timeout, HTTP 5xx or 429 is retried with backoff,
preferably on another server (:class:`~envkit.backends.http.HTTPBackend`).
"""

from __future__ import annotations

from typing import Any, ClassVar

from envkit.backends.base import BackendError, Generation, SamplingParams, finish_reason
from envkit.backends.http import TokenHTTPBackend, parse_base_urls

__all__ = ["OpenAIBackend", "parse_base_urls"]


class OpenAIBackend(TokenHTTPBackend):
    """Generate through OpenAI-compatible ``/v1/completions`` endpoints with token-id prompts.

    Works with vLLM's server (``python -m vllm.entrypoints.openai.api_server``) and ``envkit serve``. Prompts are sent
    as token ids; token ids come back through vLLM's ``return_token_ids`` (or ``token_id:N`` logprob tokens). Every
    sampling knob is sent, neutral ones too (``top_k`` 0 is off): a vLLM server fills an omitted one from the model's
    ``generation_config.json``. Logprobs are the server's: start vLLM with ``--logprobs-mode processed_logprobs`` for
    those of the distribution sampled from (what TRL's importance sampling expects).

    Routing over several servers, cooldowns, retries, deadlines, ``max_concurrency`` and :attr:`stats` are
    :class:`~envkit.backends.http.HTTPBackend`'s; the arguments are its own (``base_url``, ``model``, ``api_key``,
    ``timeout_s``, ``max_concurrency``, ``max_model_len``, ``retries``, ``backoff_s``, ``connect_timeout_s``).
    :meth:`check` asks every server for ``GET /v1/models``.
    """

    generate_path: ClassVar[str] = "/v1/completions"
    check_path: ClassVar[str] = "/v1/models"

    def request_body(self, prompt: list[int], sampling: SamplingParams, seed: int | None) -> dict[str, Any]:
        """A ``/v1/completions`` body: the prompt's token ids, every knob, the sampled tokens' ids and logprobs."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt),
            "max_tokens": sampling.max_new_tokens,
            # Every knob, neutral ones too: a vLLM server fills an omitted one from the model's generation_config.json
            # (Qwen2.5-Instruct: top_k 20, repetition_penalty 1.05), which would sample from another distribution
            # than the one the trainer models. top_k 0 is off (vLLM >= 0.8, envkit serve).
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": int(sampling.top_k or 0),
            "min_p": sampling.min_p,
            "repetition_penalty": sampling.repetition_penalty,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if sampling.stop:
            body["stop"] = sampling.stop
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        if seed is not None:
            body["seed"] = seed
        return body

    def parse_generation(self, reply: Any, url: str) -> Generation:
        """The first choice's token ids (``token_ids``, else the ``token_id:N`` logprob tokens), their logprobs, the
        finish reason and the served model's name."""
        try:
            choice = reply["choices"][0]
            logprobs = choice.get("logprobs") or {}
            tokens = choice.get("token_ids")
            if tokens is None:
                tokens = [int(str(t).removeprefix("token_id:")) for t in logprobs.get("tokens", [])]
            raw = list(logprobs.get("token_logprobs", []))
            missing = next((i for i, v in enumerate(raw) if v is None), None)
            values = [float(v) for v in raw if v is not None]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            raise BackendError(f"unexpected completion response from {url}: {error}: {reply!r:.300}") from None
        # A missing logprob would have to be invented (0.0 claims probability 1): the behaviour policy's value is
        # what importance sampling divides by, so the turn fails, as when the counts differ.
        if missing is not None:
            raise BackendError(
                f"the server at {url} returned a null logprob for token {missing} of {len(tokens)} (the behaviour "
                "policy's logprob of every sampled token is needed)"
            )
        if len(values) != len(tokens):
            raise BackendError(f"the server at {url} returned {len(tokens)} tokens but {len(values)} logprobs")
        served = reply.get("model") if isinstance(reply, dict) else None
        reason = finish_reason(choice.get("finish_reason"))
        return Generation(list(tokens), values, reason, model=served if isinstance(served, str) else None)
