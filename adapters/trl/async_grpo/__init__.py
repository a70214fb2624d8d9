"""Asynchronous, disaggregated GRPO: envkit as the rollout worker of TRL's ``AsyncGRPOTrainer``.

Generation runs on vLLM servers (local or on other machines) with the policy's LoRA adapter hot-swapped after every
step (:mod:`envkit.adapters.vllm.weights`); envkit's engine plays episodes continuously against them
(:mod:`envkit.adapters.trl.async_grpo.worker`); any number of training processes train on what it produced, at most
``max_staleness`` versions behind (:mod:`.trl_async`, the one place TRL's experimental module is
imported). ``envkit train --async`` wires it up (:mod:`envkit.adapters.trl.async_grpo.run`).
"""

from __future__ import annotations

from envkit.adapters.trl.async_grpo.worker import (
    EnvkitRolloutWorker,
    RolloutWorkerFailed,
    group_advantages,
    samples_from_group,
)
from envkit.adapters.vllm.servers import LocalServers, ServerError, check_lora_server, server_command
from envkit.adapters.vllm.weights import AdapterBackend, AdapterPublisher, SyncError

__all__ = [
    "AdapterBackend",
    "AdapterPublisher",
    "EnvkitRolloutWorker",
    "LocalServers",
    "RolloutWorkerFailed",
    "ServerError",
    "SyncError",
    "check_lora_server",
    "group_advantages",
    "samples_from_group",
    "server_command",
]
