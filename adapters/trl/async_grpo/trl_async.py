"""The one place envkit imports TRL's experimental asynchronous GRPO (``trl.experimental.async_grpo``, TRL 1.16;
stable from TRL 1.18): the trainer subclass envkit trains with, the sample type its rollout worker produces, and the
CPU replacements the trainer needs.

:class:`EnvkitAsyncGRPOTrainer` changes three things in TRL's ``AsyncGRPOTrainer``:

* Weight sync is adapter-only and goes to every server (:class:`~.weights.AdapterPublisher`): TRL's
  own adapter path talks to one server and leaves its last adapter loaded; its merged path streams full weights.
* Staleness is checked where the loss is computed. Each sample's policy version (``RolloutSample.model_version``)
  is stamped into the collated batch (``sample_version``, one per sample of each row), and
  :meth:`~EnvkitAsyncGRPOTrainer.mask_stale` (called by ``compute_loss``) compares it with the version of the weights
  being trained: a sample more than ``max_staleness`` versions behind contributes no loss term (no gradient; it
  leaves the token count the loss is normalised by too) and is counted (``envkit/stale_masked_total``). The
  staleness of every sample that reaches the loss is measured there too (``envkit/staleness_mean`` / ``_max``,
  :attr:`~EnvkitAsyncGRPOTrainer.staleness_seen`), whatever the gate upstream did. The gate (where samples are
  fetched) still drops what will be too old, predicting the version a micro-batch trains under from accelerate's
  fetch-ahead, so little is generated or forwarded for nothing; if that prediction ever goes wrong, the loss-side
  check still holds the bound, and says so in its count.
* Micro-batches hold a fixed number of samples (``token_budget = 0``), which is what makes the fetch-ahead exact.
* A checkpoint keeps the rollout's place (:data:`~.rollout_state.ROLLOUT_STATE_FILE`: the worker's first unfinished
  group, the finished ones after it, and the policy version), and a run resumed from it plays only the unfinished
  groups, with the tasks and sampling seeds the uncut run would have given them, its policy versions counting on.

On a machine without CUDA, :func:`apply_cpu_patches` replaces the two things that need it: the peak-FLOPs lookup
(MFU is then not reported) and the FlashAttention-3 kernel of TRL's tree attention (a torch implementation).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer
from trl.experimental.async_grpo import async_grpo_trainer as _trainer_module
from trl.experimental.async_grpo import packing as _packing
from trl.experimental.async_grpo.async_grpo_trainer import (
    DataCollatorForRollout,
    RolloutQueueDataset,
    save_lora_adapter,
)
from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

from envkit.adapters.trl.async_grpo.rollout_state import ROLLOUT_STATE_FILE, read_rollout_state
from envkit.adapters.vllm.timeline import Activity
from envkit.adapters.vllm.weights import AdapterPublisher

__all__ = [
    "SAMPLE_VERSION",
    "AsyncGRPOConfig",
    "EnvkitAsyncGRPOTrainer",
    "RolloutSample",
    "VersionStampingCollator",
    "apply_cpu_patches",
    "save_lora_adapter",
    "torch_varlen_attention",
]

logger = logging.getLogger(__name__)

VERSION_KEY = "envkit/generated_version"
"""Per-sample metric carrying the policy version that generated the sample (its oldest turn's): read back where the
sample is trained to measure its staleness, and logged (as the mean version of the trained samples)."""


# ---- CPU ------------------------------------------------------------------------------------------------------------
def torch_varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    softmax_scale: float | None = None,
    causal: bool = True,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> torch.Tensor:
    """``flash_attn_varlen_func`` in plain torch: segment ``i``'s queries ``query[cu_q[i]:cu_q[i+1]]`` attend to the
    keys ``key[cu_k[i]:cu_k[i+1]]``, causally aligned to the end (FlashAttention's rule when a segment has fewer
    queries than keys); grouped-query heads, sliding window and softcap as FlashAttention applies them."""
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[2]
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(dim)
    out = torch.empty_like(query)
    bounds_q, bounds_k = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(len(bounds_q) - 1):
        q = query[bounds_q[i] : bounds_q[i + 1]].transpose(0, 1)  # heads, Lq, dim
        k = key[bounds_k[i] : bounds_k[i + 1]].transpose(0, 1)
        v = value[bounds_k[i] : bounds_k[i + 1]].transpose(0, 1)
        if kv_heads != heads:
            k = k.repeat_interleave(heads // kv_heads, dim=0)
            v = v.repeat_interleave(heads // kv_heads, dim=0)
        scores = (q.float() @ k.float().transpose(1, 2)) * scale
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        lq, lk = q.shape[1], k.shape[1]
        rows = torch.arange(lq, device=q.device)[:, None] + (lk - lq)
        cols = torch.arange(lk, device=q.device)[None, :]
        allowed = torch.ones(lq, lk, dtype=torch.bool, device=q.device)
        if causal:
            allowed &= cols <= rows
        if window_size[0] >= 0:
            allowed &= cols >= rows - window_size[0]
        if window_size[1] >= 0:
            allowed &= cols <= rows + window_size[1]
        scores = scores.masked_fill(~allowed, float("-inf"))
        out[bounds_q[i] : bounds_q[i + 1]] = (scores.softmax(-1) @ v.float()).transpose(0, 1).to(query.dtype)
    return out


class _TorchFlashAttention:
    """Stands in for the FlashAttention-3 kernel module TRL loads through ``kernels``."""

    flash_attn_varlen_func = staticmethod(torch_varlen_attention)


_TORCH_FLASH = _TorchFlashAttention()


def _no_peak_flops(accelerator: Any, dtype: str) -> float | None:
    """The peak-FLOPs lookup on a device without CUDA: unknown (TRL then reports no MFU)."""
    return None


def apply_cpu_patches(force: bool = False) -> bool:
    """On a machine without CUDA (or ``force``), replace TRL's FA3 tree-attention kernel with
    :func:`torch_varlen_attention` and its CUDA-only peak-FLOPs lookup with "unknown". Idempotent; returns whether
    the patches are in place. With CUDA, TRL's own kernel and lookup stay."""
    if torch.cuda.is_available() and not force:
        return False
    _packing._flash_attn = lambda: _TORCH_FLASH
    _trainer_module.get_peak_flops_per_device = _no_peak_flops
    return True


# ---- the trainer ----------------------------------------------------------------------------------------------------
class _AdapterSyncTransfer:
    """The trainer's ``weight_transfer``: the trainer here syncs adapters itself (:meth:`EnvkitAsyncGRPOTrainer.
    _sync_weight`), so this only opens and closes the publisher (set up at train begin, everything unloaded at the
    end)."""

    def __init__(self, publisher: AdapterPublisher) -> None:
        self.publisher = publisher

    def init_weight_transfer(self) -> None:
        """Nothing to set up: adapters travel as files."""

    def pause(self) -> None:
        """Servers keep generating during a sync: requests name their adapter."""

    def resume(self) -> None:
        """See :meth:`pause`."""

    def send_weights(self, iterator: Any) -> None:
        """Never called: full-weight sync is not how envkit's asynchronous training moves weights."""
        raise RuntimeError("envkit's asynchronous training syncs LoRA adapters, never full weights")

    def destroy(self) -> None:
        """Unload every adapter of the run from every server (a second run on the same servers starts clean)."""
        self.publisher.close()


class _LastTaken:
    """The rollout queue as TRL's queue dataset reads it, remembering the sample it took last (TRL's dataset yields a
    dict without the sample's ``model_version``; the one it yields is always the one it took last)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.last: Any = None

    def get(self, *args: Any, **kwargs: Any) -> Any:
        """``queue.get``, remembered."""
        self.last = self.inner.get(*args, **kwargs)
        return self.last

    def qsize(self) -> int:
        """``queue.qsize``."""
        return self.inner.qsize()


class _GatedRolloutQueue(RolloutQueueDataset):
    """TRL's queue dataset, checking each sample against the version it will be *trained* under (see the module), and
    stamping each yielded item with its sample's ``model_version``."""

    trainer: EnvkitAsyncGRPOTrainer

    total_yielded = 0
    """Samples yielded into training slots since the dataset was made (drops excluded): the rollout worker's
    admission counts queue positions from it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.queue = _LastTaken(self.queue)

    def __iter__(self) -> Any:
        self.yielded = 0
        for item in super().__iter__():
            item[SAMPLE_VERSION] = int(self.queue.last.model_version)
            self.yielded += 1
            self.total_yielded += 1
            yield item


SAMPLE_VERSION = "sample_version"
"""The collated batch's key holding each sample's policy version: ``(rows, samples)``, row ``i`` the versions of row
``i``'s samples in their order (the order of ``segment_id``), padded with −1."""


class VersionStampingCollator(DataCollatorForRollout):
    """TRL's collator, adding :data:`SAMPLE_VERSION` to the batch (see the module)."""

    def torch_call(self, examples: list[Any]) -> dict[str, Any]:
        """TRL's packed batch of the micro-batch's rows, with each row's sample versions."""
        batch = super().torch_call(examples)
        (rows,) = examples
        versions = [torch.tensor([int(x[SAMPLE_VERSION]) for x in row.samples], dtype=torch.long) for row in rows]
        batch[SAMPLE_VERSION] = torch.nn.utils.rnn.pad_sequence(versions, batch_first=True, padding_value=-1)
        return batch


class EnvkitAsyncGRPOTrainer(AsyncGRPOTrainer):
    """TRL's ``AsyncGRPOTrainer`` with adapter-only sync to several servers and exact staleness (see the module).

    Args:
        publisher: Loads each version's adapter into the servers (main process; other processes may pass one too,
            it is not used there).
        args, kwargs: ``AsyncGRPOTrainer``'s (``peft_config`` is required: the policy is a LoRA adapter;
            ``weight_transfer`` is set here).
    """

    def __init__(self, *args: Any, publisher: AdapterPublisher, **kwargs: Any) -> None:
        if kwargs.get("peft_config") is None:
            raise ValueError("envkit's asynchronous training syncs a LoRA adapter: pass peft_config")
        config = kwargs.get("args")
        if config is not None and config.max_staleness < 1:
            # With the bound checked where samples train, 0 can never be met: accelerate fetches step n+1's first
            # micro-batch before step n's sync, so every sample fetched then would be dropped, forever (a livelock).
            raise ValueError(
                f"max_staleness must be at least 1 (got {config.max_staleness}): accelerate fetches each step's first "
                "micro-batch before the previous step's weight sync"
            )
        if config is not None and (config.token_budget is None or config.token_budget > 0):
            config.token_budget = 0  # fixed-count micro-batches: what makes the staleness gate exact
        self.publisher = publisher
        self.staleness_seen: list[int] = []
        """The staleness of every sample that reached the loss, masked ones included (main process; every process's
        samples), for tests, benchmarks and the run summary."""
        self.stale_masked = 0
        """Samples that reached the loss past ``max_staleness`` and were masked out of it (main process)."""
        self._first_step = 0  # the global step training starts from (a resumed run's checkpoint's)
        self.training_activity = Activity()
        """When this process ran a forward/backward pass (:mod:`~envkit.adapters.vllm.timeline`)."""
        super().__init__(*args, weight_transfer=_AdapterSyncTransfer(publisher), **kwargs)

    def add_callback(self, callback: Any) -> None:
        """Add a callback as ``Trainer.add_callback`` does, without its "there is already one" warning for TRL's
        ``StepIntervalCallback``: TRL adds two on purpose (the weight sync and the step metrics).

        Args:
            callback: A ``TrainerCallback`` instance or class.
        """
        if isinstance(callback, _trainer_module.StepIntervalCallback):
            self.callback_handler.callbacks.append(callback)
            return
        super().add_callback(callback)

    # -- weight sync --
    def _sync_weight(self) -> None:
        """Save the adapter (a collective: every process), load it into every server (main), bump the version."""
        started = time.time()
        version = self.model_version + 1
        model = self.accelerator.unwrap_model(self.model)
        self.accelerator.wait_for_everyone()
        save_lora_adapter(model, self.accelerator, self._adapter_name, str(self.publisher.path(version)))
        saved = time.time()
        self.accelerator.wait_for_everyone()
        report = self.publisher.publish(version) if self.accelerator.is_main_process else None
        # Every process knows the version of its weights: the loss-side staleness check runs on each.
        self.model_version = version
        if report is not None:
            if self.rollout_worker is not None:
                self.rollout_worker.update_model_version(version)
            metrics = self._metrics["train"]
            metrics["perf/weight_sync_s"].append(time.time() - started)
            metrics["perf/weight_sync_save_s"].append(saved - started)
            metrics["perf/weight_sync_load_s"].append(report["load_s"])
            metrics["envkit/sync_failures_total"].append(float(len(report["failed"])))
            metrics["envkit/quarantined_servers"].append(float(len(report["quarantined"])))

    # -- checkpoints --
    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        """TRL's checkpoint, with the rollout's place in it first (main process,
        :data:`~.rollout_state.ROLLOUT_STATE_FILE`): the worker's
        :meth:`~.worker.EnvkitRolloutWorker.resume_state` and the policy version."""
        if self.accelerator.is_main_process and self.rollout_worker is not None:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = Path(self._get_output_dir(trial=trial)) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            state = {**self.rollout_worker.resume_state(), "model_version": self.model_version}
            (folder / ROLLOUT_STATE_FILE).write_text(json.dumps(state))
        super()._save_checkpoint(model, trial)

    def _inner_training_loop(self, *args: Any, **kwargs: Any) -> Any:
        """TRL's loop; resumed from a checkpoint, the worker plays the groups the cut run had not finished with, and
        every process starts at its policy version (the next sync publishes the version after it)."""
        checkpoint = kwargs.get("resume_from_checkpoint")
        if checkpoint is not None:
            state = read_rollout_state(checkpoint)
            if state is None:
                raise ValueError(f"{checkpoint} has no {ROLLOUT_STATE_FILE}: no --async run saved it")
            self.model_version = state["model_version"]
            if self.rollout_worker is not None:
                self.rollout_worker.resume_at(
                    state["next_group"], state["done_after"], self._trained_into_version(checkpoint)
                )
                self.rollout_worker.update_model_version(self.model_version)
        return super()._inner_training_loop(*args, **kwargs)

    # -- staleness --
    def _trained_into_version(self, checkpoint: str) -> int:
        """The samples the run cut at ``checkpoint`` had trained under its last policy version: TRL syncs after every
        global step that is a multiple of ``weight_sync_steps``, so a checkpoint at another step is that many steps
        into a version (read from Trainer's own ``trainer_state.json``)."""
        from transformers.trainer import TRAINER_STATE_NAME
        from transformers.trainer_callback import TrainerState

        step = TrainerState.load_from_json(str(Path(checkpoint) / TRAINER_STATE_NAME)).global_step
        every = max(int(self.args.weight_sync_steps), 1)
        accumulation = max(int(self.args.gradient_accumulation_steps), 1)
        return (int(step) % every) * self._microbatch_size() * accumulation

    def _microbatch_size(self) -> int:
        return int(self.args.per_device_train_batch_size) * int(self.accelerator.num_processes)

    def _version_when_trained(self, microbatch: int) -> int:
        """The policy version micro-batch ``microbatch`` (0-based, in fetch order) trains under, asked while it is
        fetched. accelerate fetches micro-batch n (n ≥ 1) during the step of n − 1, so n trains one version later
        exactly when it opens a new optimizer step and a weight sync ended the previous one (TRL syncs after every
        global step that is a multiple of ``weight_sync_steps``: a resumed run's steps count from its checkpoint's,
        read when micro-batch 0 is fetched)."""
        now = self.model_version
        if microbatch == 0:
            self._first_step = int(self.state.global_step)
            return now
        accumulation = max(int(self.args.gradient_accumulation_steps), 1)
        every = max(int(self.args.weight_sync_steps), 1)
        before, this = (microbatch - 1) // accumulation, microbatch // accumulation
        return now + 1 if this > before and (self._first_step + this) % every == 0 else now

    def get_train_dataloader(self) -> Any:
        """TRL's dataloader, with the queue dataset checking staleness against the version each sample trains under
        and the collator stamping each sample's version into the batch."""
        originals = _trainer_module.RolloutQueueDataset, _trainer_module.DataCollatorForRollout
        _trainer_module.RolloutQueueDataset = _GatedRolloutQueue
        _trainer_module.DataCollatorForRollout = VersionStampingCollator
        try:
            loader = super().get_train_dataloader()
        finally:
            _trainer_module.RolloutQueueDataset, _trainer_module.DataCollatorForRollout = originals
        dataset = self._rollout_dataset
        if dataset is not None:
            dataset.trainer = self
            if self.rollout_worker is not None and hasattr(self.rollout_worker, "consumed"):
                self.rollout_worker.consumed = lambda: dataset.total_yielded
            dataset.model_version_fn = lambda: self._version_when_trained(
                getattr(dataset, "yielded", 0) // self._microbatch_size()
            )
        return loader

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        """TRL's step, timed (:attr:`training_activity`)."""
        self.training_activity.enter()
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            self.training_activity.exit()

    def compute_loss(
        self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, num_items_in_batch: Any = None
    ) -> Any:
        """TRL's loss over the samples within the staleness bound (:meth:`mask_stale`)."""
        return super().compute_loss(model, self.mask_stale(inputs), return_outputs, num_items_in_batch)

    def mask_stale(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """Check each sample of this process's row against the version of the weights it trains (``model_version``):
        the loss terms of a sample more than ``max_staleness`` versions behind are taken out (``token_index`` −1, as
        TRL marks padding), and out of the batch-wide token count the loss is divided by. A row left with no term
        keeps one with advantage 0 and old log-probability 0 (a zero, finite term: TRL's per-row statistics need one).
        Every process's staleness reaches the main process, which records it (:attr:`staleness_seen`, the
        ``envkit/staleness_*`` metrics, ``envkit/stale_masked_total``). A collective on every process.

        Args:
            inputs: One micro-batch as TRL's collator built it with :data:`SAMPLE_VERSION` (this process's row).

        Returns:
            The inputs TRL's loss takes (:data:`SAMPLE_VERSION` removed).
        """
        inputs = dict(inputs)
        row = inputs.pop(SAMPLE_VERSION)
        versions = row[row >= 0]
        staleness = self.model_version - versions
        over = staleness > int(self.args.max_staleness)
        selected = inputs["token_index"] >= 0
        where = selected.nonzero(as_tuple=True)
        stale_terms = over[inputs["segment_id"][selected]]
        masked = int(stale_terms.sum())
        if masked:
            token_index = inputs["token_index"].clone()
            token_index[tuple(i[stale_terms] for i in where)] = -1
            if masked == len(stale_terms):  # nothing left in this row: one inert term
                first = tuple(i[:1] for i in where)
                token_index[first] = inputs["token_index"][first]
                for key in ("advantages", "old_log_probs"):
                    inputs[key] = inputs[key].clone()
                    inputs[key][first] = 0.0
            inputs["token_index"] = token_index
        counts = torch.tensor([masked], dtype=torch.float32, device=row.device)
        seen = staleness
        if self.accelerator.num_processes > 1:
            counts = self.accelerator.reduce(counts, reduction="sum")
            padded = self.accelerator.pad_across_processes(staleness, dim=0, pad_index=_NO_SAMPLE)
            seen = self.accelerator.gather(padded)
            seen = seen[seen != _NO_SAMPLE]
        if int(counts[0]):
            inputs["global_n_tokens"] = inputs["global_n_tokens"] - counts[0].to(inputs["global_n_tokens"].dtype)
        if self.accelerator.is_main_process and seen.numel():
            values = [int(x) for x in seen.tolist()]
            past = sum(x > int(self.args.max_staleness) for x in values)
            self.staleness_seen.extend(values)
            self.stale_masked += past
            metrics = self._metrics["train"]
            metrics["envkit/staleness_mean"].append(sum(values) / len(values))
            metrics["envkit/staleness_max"].append(float(max(values)))
            metrics["envkit/stale_masked_total"].append(float(past))
        return inputs


_NO_SAMPLE = -(2**31)
"""Padding of the staleness gathered from every process (a staleness is never that)."""
