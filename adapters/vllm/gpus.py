"""Sharing a machine's GPUs between local vLLM servers and training (``--vllm-servers K --vllm-server-gpus N``).

The servers envkit starts take the **last** ``N`` GPUs this process sees, ``N / K`` each (tensor-parallel within a
server); training keeps the first ones. Under ``accelerate launch`` a training process uses the GPU of its local
rank (``cuda:LOCAL_RANK``), so training processes numbered below ``G - N`` never touch a server's GPU and nothing
about training's device selection changes. A server sees only its own GPUs (``CUDA_VISIBLE_DEVICES``, written in the
names this process was given, so a run confined with ``CUDA_VISIBLE_DEVICES=2,3,4,5`` puts its servers on 4 and 5).

Refused in one line each (:class:`GpuPlacementError`): ``N`` not a multiple of ``K``; no GPU left for training; more
training processes on this machine than GPUs left for them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class GpuPlacementError(ValueError):
    """The requested server GPUs cannot be placed beside training on this machine (one line naming the fix)."""


@dataclass(frozen=True)
class GpuSplit:
    """Which GPUs training uses and which each local server runs on (no GPU in both), in ``CUDA_VISIBLE_DEVICES``
    names."""

    training: tuple[str, ...]
    servers: tuple[tuple[str, ...], ...]

    def server_devices(self, index: int) -> str:
        """Server ``index``'s ``CUDA_VISIBLE_DEVICES`` value."""
        return ",".join(self.servers[index])

    def as_dict(self) -> dict[str, list]:
        """The split as plain data (``eval_summary.json``)."""
        return {"training": list(self.training), "servers": [list(gpus) for gpus in self.servers]}

    def describe(self) -> str:
        """One line for the log."""
        servers = ", ".join(f"server {i + 1} on GPU(s) {list(gpus)}" for i, gpus in enumerate(self.servers))
        return f"{servers}; training on GPU(s) {list(self.training)}"


def visible_gpus(count: int, env: Mapping[str, str] = os.environ) -> list[str]:
    """The names of this process's ``count`` GPUs as ``CUDA_VISIBLE_DEVICES`` gives them (``"0" … "count-1"``
    when it is unset)."""
    given = [name.strip() for name in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if name.strip()]
    if given:
        return given[:count]
    return [str(index) for index in range(count)]


def split_gpus(gpus: Sequence[str], servers: int, server_gpus: int, training_processes: int) -> GpuSplit:
    """Place ``servers`` local vLLM servers on the last ``server_gpus`` of ``gpus``, ``server_gpus / servers`` each,
    and training on the rest (see the module). ``training_processes``: the training processes on this machine
    (``LOCAL_WORLD_SIZE``)."""
    if servers < 1:
        raise GpuPlacementError("--vllm-servers must be at least 1")
    if server_gpus < servers or server_gpus % servers:
        raise GpuPlacementError(
            f"--vllm-server-gpus {server_gpus} cannot be shared by {servers} server(s): give a multiple of "
            f"--vllm-servers ({servers}, {2 * servers}, …)"
        )
    left = len(gpus) - server_gpus
    if left < 1:
        raise GpuPlacementError(
            f"--vllm-server-gpus {server_gpus} leaves no GPU for training on this machine ({len(gpus)} GPU(s)): give "
            "fewer, or start the server(s) yourself (on other machines, or sharing a GPU with a lower "
            "--gpu-memory-utilization) and give --vllm-server-url"
        )
    if training_processes > left:
        raise GpuPlacementError(
            f"{training_processes} training processes on this machine but only {left} GPU(s) beside the servers' "
            f"{server_gpus}: launch at most {left} (accelerate launch --num_processes {left}) or lower "
            "--vllm-server-gpus"
        )
    per_server = server_gpus // servers
    placed = list(gpus[left:])
    return GpuSplit(
        training=tuple(gpus[:left]),
        servers=tuple(tuple(placed[i * per_server : (i + 1) * per_server]) for i in range(servers)),
    )
