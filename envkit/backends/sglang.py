"""Generation through SGLang's native ``/generate`` endpoint (:class:`SGLangBackend`), over httpx.

SGLang's ``/v1/completions`` takes no token-id prompt with token ids back, and ignores ``seed`` (its per-request seed
is ``sampling_params.sampling_seed`` on ``/generate`` alone): this backend speaks ``/generate``, token ids in and
token ids with their logprobs out, so an SGLang server serves envkit as exactly as a vLLM one.
"""

from __future__ import annotations

from typing import Any, ClassVar

from envkit.backends.base import BackendError, Generation, SamplingParams
from envkit.backends.http import Retryable, TokenHTTPBackend

__all__ = ["SGLangBackend"]


class SGLangBackend(TokenHTTPBackend):
    """Generate through SGLang servers (``python -m sglang.launch_server``) with token-id prompts.

    One ``POST /generate`` per prompt: ``{"input_ids": [...], "sampling_params": {...}, "return_logprob": true}``;
    the reply's ``meta_info.output_token_logprobs`` (``[logprob, token_id, text]`` per generated token) gives the
    token ids and their logprobs, ``meta_info.finish_reason.type`` why it stopped (``"length"``; ``"stop"``; an
    ``"abort"`` is retried, as a server that aborts a request is restarting or out of memory).

    SGLang's own conventions, which the body follows: ``top_k`` −1 is off (envkit's ``None`` or 0), the token budget
    is ``max_new_tokens``, and the per-request seed is ``sampling_seed`` — which SGLang honours when the server runs
    with ``--enable-deterministic-inference`` (else samples differ between runs, as they would without a seed). Every
    knob is sent, neutral ones too, so nothing is filled from the model's ``generation_config.json``; special tokens
    are kept (``skip_special_tokens`` false) and stop strings are not trimmed from the text (``no_stop_trim``).
    SGLang's logprobs are those of the distribution it sampled from (after temperature, top-k, top-p and min-p),
    what TRL's importance sampling expects — unless the server sets ``SGLANG_RETURN_ORIGINAL_LOGPROB``, which
    reports them before temperature: leave it unset.

    Routing over several servers, cooldowns, retries, deadlines, ``max_concurrency`` and :attr:`stats` are
    :class:`~envkit.backends.http.HTTPBackend`'s; the arguments are its own (``model`` names the served model in
    messages only: ``/generate`` serves the one model it was started with). :meth:`check` asks every server for
    ``GET /get_model_info`` (a vLLM server answers 404).
    """

    generate_path: ClassVar[str] = "/generate"
    check_path: ClassVar[str] = "/get_model_info"

    def request_body(self, prompt: list[int], sampling: SamplingParams, seed: int | None) -> dict[str, Any]:
        """A ``/generate`` body: the prompt's token ids, every knob in SGLang's terms, logprobs of the output only."""
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": int(sampling.top_k) if sampling.top_k else -1,
            "min_p": sampling.min_p,
            "repetition_penalty": sampling.repetition_penalty,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if sampling.stop:
            params["stop"] = list(sampling.stop)
        if sampling.stop_token_ids:
            params["stop_token_ids"] = list(sampling.stop_token_ids)
        if seed is not None:
            params["sampling_seed"] = seed
        # logprob_start_len -1: logprobs of the generated tokens only, none of the prompt's.
        return {"input_ids": list(prompt), "sampling_params": params, "return_logprob": True, "logprob_start_len": -1}

    def parse_generation(self, reply: Any, url: str) -> Generation:
        """Token ids and logprobs from ``meta_info.output_token_logprobs``, the finish reason from
        ``meta_info.finish_reason``."""
        try:
            if isinstance(reply, list):  # a batch reply: one request was sent
                (reply,) = reply
            meta = reply["meta_info"]
            entries = meta["output_token_logprobs"]
            tokens = [int(entry[1]) for entry in entries]
            missing = next((i for i, entry in enumerate(entries) if entry[0] is None), None)
            values = [float(entry[0]) for entry in entries if entry[0] is not None]
            reason = meta.get("finish_reason")
            kind = reason.get("type") if isinstance(reason, dict) else reason
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            raise BackendError(f"unexpected /generate response from {url}: {error}: {reply!r:.300}") from None
        if kind == "abort":
            message = reason.get("message") if isinstance(reason, dict) else None
            raise Retryable(f"the server aborted the request: {message or reason}")
        if missing is not None:
            raise BackendError(
                f"the server at {url} returned a null logprob for token {missing} of {len(tokens)} (the behaviour "
                "policy's logprob of every sampled token is needed)"
            )
        return Generation(tokens, values, "length" if kind == "length" else "stop", model=self.model or None)
