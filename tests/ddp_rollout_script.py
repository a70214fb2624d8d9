"""Run by ``tests/test_trl_multiprocess.py`` under ``accelerate launch --cpu --num_processes 2``: two GRPO steps with
envkit's ``rollout_func`` (the policy generates), then ``envkit train``'s held-out eval. Each process writes what it
played to ``OUT/rank{N}.json``; the main process also writes TRL's ``log_history``.

Usage: ``python ddp_rollout_script.py MODEL_DIR OUT``
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import envkit
from envkit.util.process_exit import exit_without_finalizing


class SeedScored(envkit.Env):
    """One turn; the score is the task seed's last digit / 10, so the two processes' episodes score differently.
    Every reset is recorded (per process) in ``seen``."""

    max_turns = 1
    seen: list[int] = []  # noqa: RUF012

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.task = int(seed)
        SeedScored.seen.append(self.task)
        return [{"role": "user", "content": f"Task {seed}: say something."}], {}

    def step(self, action):
        return [], self.score(), True, False, {}

    def score(self) -> float:
        return (self.task % 10) / 10


def main() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from envkit.adapters.trl import build_dataset, env_score_reward, make_rollout_func
    from envkit.adapters.trl.config import TrainArguments
    from envkit.adapters.trl.heldout import EVAL_SEED_OFFSET, evaluate_heldout

    model_dir, out = sys.argv[1], Path(sys.argv[2])
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    played: list[dict] = []
    holder: dict = {}

    def record(episodes):
        step = holder["trainer"].state.global_step
        played.append({"step": step, "seeds": [e.task_seed for e in episodes], "scores": [e.score for e in episodes]})

    config = GRPOConfig(
        output_dir=str(out / "run"),
        per_device_train_batch_size=4,
        num_generations=2,
        max_steps=2,
        max_completion_length=4,
        bf16=False,
        use_cpu=True,
        report_to="none",
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
        seed=3,
    )
    trainer = holder["trainer"] = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        args=config,
        reward_funcs=env_score_reward,
        train_dataset=build_dataset(SeedScored, range(16)),
        processing_class=tokenizer,
        rollout_func=make_rollout_func(SeedScored, tokenizer=tokenizer, on_episodes=record),
    )
    trainer.train()
    SeedScored.seen.clear()
    args = TrainArguments(model=model_dir, eval_tasks=6, eval_samples=2, max_turns=1)
    summary = evaluate_heldout(trainer, SeedScored, tokenizer, args)
    rank = trainer.accelerator.process_index
    report = {
        "rank": rank,
        "played": played,
        "eval_seen": [s for s in SeedScored.seen if s >= EVAL_SEED_OFFSET],
        "eval_summary": summary,
    }
    if trainer.accelerator.is_main_process:
        report["log_history"] = trainer.state.log_history
    (out / f"rank{rank}.json").write_text(json.dumps(report, default=float))
    trainer.accelerator.end_training()  # destroys the process group


if __name__ == "__main__":
    main()
    # DDP keeps gloo's threads alive past end_training(); one touching Python during interpreter finalization aborts
    # the rank ("terminate called without an active exception", exit -6: seen twice in CI); envkit.util.process_exit.
    exit_without_finalizing(0)
