"""The GPU path once: rollouts and bf16 GRPO training steps with a randomly initialised Qwen2.5-0.5B-shaped model.

A random model never calls a tool, so the figures measure the machinery (rendering, batching, sampling, env steps,
TRL's loss) at the real model's size, not learning. What it prints (``--json`` for one JSON object):

* rollouts: ``RolloutEngine`` + ``TransformersBackend`` (bf16, CUDA) on ``arithmetic`` (tools) and ``guess-number``
  (text) at several episode counts: episodes/s, model tokens/s, the share of time spent generating; and the largest
  difference between the recorded logprobs and a teacher-forced forward pass of the same model (what TRL's
  importance-sampling correction compares).
* training: ``envkit train`` (TRL GRPOTrainer, its default LoRA, bf16) for a few steps: seconds per step after the
  first, peak GPU memory.

Usage (on a CUDA machine; the tokenizer folder holds the real Qwen2.5 tokenizer and chat template)::

    python benchmarks/gpu.py --tokenizer PATH/qwen2.5-instruct [--episodes 64,256] [--train-steps 6] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

QWEN25_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


def build_model(tokenizer_dir: str, out: Path, layers: int | None) -> Path:
    """A randomly initialised Qwen2.5-0.5B-shaped model (bf16) saved with the tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    shape = dict(QWEN25_05B, num_hidden_layers=layers or QWEN25_05B["num_hidden_layers"])
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def rollouts(model_dir: Path, env_name: str, episodes: int, device: str) -> dict[str, Any]:
    """One timed engine run (after a discarded warm-up) and the logprob check on a sample of its episodes."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import envkit
    from envkit.backends import SamplingParams, TransformersBackend
    from envkit.rollout import RolloutEngine, summarize, teacher_forced_logprobs

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to(device).eval()
    engine = RolloutEngine(lambda: envkit.make(env_name), TransformersBackend(model, tokenizer), tokenizer, max_turns=4)
    sampling = SamplingParams(temperature=1.0, top_k=None, max_new_tokens=48, seed=0)
    engine.run(list(range(4)), 2, sampling)  # warm-up: CUDA kernels, the template probes
    group = 4
    tasks = list(range(1000, 1000 + episodes // group))
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    done = engine.run(tasks, group, sampling)
    seconds = time.perf_counter() - start
    model_tokens = sum(sum(e.env_mask) for e in done)
    generate = sum(e.timings.get("generate", 0.0) for e in done) / max(1, len(done))
    total = sum(e.timings.get("total", 0.0) for e in done) / max(1, len(done))
    diffs = []
    for episode in done[:8]:
        reference = teacher_forced_logprobs(model, episode)
        diffs += [abs(a - b) for a, b, m in zip(episode.logprobs, reference, episode.env_mask, strict=True) if m]
    summary = summarize(done)
    return {
        "env": env_name,
        "episodes": len(done),
        "seconds": round(seconds, 3),
        "episodes_per_s": round(len(done) / seconds, 2),
        "model_tokens_per_s": round(model_tokens / seconds, 1),
        "mean_turns": round(summary["mean_turns"], 2),
        "errors": sum(e.error is not None for e in done),
        "generate_share_of_episode_time": round(generate / total, 3) if total else None,
        "max_abs_logprob_diff_bf16": round(max(diffs), 4) if diffs else None,
        "median_abs_logprob_diff_bf16": round(statistics.median(diffs), 5) if diffs else None,
    }


def compare_samplers(model_dir: Path, episodes: int, repeats: int) -> dict[str, Any]:
    """Side by side on one model: TransformersBackend's counter-based row sampler vs one ``torch.Generator`` per row
    (a ``multinomial`` call per row per token, envkit's sampler before 2026-11-23), each with ``max_batch_size`` 64
    and 256; a discarded warm-up, arms alternated, ``repeats`` timed runs each (median, min, max seconds)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import envkit
    import envkit.backends.transformers as module
    from envkit.backends import SamplingParams, TransformersBackend
    from envkit.rollout import RolloutEngine

    class PerRowGenerators(module._RowSampler):
        def __init__(self, sampling: Any, seeds: list[int], pad_widths: list[int], device: Any) -> None:
            super().__init__(sampling, seeds, pad_widths, device)
            self.generators = [torch.Generator(device=device).manual_seed(int(s) % 2**63) for s in seeds]

        def sample(self, logprobs: Any) -> Any:
            probs = logprobs.exp()
            return torch.cat([torch.multinomial(probs[r], 1, generator=g) for r, g in enumerate(self.generators)])

    counter_sampler = module._RowSampler
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).to("cuda").eval()
    sampling = SamplingParams(temperature=1.0, top_k=None, max_new_tokens=48, seed=0)
    arms = [(name, size) for name in ("counter", "per-row") for size in (64, 256)]
    times: dict[str, list[float]] = {f"{name}/batch{size}": [] for name, size in arms}
    tasks = list(range(1000, 1000 + episodes // 4))
    for repeat in range(repeats + 1):
        order = arms if repeat % 2 == 0 else arms[::-1]
        for name, size in order:
            module._RowSampler = counter_sampler if name == "counter" else PerRowGenerators
            try:
                backend = TransformersBackend(model, tokenizer, max_batch_size=size)
                engine = RolloutEngine(lambda: envkit.make("arithmetic"), backend, tokenizer, max_turns=1)
                torch.cuda.synchronize()
                start = time.perf_counter()
                engine.run(tasks if repeat else tasks[:2], 4, sampling)
                torch.cuda.synchronize()
                if repeat:  # repeat 0 is the warm-up
                    times[f"{name}/batch{size}"].append(time.perf_counter() - start)
            finally:
                module._RowSampler = counter_sampler
    return {
        "episodes": episodes,
        "repeats": repeats,
        "seconds": {
            arm: {"median": round(statistics.median(v), 3), "min": round(min(v), 3), "max": round(max(v), 3)}
            for arm, v in times.items()
        },
    }


def training(model_dir: Path, steps: int, out: Path) -> dict[str, Any]:
    """``envkit train`` for ``steps`` steps (bf16, envkit train's default LoRA); seconds per step after the first."""
    import torch

    from envkit.adapters.trl.train import run
    from envkit.util.options import as_flags

    torch.cuda.reset_peak_memory_stats()
    times: list[float] = []
    marks: list[float] = [time.perf_counter()]

    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            marks[0] = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            marks.append(time.perf_counter())
            times.append(marks[-1] - marks[-2])

    summary = run(
        as_flags(
            env="arithmetic",
            model=model_dir,
            output_dir=out,
            max_steps=steps,
            bf16=True,
            per_device_train_batch_size=16,
            rl_num_generations=4,
            rl_max_new_tokens=64,
            max_turns=3,
            learning_rate=1e-6,
            train_tasks=64,
            eval_tasks=0,
            save_strategy="no",
        ),
        log=lambda *_: None,
        callbacks=[StepTimer()],
    )
    later = times[1:] or times
    return {
        "steps": summary.get("train_steps"),
        "first_step_s": round(times[0], 2) if times else None,
        "median_step_s_after_first": round(statistics.median(later), 2) if later else None,
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "batch": "16 episodes (4 tasks x 4), <= 3 turns x 64 tokens, LoRA r16, bf16",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", required=True, help="folder of the real Qwen2.5 tokenizer and chat template")
    parser.add_argument("--episodes", default="64,256", help="episode counts of the rollout runs")
    parser.add_argument("--train-steps", type=int, default=6)
    parser.add_argument("--layers", type=int, help="fewer layers than 24, for a quick check")
    parser.add_argument("--cpu-check", action="store_true", help="rollouts only, on CPU (checks the script itself)")
    parser.add_argument("--compare-samplers", type=int, metavar="REPEATS", help="only the side-by-side sampler runs")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import torch

    device = "cpu" if args.cpu_check else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device (--cpu-check runs the script on CPU)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    result: dict[str, Any] = {"device": name, "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_model(args.tokenizer, Path(tmp) / "model", args.layers)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_dir)
        result["model"] = f"random Qwen2-architecture, {config.num_hidden_layers} layers, hidden {config.hidden_size}"
        if args.compare_samplers:
            result["samplers"] = compare_samplers(model_dir, int(args.episodes.split(",")[-1]), args.compare_samplers)
            print(json.dumps(result, indent=None if args.json else 2))
            return 0
        result["rollouts"] = [
            rollouts(model_dir, env, int(n), device)
            for env in ("arithmetic", "guess-number")
            for n in args.episodes.split(",")
        ]
        if device == "cuda":
            result["training"] = training(model_dir, args.train_steps, Path(tmp) / "train")
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
