"""Rollout throughput: VLLMBackend (in-process vLLM) vs TransformersBackend on the same episodes.

Same tiny model (float32, saved locally), same env, tasks and sampling; the engine and everything else identical.
Run in the vLLM environment: ``.venv-vllm/bin/python benchmarks/vllm_rollout.py [--episodes 32] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch
from transformers import AutoModelForCausalLM

import envkit
from envkit.backends import SamplingParams, TransformersBackend, VLLMBackend
from envkit.backends.vllm_support import make_llm
from envkit.rollout import RolloutEngine
from envkit.testing import build_tiny_model, build_tokenizer, load_shared_tokenizer


def measure(engine: RolloutEngine, seeds: list[int], group: int, sampling: SamplingParams) -> dict[str, float]:
    engine.run(seeds[:1], 1, sampling)  # warm-up
    start = time.perf_counter()
    episodes = engine.run(seeds, group, sampling)
    seconds = time.perf_counter() - start
    tokens = sum(sum(e.env_mask) for e in episodes)
    return {
        "seconds": seconds,
        "episodes": len(episodes),
        "model_tokens": tokens,
        "turns": sum(e.turns for e in episodes),
        "eps_per_s": len(episodes) / seconds,
        "tokens_per_s": tokens / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tokenizer = load_shared_tokenizer() or build_tokenizer()
    seeds = list(range(args.episodes // args.group))
    sampling = SamplingParams(temperature=1.0, top_k=0, max_new_tokens=args.max_new_tokens, seed=0)
    factory = lambda: envkit.make("guess-number")  # noqa: E731
    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("VLLM_CACHE_ROOT", str(Path(tmp) / "cache"))
        build_tiny_model(tokenizer, tmp, hidden_size=args.hidden_size, num_layers=4)
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
        hf = measure(
            RolloutEngine(factory, TransformersBackend(model, tokenizer), tokenizer, max_turns=4),
            seeds,
            args.group,
            sampling,
        )
        llm = make_llm(tmp, max_model_len=2048, dtype="float32", enforce_eager=True)
        vllm_result = measure(
            RolloutEngine(factory, VLLMBackend(llm), tokenizer, max_turns=4), seeds, args.group, sampling
        )
    results = {
        "transformers": hf,
        "vllm": vllm_result,
        "params": sum(p.numel() for p in model.parameters()),
        "tokenizer_size": len(tokenizer),
        "torch_threads": torch.get_num_threads(),
        "vllm_vs_transformers_eps": vllm_result["eps_per_s"] / hf["eps_per_s"],
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name in ("transformers", "vllm"):
        r = results[name]
        print(
            f"{name:13} {r['eps_per_s']:7.2f} eps/s {r['tokens_per_s']:9.1f} model tok/s "
            f"({r['episodes']} episodes, {r['turns']} turns, {r['model_tokens']} tokens, {r['seconds']:.2f} s)"
        )
    print(
        f"vLLM / transformers: {results['vllm_vs_transformers_eps']:.2f}x episodes/s "
        f"({results['params']:,}-parameter model, {results['tokenizer_size']} tokens)"
    )


if __name__ == "__main__":
    main()
