"""Run by ``tests/test_async_cli.py`` under ``accelerate launch --multi_gpu --num_processes 2`` (``use_cpu``: DDP over
gloo): ``envkit train --async`` exactly as the command line runs it (:func:`envkit.adapters.trl.train.run`), with each
process recording what it trained. Writes ``OUT/rank{N}.json`` (per micro-batch: this process's row of the packed
batch — a digest of its tokens, its trained-token count, the batch-wide count TRL reduces — and the logged metrics)
and ``OUT/rank{N}.pt`` (this process's LoRA weights at the end).

Usage: ``python async_ddp_script.py OUT ENVKIT-TRAIN-ARGS...`` (the env may be ``async_ddp_script:Letters``, below)
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import envkit
from envkit.util.process_exit import exit_without_finalizing


class Letters(envkit.Env):
    """Two assistant turns; score = the share of ASCII letters in what the model said: it varies within a group even
    for a random model, so advantages are non-zero and training moves the adapter (``async_ddp_script:Letters``)."""

    max_turns = 2

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.said = ""
        return [{"role": "user", "content": f"Task {seed}: write letters."}], {}

    def step(self, action):
        self.said += (action.get("content") if isinstance(action, dict) else str(action)) or ""
        return [{"role": "user", "content": "More."}], 0.0, False, False, {}

    def score(self) -> float:
        return sum(c.isascii() and c.isalpha() for c in self.said) / max(len(self.said), 1)


def main() -> None:
    import torch
    from peft import get_peft_model_state_dict

    from envkit.adapters.trl.async_grpo import trl_async
    from envkit.adapters.trl.train import run

    out, argv = Path(sys.argv[1]), sys.argv[2:]
    rank = int(os.environ.get("RANK", "0"))
    rows: list[dict] = []
    seen: list = []
    original = trl_async.EnvkitAsyncGRPOTrainer.training_step

    def recording_step(self, model, inputs, num_items_in_batch=None):
        ids = inputs["input_ids"][inputs["attention_mask"].bool()].tolist()
        rows.append(
            {
                "step": int(self.state.global_step),
                "digest": hashlib.sha256(json.dumps(ids).encode()).hexdigest(),
                "tokens": len(ids),
                "trained_tokens": int((inputs["shift_labels"] != -100).sum()),
                "global_trained_tokens": float(inputs["global_n_tokens"][0]),
            }
        )
        if not seen:
            seen.append(self)
        return original(self, model, inputs, num_items_in_batch)

    trl_async.EnvkitAsyncGRPOTrainer.training_step = recording_step
    summary = run(argv)
    trainer = seen[0]
    state = get_peft_model_state_dict(trainer.accelerator.unwrap_model(trainer.model))
    torch.save({k: v.detach().cpu() for k, v in state.items()}, out / f"rank{rank}.pt")
    (out / f"rank{rank}.json").write_text(
        json.dumps(
            {
                "rows": rows,
                "summary": summary,
                "log_history": trainer.state.log_history,
                "world": trainer.accelerator.num_processes,
            },
            default=float,
        )
    )


if __name__ == "__main__":
    main()
    # run() destroyed the process group, but DDP keeps gloo's threads alive: end as python -m envkit.cli does (a gloo
    # thread touching Python during interpreter finalization aborts the rank; see envkit.util.process_exit).
    exit_without_finalizing(0)
