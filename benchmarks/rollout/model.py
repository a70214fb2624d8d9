"""The benchmark's model: a tiny Qwen2 warm-started on oracle demonstrations of both envs, built once and saved, so
that every arm loads identical files."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .workloads import WORLD, CapitalsEnv, ChainEnv

RECIPE = {"hidden": 64, "layers": 2, "seed": 0, "sft_steps": 800, "lr": 3e-3, "seeds": 64, "version": 2}
"""How the checkpoint is built; a saved checkpoint whose ``recipe.json`` differs is rebuilt."""


def prepare_checkpoint(path: Path, *, sft: bool, log: Callable[[str], None]) -> Path:
    """Build (or reuse, when ``path/recipe.json`` matches) the benchmark's checkpoint, tokenizer and model, so that
    every arm loads identical files."""
    recipe = {**RECIPE, "sft": sft}
    stamp = path / "recipe.json"
    if stamp.is_file() and json.loads(stamp.read_text()) == recipe:
        return path
    import torch

    from envkit.testing import build_tiny_model, build_tokenizer

    torch.set_num_threads(1)  # see run_benchmark: OpenMP teams on shared cores stall

    path.mkdir(parents=True, exist_ok=True)
    corpus = [f"capital of {c} is {v}. Next: {c}." for c, v in WORLD.items()]
    tokenizer = build_tokenizer(path / "tokenizer", extra_corpus=corpus)
    model = build_tiny_model(tokenizer, seed=RECIPE["seed"], hidden_size=RECIPE["hidden"], num_layers=RECIPE["layers"])
    if sft:
        start = time.perf_counter()
        warm_start(model, tokenizer, path / "sft")
        log(f"checkpoint: SFT {RECIPE['sft_steps']} steps in {time.perf_counter() - start:.0f} s")
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    stamp.write_text(json.dumps(recipe))
    return path


def warm_start(model: Any, tokenizer: Any, output_dir: Path) -> None:
    """SFT on oracle episodes of both envs at once (so the model calls tools and follows the chain)."""
    from trl import SFTConfig, SFTTrainer

    from envkit.adapters.trl.sft import demonstrations_dataset
    from envkit.demos import oracle_episodes

    seeds = list(range(RECIPE["seeds"]))
    episodes = oracle_episodes(CapitalsEnv, tokenizer, seeds) + oracle_episodes(ChainEnv, tokenizer, seeds)
    config = SFTConfig(
        output_dir=str(output_dir),
        max_steps=RECIPE["sft_steps"],
        learning_rate=RECIPE["lr"],
        per_device_train_batch_size=8,
        lr_scheduler_type="cosine",
        warmup_steps=10,
        logging_steps=50,
        save_strategy="no",
        report_to="none",
        bf16=False,
        use_cpu=True,
        max_length=None,
        disable_tqdm=True,
        seed=RECIPE["seed"],
    )
    SFTTrainer(
        model=model, args=config, train_dataset=demonstrations_dataset(episodes), processing_class=tokenizer
    ).train()
    model.eval()


def load(path: Path) -> tuple[Any, Any]:
    """A fresh model and tokenizer from the checkpoint (one per arm)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return model, tokenizer
