"""A pass-through proxy in front of the vLLM server that records what the server generated, token by token.

``python recording_proxy.py --upstream http://127.0.0.1:P --port Q --log out.jsonl``: every ``POST /v1/completions``
and ``POST /v1/chat/completions`` is forwarded with ``return_token_ids: true`` added (vLLM then returns each choice's
generated ``token_ids``; clients ignore the extra field), and one JSON line per choice is appended to the log:
``{"token_ids": [...], "finish_reason": ...}``. The fidelity run of ``benchmarks/peers.py`` points each arm at this
proxy and checks that every model turn of each arm's training data is one of these sequences. Other paths are
forwarded unchanged. Run with a Python that has starlette, uvicorn and httpx (the vLLM venv has all three).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

RECORDED = ("/v1/completions", "/v1/chat/completions")


def build_app(upstream: str, log_path: str) -> Starlette:
    """The proxy app forwarding to ``upstream`` and appending generated token ids to ``log_path``."""
    client = httpx.AsyncClient(base_url=upstream, timeout=httpx.Timeout(600.0))
    log = open(log_path, "a", buffering=1)  # noqa: SIM115 - open for the app's lifetime, line-buffered

    async def forward(request: Request) -> Response:
        path = request.url.path
        body = await request.body()
        if request.method == "POST" and path in RECORDED and body:
            payload: dict[str, Any] = json.loads(body)
            payload["return_token_ids"] = True
            body = json.dumps(payload).encode()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        reply = await client.request(request.method, path, params=request.query_params, content=body, headers=headers)
        if request.method == "POST" and path in RECORDED and reply.status_code == 200:
            for choice in reply.json().get("choices", []):
                log.write(json.dumps({"token_ids": choice.get("token_ids"), "finish": choice.get("finish_reason")}))
                log.write("\n")
        keep = {k: v for k, v in reply.headers.items() if k.lower() not in ("content-length", "content-encoding")}
        return Response(reply.content, status_code=reply.status_code, headers=keep)

    methods = ["GET", "POST", "PUT", "DELETE"]
    return Starlette(routes=[Route("/{path:path}", forward, methods=methods)])


def main() -> None:
    """Serve the proxy until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    uvicorn.run(build_app(args.upstream, args.log), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
