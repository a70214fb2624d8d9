"""Asynchronous, disaggregated GRPO: envkit as the rollout worker of TRL's ``AsyncGRPOTrainer``.

Generation runs on vLLM servers (local or on other machines) with the policy's LoRA adapter hot-swapped after every
step (:mod:`envkit.training.async_grpo.weights`); envkit's engine plays episodes continuously against them
(:mod:`envkit.training.async_grpo.worker`); any number of training processes train on what it produced, at most
``max_staleness`` versions behind (:mod:`.trl_async`, the one place TRL's experimental module is
imported). ``envkit train --async`` wires it up (:mod:`envkit.training.async_grpo.run`).
"""

from __future__ import annotations

from envkit.training.async_grpo.servers import LocalServers, ServerError, check_lora_server, server_command
from envkit.training.async_grpo.weights import AdapterBackend, AdapterPublisher, SyncError
from envkit.training.async_grpo.worker import (
    EnvkitRolloutWorker,
    RolloutWorkerFailed,
    group_advantages,
    samples_from_group,
)

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
