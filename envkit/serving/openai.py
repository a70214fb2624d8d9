"""``envkit serve``: a small OpenAI-compatible completions server over a local Hugging Face model.

For evaluating or debugging without vLLM, and as a real HTTP peer for :class:`envkit.backends.OpenAIBackend`. It
speaks the subset of vLLM's ``/v1/completions`` that envkit uses: token-id prompts, ``return_token_ids``,
``logprobs`` with ``token_id:N`` tokens, ``temperature`` / ``top_p`` / ``top_k`` / ``min_p`` / ``repetition_penalty`` /
``max_tokens`` / ``stop`` / ``stop_token_ids`` / ``seed`` / ``n``, plus ``/v1/models``; what it cannot honour
(``stream``, ``echo``, ``suffix``, ``best_of``, ``logit_bias``, presence/frequency penalties,
``/v1/chat/completions``) is refused with an OpenAI-style error naming it, never ignored.
Concurrent requests that arrive within ``batch_window_s`` of each other are generated as one batch.

Limits, each refused with an error naming it: a body over ``max_body_bytes`` (HTTP 413), ``n`` over ``max_n``,
``max_tokens`` over ``max_tokens_limit`` (by default the model's context length), and a token id (in the prompt or
``stop_token_ids``) outside the model's vocabulary (HTTP 400). Token ids are checked before the model sees them: on
CUDA an out-of-range id is a device-side assert that fails every later request of the process. A sampling setting
out of its range (:data:`envkit.backends.SAMPLING_RANGES`: a negative temperature, ``top_p`` above 1) is refused
(HTTP 400, ``param`` naming it) rather than sampled as something else; ``top_k`` −1 is off, as in vLLM.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from envkit.backends import Generation, SamplingParams, SamplingRangeError, TransformersBackend, request_seed


class _Batcher:
    """Collects concurrent requests for a short window and generates them together (per sampling settings)."""

    def __init__(self, backend: TransformersBackend, window_s: float) -> None:
        self.backend, self.window_s = backend, window_s
        self.lock = threading.Lock()
        self.queue: list[tuple[list[int], SamplingParams, dict[str, Any]]] = []
        self.worker = threading.Lock()

    def submit(self, prompt: list[int], sampling: SamplingParams) -> Generation:
        slot: dict[str, Any] = {"done": threading.Event()}
        with self.lock:
            self.queue.append((prompt, sampling, slot))
        time.sleep(self.window_s)
        with self.worker:  # one generation at a time; whoever gets here first runs everything queued
            with self.lock:
                batch, self.queue = self.queue, []
            groups: dict[str, list[tuple[list[int], SamplingParams, dict[str, Any]]]] = {}
            for item in batch:  # requests that differ only in their seed share a batch
                groups.setdefault(repr(dataclasses.replace(item[1], seed=None)), []).append(item)
            for items in groups.values():
                seeds = [s.seed if s.seed is not None else secrets.randbits(63) for _, s, _ in items]
                try:
                    results = self.backend.generate([p for p, _, _ in items], items[0][1], seeds=seeds)
                    for (_, _, s), generation in zip(items, results, strict=True):
                        s["result"] = generation
                except Exception as error:
                    for _, _, s in items:
                        s["error"] = error
                for _, _, s in items:
                    s["done"].set()
        slot["done"].wait()
        if "error" in slot:
            raise slot["error"]
        return slot["result"]


# Request options the server has no way to honour: refused by name (HTTP 400) rather than silently ignored. Each maps
# to the values that ask for nothing (what leaving it out means).
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
}


DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024
"""The largest request body ``envkit serve`` reads by default (a 128k-token prompt as JSON is about 1 MiB)."""
DEFAULT_MAX_N = 16
"""The most completions per prompt (``n``) a request may ask for by default."""
FALLBACK_MAX_TOKENS = 4096
"""The ``max_tokens`` limit when the model's config states no context length."""


class _RequestError(Exception):
    """A request the server refuses: its HTTP status and an OpenAI-style error (``param`` names the field at fault)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def make_server(
    model: Any,
    tokenizer: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str = "envkit",
    batch_window_s: float = 0.01,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_n: int = DEFAULT_MAX_N,
    max_tokens_limit: int | None = None,
) -> ThreadingHTTPServer:
    """An HTTP server (not yet started: call ``serve_forever``) answering ``/v1/completions`` with ``model``.

    Responses carry every field the official ``openai`` client's types require; a request the server cannot honour
    (``stream=true``, ``echo``, ``logit_bias``...) is an HTTP 400 whose OpenAI-style error names the field. Every
    request's body is read before it is answered, whatever the answer, so a kept-alive connection stays usable
    (except a body over ``max_body_bytes``: answered unread, and the connection closed).

    Args:
        model: A Hugging Face causal LM.
        tokenizer: Its tokenizer (text prompts, decoded completion text).
        host: Address to listen on.
        port: TCP port (0 picks a free one).
        model_name: The name clients use (``/v1/models``, ``model`` in replies).
        batch_window_s: How long a request waits for others to batch with.
        max_body_bytes: The largest request body read (HTTP 413 past it).
        max_n: The most completions per prompt (``n``) one request may ask for.
        max_tokens_limit: The largest ``max_tokens`` (default: the model's context length,
            ``max_position_embeddings``, else :data:`FALLBACK_MAX_TOKENS`).

    Returns:
        The server, bound but not serving.

    Raises:
        ValueError: A limit below 1.
    """
    if max_tokens_limit is None:
        max_tokens_limit = int(getattr(model.config, "max_position_embeddings", None) or FALLBACK_MAX_TOKENS)
    for name, value in (("max_body_bytes", max_body_bytes), ("max_n", max_n), ("max_tokens_limit", max_tokens_limit)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    vocabulary = int(model.get_input_embeddings().num_embeddings)  # the ids the model can look up
    batcher = _Batcher(TransformersBackend(model, tokenizer), batch_window_s)
    model_card = {"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "envkit"}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet by default
            return

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def _send_error(self, error: _RequestError) -> None:
            kind = "server_error" if error.status >= 500 else "invalid_request_error"
            self._send(
                error.status,
                {"error": {"message": str(error), "type": kind, "param": error.param, "code": error.code}},
            )

        def _read_body(self) -> bytes:
            """The request's whole body. Read before any answer, or its bytes would be taken for the next request on
            the connection; a body of unknown length closes the connection after the answer."""
            if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
                self.close_connection = True
                raise _RequestError(411, "send the request body with a Content-Length header (chunked is not read)")
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if length < 0:
                self.close_connection = True
                raise _RequestError(400, f"bad Content-Length header: {self.headers.get('Content-Length')!r}")
            if length > max_body_bytes:  # not read: the connection closes after the answer
                self.close_connection = True
                raise _RequestError(
                    413,
                    f"the request body is {length} bytes, over this server's limit of {max_body_bytes} "
                    "(envkit serve --max-body-bytes)",
                    code="request_too_large",
                )
            return self.rfile.read(length)

        def do_GET(self) -> None:
            try:
                self._read_body()
                self._send(200, self._get(urlsplit(self.path).path))
            except _RequestError as error:
                self._send_error(error)

        def do_POST(self) -> None:
            try:
                body = self._read_body()
                path = urlsplit(self.path).path
                if path == "/v1/chat/completions":
                    raise _RequestError(
                        404,
                        "no route /v1/chat/completions: envkit serve answers /v1/completions only (token-id or text "
                        "prompts); render the messages with the model's chat template and send them as the prompt",
                        code="unknown_url",
                    )
                if path != "/v1/completions":
                    raise _RequestError(404, f"no route {path}", code="unknown_url")
                self._send(200, self._complete(body))
            except _RequestError as error:
                self._send_error(error)

        def _get(self, path: str) -> dict[str, Any]:
            if path in ("/health", "/v1/health"):
                return {"status": "ok"}
            if path == "/v1/models":
                return {"object": "list", "data": [model_card]}
            if path.startswith("/v1/models/"):
                name = unquote(path.removeprefix("/v1/models/"))
                if name != model_name:
                    raise _RequestError(
                        404, f"no model {name!r}; this server serves {model_name!r}", code="model_not_found"
                    )
                return model_card
            raise _RequestError(404, f"no route {path}", code="unknown_url")

        def _complete(self, body: bytes) -> dict[str, Any]:
            try:
                request = json.loads(body)
                if not isinstance(request, dict):
                    raise ValueError("the body must be a JSON object")
            except ValueError as error:
                raise _RequestError(400, f"bad request: {error}") from None
            if request.get("stream"):
                raise _RequestError(
                    400, "streaming is not supported by envkit serve: send stream=false", param="stream"
                )
            n = request.get("n") or 1
            for name, neutral in _UNSUPPORTED.items():
                value = request.get(name)
                if value not in neutral and not (name == "best_of" and value == n):
                    raise _RequestError(400, f"{name} is not supported by envkit serve (got {value!r})", param=name)
            if isinstance(n, int) and n > max_n:
                raise _RequestError(
                    400, f"n={n} is over this server's limit of {max_n} (envkit serve --max-n)", param="n"
                )
            try:
                prompts = _prompts(request.get("prompt"), tokenizer)
                if not isinstance(n, int) or n < 1:
                    raise ValueError(f"n must be a positive integer, got {n!r}")
                max_tokens = int(request.get("max_tokens", 16))
            except (ValueError, TypeError, KeyError) as error:
                raise _RequestError(400, f"bad request: {error}") from None
            if not 1 <= max_tokens <= max_tokens_limit:
                raise _RequestError(
                    400,
                    f"max_tokens={max_tokens} is outside this server's range 1-{max_tokens_limit} "
                    "(envkit serve --max-tokens-limit)",
                    param="max_tokens",
                )
            try:
                sampling = SamplingParams(
                    temperature=float(_given(request, "temperature", 1.0)),
                    top_p=float(_given(request, "top_p", 1.0)),
                    top_k=None if int(request.get("top_k") or 0) in (0, -1) else int(request["top_k"]),  # vLLM's off
                    min_p=float(_given(request, "min_p", 0.0)),
                    repetition_penalty=float(_given(request, "repetition_penalty", 1.0)),
                    max_new_tokens=max_tokens,
                    stop=_stop_strings(request.get("stop")),
                    stop_token_ids=[int(t) for t in request.get("stop_token_ids") or []] or None,
                )
                seed = None if request.get("seed") is None else int(request["seed"])
            except SamplingRangeError as error:  # e.g. a negative temperature, which would decode greedily
                raise _RequestError(400, str(error), param=error.field) from None
            except (ValueError, TypeError, KeyError) as error:
                raise _RequestError(400, f"bad request: {error}") from None
            for param, ids in [("prompt", p) for p in prompts] + [("stop_token_ids", sampling.stop_token_ids or [])]:
                if ids and (min(ids) < 0 or max(ids) >= vocabulary):
                    bad = next(t for t in ids if not 0 <= t < vocabulary)
                    raise _RequestError(
                        400,
                        f"token id {bad} in {param} is outside this model's vocabulary (ids 0-{vocabulary - 1})",
                        param=param,
                    )
            # OpenAI's order: the n choices of the first prompt, then the second prompt's; seeds follow the index.
            prompt_of = [prompt for prompt in prompts for _ in range(n)]
            try:
                generations = [
                    batcher.submit(
                        prompt, dataclasses.replace(sampling, seed=None if seed is None else request_seed(seed, i))
                    )
                    for i, prompt in enumerate(prompt_of)
                ]
            except Exception as error:
                raise _RequestError(500, f"{type(error).__name__}: {error}") from None
            choices = []
            for index, generation in enumerate(generations):
                choice: dict[str, Any] = {
                    "index": index,
                    "text": tokenizer.decode(generation.token_ids, skip_special_tokens=False),
                    "finish_reason": generation.finish_reason,
                    "token_ids": generation.token_ids,
                }
                if request.get("logprobs") is not None:
                    choice["logprobs"] = {
                        "tokens": [f"token_id:{t}" for t in generation.token_ids],
                        "token_logprobs": generation.logprobs,
                    }
                choices.append(choice)
            prompt_tokens = sum(map(len, prompts))
            completion_tokens = sum(len(g.token_ids) for g in generations)
            return {
                "id": f"cmpl-{uuid.uuid4().hex[:12]}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": model_name,
                "choices": choices,
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }

    return ThreadingHTTPServer((host, port), Handler)


def _stop_strings(stop: Any) -> list[str] | None:
    """The request's ``stop`` as a list: OpenAI's API takes one string or a list of them."""
    if stop is None or stop == [] or stop == "":
        return None
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(item, str) for item in stop):
        return stop
    raise ValueError(f"stop must be a string or a list of strings, got {stop!r}")


def _given(request: dict[str, Any], name: str, default: float) -> Any:
    """A request's ``name``, or ``default`` when it is absent or null (OpenAI clients send nulls for unset knobs)."""
    value = request.get(name)
    return default if value is None else value


def _prompts(prompt: Any, tokenizer: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [tokenizer.encode(prompt, add_special_tokens=False)]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, list) for p in prompt):
        return [[int(t) for t in p] for p in prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return [tokenizer.encode(p, add_special_tokens=False) for p in prompt]
    raise ValueError("prompt must be a string, a list of token ids, or a list of either")
