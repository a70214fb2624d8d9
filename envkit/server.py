"""``envkit serve``: a small OpenAI-compatible completions server over a local Hugging Face model.

For evaluating or debugging without vLLM, and as a real HTTP peer for :class:`envkit.backends.OpenAIBackend`. It
speaks the subset of vLLM's ``/v1/completions`` that envkit uses: token-id prompts, ``return_token_ids``,
``logprobs`` with ``token_id:N`` tokens, ``temperature`` / ``top_p`` / ``top_k`` / ``min_p`` / ``repetition_penalty`` /
``max_tokens`` / ``stop`` / ``stop_token_ids`` / ``seed``.
Concurrent requests that arrive within ``batch_window_s`` of each other are generated as one batch.
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

from envkit.backends import Generation, SamplingParams, TransformersBackend, request_seed


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


def make_server(
    model: Any,
    tokenizer: Any,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    model_name: str = "envkit",
    batch_window_s: float = 0.01,
) -> ThreadingHTTPServer:
    """An HTTP server (not yet started: call ``serve_forever``) answering ``/v1/completions`` with ``model``."""
    batcher = _Batcher(TransformersBackend(model, tokenizer), batch_window_s)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet by default
            return

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path in ("/health", "/v1/health"):
                self._send(200, {"status": "ok"})
            elif self.path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": model_name, "object": "model"}]})
            else:
                self._send(404, {"error": {"message": f"no route {self.path}"}})

        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                self._send(404, {"error": {"message": f"no route {self.path}"}})
                return
            try:
                request = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                prompts = _prompts(request.get("prompt"), tokenizer)
                sampling = SamplingParams(
                    temperature=float(request.get("temperature", 1.0)),
                    top_p=float(request.get("top_p", 1.0)),
                    top_k=int(request.get("top_k", 0) or 0) or None,
                    min_p=float(request.get("min_p", 0.0) or 0.0),
                    repetition_penalty=float(request.get("repetition_penalty", 1.0) or 1.0),
                    max_new_tokens=int(request.get("max_tokens", 16)),
                    stop=request.get("stop") or None,
                    stop_token_ids=[int(t) for t in request.get("stop_token_ids") or []] or None,
                )
                seed = request.get("seed")
            except (ValueError, TypeError, KeyError) as error:
                self._send(400, {"error": {"message": f"bad request: {error}"}})
                return
            try:
                generations = [
                    batcher.submit(
                        p, dataclasses.replace(sampling, seed=None if seed is None else request_seed(int(seed), i))
                    )
                    for i, p in enumerate(prompts)
                ]
            except Exception as error:
                self._send(500, {"error": {"message": f"{type(error).__name__}: {error}"}})
                return
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
            completion_tokens = sum(len(g.token_ids) for g in generations)
            self._send(
                200,
                {
                    "id": f"cmpl-{uuid.uuid4().hex[:12]}",
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": model_name,
                    "choices": choices,
                    "usage": {"prompt_tokens": sum(map(len, prompts)), "completion_tokens": completion_tokens},
                },
            )

    return ThreadingHTTPServer((host, port), Handler)


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
