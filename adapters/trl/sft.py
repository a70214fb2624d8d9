"""Warm-start a model by supervised fine-tuning on oracle demonstrations (TRL's SFTTrainer).

A randomly initialised or weak model rarely emits a well-formed tool call, so GRPO gets no signal. A short SFT on
the env's own oracle trajectories (token-exact, with the env's tokens masked out of the loss, exactly the layout GRPO
trains on later) fixes that. ``envkit sft ENV --model PATH --episodes N`` runs it from the command line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from envkit.core.env import Env
from envkit.demos import oracle_episodes
from envkit.models.loading import check_saved_tokenizer
from envkit.rollout import Episode


def demonstrations_dataset(episodes: list[Episode]) -> Any:
    """A pre-tokenized dataset for SFTTrainer: ``input_ids`` and ``assistant_masks`` (1 = model token)."""
    from datasets import Dataset

    return Dataset.from_dict(
        {
            "input_ids": [e.prompt_ids + e.completion_ids for e in episodes],
            "assistant_masks": [[0] * len(e.prompt_ids) + e.env_mask for e in episodes],
        }
    )


def on_cpu_unless_cuda() -> bool:
    """SFTConfig's ``use_cpu`` when the caller gives none: train on the GPU when CUDA is available, as ``envkit train``
    does, else on the CPU."""
    import torch

    return not torch.cuda.is_available()


def sft_on_oracle(
    model: Any,
    tokenizer: Any,
    env_factory: Callable[[], Env],
    *,
    seeds: list[int],
    output_dir: str,
    max_steps: int = 200,
    learning_rate: float = 3e-3,
    batch_size: int = 8,
    save: bool = True,
    log: Callable[[str], None] = print,
    **sft_args: Any,
) -> dict[str, float]:
    """Fine-tune ``model`` in place on oracle demonstrations of ``seeds``; returns TRL's training metrics.

    With ``save`` the model and tokenizer go to ``output_dir``, and the saved tokenizer is reloaded to check that it
    still produces the ids the model was trained on (:func:`envkit.models.loading.check_saved_tokenizer`).
    """
    from trl import SFTConfig, SFTTrainer

    episodes = oracle_episodes(env_factory, tokenizer, seeds)
    if not episodes:
        raise ValueError("the oracle solved none of the seeds: nothing to learn from")
    model_tokens = sum(sum(e.env_mask) for e in episodes)
    log(f"sft: {len(episodes)} oracle episodes, {model_tokens} model tokens to learn")
    config = SFTConfig(
        output_dir=output_dir,
        max_steps=max_steps,
        learning_rate=learning_rate,
        per_device_train_batch_size=min(batch_size, len(episodes)),
        lr_scheduler_type=sft_args.pop("lr_scheduler_type", "cosine"),
        warmup_steps=sft_args.pop("warmup_steps", min(10, max_steps // 10)),
        logging_steps=sft_args.pop("logging_steps", max(1, max_steps // 10)),
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=sft_args.pop("use_cpu", on_cpu_unless_cuda()),
        max_length=None,
        **sft_args,
    )
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=demonstrations_dataset(episodes), processing_class=tokenizer
    )
    result = trainer.train()
    model.eval()
    if save:
        trainer.save_model(output_dir)
        tokenizer.save_pretrained(output_dir)
        sample = "\n".join(str(m.get("content") or "") for m in episodes[0].messages)  # raw text, not yet normalized
        check_saved_tokenizer(tokenizer, output_dir, sample)
    return dict(result.metrics)
