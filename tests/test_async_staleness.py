"""The staleness bound of ``envkit train --async`` is checked where the loss is computed
(:meth:`envkit.adapters.trl.async_grpo.trl_async.EnvkitAsyncGRPOTrainer.mask_stale`), from each sample's policy version
stamped into the collated batch, not from a model of accelerate's fetch timing: a sample past the bound gets no
gradient and is counted there, and the staleness metric is measured there.

The real ``AsyncGRPOTrainer`` subclass on CPU, with a tiny model: its real collator, tree packing, loss and training
loop. What stands in: the rollout worker (a queue filled with chosen ``RolloutSample``s, TRL's protocol) and the
servers' adapter endpoints (``httpx.MockTransport``), as neither is what is under test.
"""

from __future__ import annotations

import os
import queue
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl.experimental.async_grpo")

import httpx  # noqa: E402
import numpy as np  # noqa: E402

from envkit.adapters.trl.async_grpo import trl_async  # noqa: E402
from envkit.adapters.vllm.weights import AdapterPublisher  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

BOUND = 1


class QueueWorker:
    """TRL's ``RolloutWorkerProtocol`` over a queue the test fills."""

    def __init__(self, samples: list[Any]) -> None:
        self.rollout_buffer: queue.Queue = queue.Queue()
        self.metrics_queue: queue.Queue = queue.Queue()
        for sample in samples:
            self.rollout_buffer.put(sample)
        self.versions: list[int] = []

    def start(self) -> None:
        """Nothing runs: the queue is full already."""

    def stop(self) -> None:
        """Nothing to stop."""

    def update_model_version(self, model_version: int) -> None:
        self.versions.append(model_version)

    def check_health(self, stale_after_s: float) -> None:
        raise RuntimeError("the test's queue ran dry")


def _sample(tokens: list[int], *, version: int, advantage: float, group: int) -> Any:
    prompt = [3, 4, 5]
    return trl_async.RolloutSample(
        prompt=[{"role": "user", "content": "x"}],
        completion=[{"role": "assistant", "content": "y"}],
        input_ids=np.asarray(prompt + tokens, dtype=np.int64),
        completion_mask=np.asarray([0] * len(prompt) + [1] * len(tokens), dtype=np.int64),
        old_log_probs=np.asarray([0.0] * len(prompt) + [-2.0] * len(tokens), dtype=np.float32),
        advantage=advantage,
        model_version=version,
        group_id=group,
        metrics={},
    )


def _trainer(model_dir: Path, tokenizer: Any, tmp_path: Path, samples: list[Any], *, steps: int = 1, batch: int = 2):
    from datasets import Dataset
    from peft import LoraConfig

    trl_async.apply_cpu_patches()
    publisher = AdapterPublisher(
        ["http://stand-in:8000"],
        tmp_path / "adapters",
        run_id="t",
        transport=httpx.MockTransport(lambda request: httpx.Response(200, text="Success")),
    )
    config = trl_async.AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=steps,
        per_device_train_batch_size=batch,
        num_generations=2,
        max_staleness=BOUND,
        learning_rate=1e-2,
        use_cpu=True,
        bf16=False,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        activation_checkpointing=False,
        max_completion_length=8,
        vllm_server_base_url="http://stand-in:8000",
        seed=0,
    )
    worker = QueueWorker(samples)
    trainer = trl_async.EnvkitAsyncGRPOTrainer(
        model=str(model_dir),
        args=config,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "x"}]] * 8}),
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"),
        rollout_worker=worker,
        publisher=publisher,
    )
    return trainer, worker


def _batch(trainer: Any, samples: list[Any]) -> dict[str, Any]:
    """One micro-batch as the trainer's dataloader builds it: queue items, TRL's row packing, envkit's collator."""
    from trl.experimental.async_grpo.packing import TreeRow

    row = TreeRow()
    for sample in samples:
        row.add(
            {
                "input_ids": sample.input_ids,
                "completion_mask": sample.completion_mask,
                "old_log_probs": sample.old_log_probs,
                "advantage": sample.advantage,
                "group_id": sample.group_id,
                "metrics": sample.metrics,
                trl_async.SAMPLE_VERSION: sample.model_version,
            }
        )
    collator = trl_async.VersionStampingCollator(trainer.processing_class.pad_token_id, 1)
    return collator.torch_call([[row]])


def _lora_grads(trainer: Any, batch: dict[str, Any]) -> dict[str, Any]:
    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    trainer.current_gradient_accumulation_steps = 1
    trainer.compute_loss(model, batch).backward()
    grads = {n: (p.grad.clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return {n: g for n, g in grads.items() if "lora_" in n}


def test_a_sample_past_the_bound_gets_no_gradient_and_is_counted_at_the_loss(tiny_model_dir, local_tokenizer, tmp_path):
    """The same fresh sample, with and without a too-stale sample beside it in the micro-batch: identical gradients
    (the stale one contributes nothing, not even to the token count the loss is divided by); the stale one alone:
    zero gradient. Each is counted where the loss is computed, with its staleness."""
    trainer, _ = _trainer(tiny_model_dir, local_tokenizer, tmp_path, [])
    trainer.model_version = 5
    fresh = _sample([7, 8, 9], version=5, advantage=1.0, group=0)
    stale = _sample([7, 10, 11, 12], version=5 - BOUND - 2, advantage=-1.0, group=1)  # 3 versions behind

    alone = _lora_grads(trainer, _batch(trainer, [fresh]))
    assert any(g.abs().max() > 0 for g in alone.values())  # the fresh sample does move the adapter
    assert trainer.staleness_seen == [0] and trainer.stale_masked == 0

    both = _lora_grads(trainer, _batch(trainer, [fresh, stale]))
    for name, grad in alone.items():
        torch.testing.assert_close(both[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    assert trainer.staleness_seen == [0, 0, 3] and trainer.stale_masked == 1

    only_stale = _lora_grads(trainer, _batch(trainer, [stale]))
    assert all(g.abs().max() == 0 for g in only_stale.values())
    assert trainer.staleness_seen == [0, 0, 3, 3] and trainer.stale_masked == 2
    metrics = trainer._metrics["train"]
    assert metrics["envkit/stale_masked_total"] == [0.0, 1.0, 1.0]
    assert metrics["envkit/staleness_max"] == [0.0, 3.0, 3.0]

    at_the_bound = _sample([7, 8, 9], version=5 - BOUND, advantage=1.0, group=2)
    at_the_bound = _lora_grads(trainer, _batch(trainer, [at_the_bound]))
    assert any(g.abs().max() > 0 for g in at_the_bound.values())  # BOUND versions behind still trains
    assert trainer.stale_masked == 2


def test_training_holds_the_bound_at_the_loss_when_the_fetch_time_gate_lets_stale_samples_through(
    tiny_model_dir, local_tokenizer, tmp_path
):
    """Two real training steps. The gate that predicts, at fetch time, which version a micro-batch will train under is
    made to pass everything (as a change in accelerate's or transformers' fetch timing would make it mispredict):
    step 2's samples, generated by version 0, reach the loss at version 2. They get no gradient and are counted; the
    staleness logged and kept is the one measured at the loss."""
    fresh = [_sample([7, 8, 9 + i], version=1, advantage=(-1.0) ** i, group=i // 2) for i in range(2)]
    late = [_sample([7, 8, 9 + i], version=0, advantage=(-1.0) ** i, group=10 + i // 2) for i in range(2)]
    ahead = [_sample([7, 8], version=2, advantage=1.0, group=20 + i // 2) for i in range(2)]  # fetched, not trained
    trainer, worker = _trainer(tiny_model_dir, local_tokenizer, tmp_path, fresh + late + ahead, steps=2, batch=2)
    trainer._version_when_trained = lambda microbatch: -100  # the gate passes every sample
    grads: list[float] = []

    from transformers import TrainerCallback

    class Grads(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            lora = [p.grad for n, p in trainer.model.named_parameters() if "lora_" in n and p.grad is not None]
            grads.append(max((float(g.abs().max()) for g in lora), default=0.0))

    trainer.add_callback(Grads())
    trainer.train()
    assert trainer.state.global_step == 2 and worker.versions[:2] == [1, 2]
    assert grads[0] > 0 and grads[1] == 0.0  # step 2's samples were past the bound: no gradient
    assert trainer.staleness_seen == [0, 0, 2, 2] and trainer.stale_masked == 2
    history = trainer.state.log_history
    assert [e["envkit/stale_masked_total"] for e in history if "envkit/stale_masked_total" in e] == [0.0, 2.0]
    assert [e["envkit/staleness_max"] for e in history if "envkit/staleness_max" in e] == [0.0, 2.0]
