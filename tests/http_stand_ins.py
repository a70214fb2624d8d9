"""HTTP stand-ins for the servers the remote backends talk to, each in a thread of the test process.

* :func:`openai_server` — ``envkit serve``'s own server (:func:`envkit.serving.openai.make_server`) on a model.
* :class:`SGLangStandIn` — SGLang's native ``/generate`` (and ``/get_model_info``) in front of an in-process
  :class:`~envkit.backends.TransformersBackend`, with SGLang's conventions: ``top_k`` −1 is off (0 is refused, as
  SGLang refuses it), the budget is ``max_new_tokens``, the seed is ``sampling_seed``, unknown sampling parameters
  are refused; token ids and logprobs come back in ``meta_info.output_token_logprobs``.
* :class:`ChatStandIn` — ``/v1/chat/completions`` answered by a function of the request's messages and tools.
* :class:`ScriptedServer` — answers POSTs from a script of ``(status, payload)`` (then a default reply), or hangs:
  the faults of real servers on demand.

Every stand-in records the JSON bodies it was sent (``bodies``) and is a context manager (it serves inside ``with``).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from envkit.backends import SamplingParams, TransformersBackend


class _Server:
    """A ThreadingHTTPServer on a free port whose handler calls :meth:`get` and :meth:`post`."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:
                self.reply(*owner.get(self.path))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.bodies.append(body)
                self.reply(*owner.post(self.path, body))

            def reply(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (a deadline passed)
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)

    def get(self, path: str) -> tuple[int, Any]:
        return 200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]}

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


class OpenAIStandIn(_Server):
    """``envkit serve``'s request handling, in this process (the real server code, on a real model)."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        from envkit.serving.openai import make_server

        self.bodies = []
        self.server = make_server(model, tokenizer, port=0, model_name="tiny")
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.01,), daemon=True)


SGLANG_SAMPLING_KEYS = {
    "max_new_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "stop",
    "stop_token_ids",
    "skip_special_tokens",
    "no_stop_trim",
    "sampling_seed",
}


class SGLangStandIn(_Server):
    """SGLang's ``/generate`` over an in-process model (see the module)."""

    def __init__(self, backend: TransformersBackend, tokenizer: Any) -> None:
        super().__init__()
        self.backend = backend
        self.tokenizer = tokenizer
        self.lock = threading.Lock()

    def get(self, path: str) -> tuple[int, Any]:
        if path == "/get_model_info":
            return 200, {"model_path": "tiny", "tokenizer_path": "tiny", "is_generation": True}
        if path == "/health":
            return 200, {}
        return 404, {"detail": "Not Found"}

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        if path != "/generate":
            return 404, {"detail": "Not Found"}
        params = dict(body.get("sampling_params") or {})
        unknown = sorted(set(params) - SGLANG_SAMPLING_KEYS)
        if unknown:
            return 400, {"error": {"message": f"unexpected sampling parameters {unknown}"}}
        top_k = int(params.get("top_k", -1))
        if top_k == 0 or top_k < -1:
            return 400, {"error": {"message": f"top_k must be -1 (disable), or at least 1, got {top_k}."}}
        sampling = SamplingParams(
            temperature=float(params.get("temperature", 1.0)),
            top_p=float(params.get("top_p", 1.0)),
            top_k=None if top_k == -1 else top_k,
            min_p=float(params.get("min_p", 0.0)),
            repetition_penalty=float(params.get("repetition_penalty", 1.0)),
            max_new_tokens=int(params.get("max_new_tokens", 128)),
            stop=params.get("stop") or None,
            stop_token_ids=params.get("stop_token_ids") or None,
        )
        seed = params.get("sampling_seed")
        with self.lock:  # one in-process model: one call at a time
            [generation] = self.backend.generate(
                [list(body["input_ids"])], sampling, seeds=None if seed is None else [int(seed)]
            )
        tokens = generation.token_ids
        if generation.finish_reason == "length":
            reason: dict[str, Any] = {"type": "length", "length": len(tokens)}
        else:
            reason = {"type": "stop", "matched": tokens[-1] if tokens else None}
        entries = [[lp, token, None] for lp, token in zip(generation.logprobs, tokens, strict=True)]
        meta = {
            "id": f"req-{len(self.bodies)}",
            "finish_reason": reason,
            "prompt_tokens": len(body["input_ids"]),
            "completion_tokens": len(tokens),
            "output_token_logprobs": entries if body.get("return_logprob") else None,
        }
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        return 200, {"text": text, "output_ids": tokens, "meta_info": meta}


class ChatStandIn(_Server):
    """``/v1/chat/completions`` answered by ``respond(messages, tools) -> message`` (an OpenAI-format assistant
    message: ``content`` and ``tool_calls`` with string ``arguments``)."""

    def __init__(self, respond: Callable[[list[dict[str, Any]], list[dict[str, Any]]], dict[str, Any]]) -> None:
        super().__init__()
        self.respond = respond

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        if path != "/v1/chat/completions":
            return 404, {"error": {"message": f"no route {path}"}}
        message = self.respond(body["messages"], body.get("tools") or [])
        reason = "tool_calls" if message.get("tool_calls") else "stop"
        return 200, {
            "id": f"chatcmpl-{len(self.bodies)}",
            "object": "chat.completion",
            "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": reason}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        }


class ScriptedServer(_Server):
    """Answers every POST from ``script`` (a list of ``(status, payload)``, popped in order), then with ``default``;
    ``hang_s`` makes every POST wait that long first (a hung server)."""

    def __init__(self, script: list[tuple[int, Any]], default: tuple[int, Any], *, hang_s: float = 0.0) -> None:
        super().__init__()
        self.script = list(script)
        self.default = default
        self.hang_s = hang_s

    def post(self, path: str, body: Any) -> tuple[int, Any]:
        if self.hang_s:
            time.sleep(self.hang_s)
        return self.script.pop(0) if self.script else self.default
