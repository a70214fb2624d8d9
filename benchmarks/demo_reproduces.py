"""What of the demo (``scripts/demo.sh``) repeats from run to run, and what its warm start costs per step with torch on
all cores vs one thread. The figures ``scripts/demo.sh`` and the README quote come from this script.

1. The tokenizer built twice from the same training corpus: the same vocabulary?
2. SFT steps of the demo's warm start (its model, batch and learning rate, ``benchmarks/learning.py``'s ``sft``) from
   one seed: twice on torch's default threads and once on 1 thread; the largest parameter difference between them.
3. Held-out evaluation episodes of that model (the same sampling seed): batched on the default threads, batched on 1
   thread, and one episode at a time: how many of them have the same tokens.
4. Seconds per warm-start step on the default threads and on 1, measured alternately (``--timing-rounds`` rounds, each
   the difference between a short and a long run, so setup cost cancels out), with the load average.

Usage: ``python benchmarks/demo_reproduces.py [--steps 25] [--timing-rounds 2] [--no-timing]``; prints one JSON object.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _learning() -> Any:
    """``benchmarks/learning.py`` as a module (the demo's own functions)."""
    spec = importlib.util.spec_from_file_location("benchmark_learning", HERE / "learning.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Run the checks; return (and print) their results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25, help="SFT steps compared across thread counts (default 25)")
    parser.add_argument("--demos", type=int, default=64, help="oracle demonstrations to train on (default 64)")
    parser.add_argument("--eval-tasks", type=int, default=16, help="held-out episodes compared (default 16)")
    parser.add_argument("--timing-rounds", type=int, default=2, help="alternated timing rounds (default 2)")
    parser.add_argument("--no-timing", action="store_true", help="skip the timing (it is the slow part under load)")
    args = parser.parse_args(argv)

    import torch

    import envkit
    from envkit.backends import SamplingParams, TransformersBackend
    from envkit.demos import oracle_episodes
    from envkit.rollout import RolloutEngine
    from envkit.testing import build_tiny_model, build_tokenizer

    learning = _learning()
    defaults = learning.parser().parse_args([])
    work = Path(tempfile.mkdtemp(prefix="envkit-demo-reproduces-"))
    corpus = learning.training_corpus(range(200))
    tokenizer = build_tokenizer(work / "tokenizer", extra_corpus=corpus)
    again = build_tokenizer(work / "tokenizer-again", extra_corpus=corpus)
    demos = oracle_episodes(learning.factory, tokenizer, list(range(args.demos)))
    threads = torch.get_num_threads()

    def trained(steps: int, n_threads: int) -> tuple[Any, float]:
        torch.set_num_threads(n_threads)
        model = build_tiny_model(
            tokenizer,
            hidden_size=defaults.hidden_size,
            num_layers=defaults.num_layers,
            num_heads=defaults.num_heads,
            num_kv_heads=defaults.num_heads,
            max_position_embeddings=1024,
            seed=0,
        )
        started = time.perf_counter()
        learning.sft(
            model,
            tokenizer,
            demos,
            work / "sft",
            learning_rate=defaults.sft_learning_rate,
            seed=0,
            max_steps=steps,
            scheduler=defaults.sft_scheduler,
        )
        return model, time.perf_counter() - started

    def largest_difference(a: Any, b: Any) -> float:
        other = b.state_dict()
        return max((value - other[name]).abs().max().item() for name, value in a.state_dict().items())

    first, _ = trained(args.steps, threads)
    second, _ = trained(args.steps, threads)
    single, _ = trained(args.steps, 1)

    def episodes(n_threads: int, concurrency: int) -> list[list[int]]:
        torch.set_num_threads(n_threads)
        engine = RolloutEngine(
            lambda: envkit.make(learning.ENV, **learning.ENV_CONFIG),
            TransformersBackend(first, tokenizer),
            tokenizer,
            max_turns=defaults.max_turns,
            max_completion_tokens=defaults.max_completion_tokens,
            concurrency=concurrency,
        )
        sampling = SamplingParams(temperature=1.0, top_k=None, max_new_tokens=defaults.max_new_tokens, seed=0)
        seeds = list(range(learning.HELD_OUT_START, learning.HELD_OUT_START + args.eval_tasks))
        try:
            return [e.completion_ids for e in engine.run(seeds, 1, sampling)]
        finally:
            engine.close()

    batched = episodes(threads, 32)
    same = lambda a, b: sum(x == y for x, y in zip(a, b, strict=True))  # noqa: E731
    result: dict[str, Any] = {
        "torch_threads": threads,
        "same_tokenizer": tokenizer.get_vocab() == again.get_vocab(),
        f"sft_{args.steps}_steps_max_param_diff_default_vs_default": largest_difference(first, second),
        f"sft_{args.steps}_steps_max_param_diff_default_vs_1_thread": largest_difference(first, single),
        "eval_episodes": args.eval_tasks,
        "eval_same_tokens_batched_1_thread": same(batched, episodes(1, 32)),
        "eval_same_tokens_one_at_a_time": same(batched, episodes(threads, 1)),
    }
    if not args.no_timing:
        result["load_average_before"] = os.getloadavg()[0]
        for _ in range(args.timing_rounds):
            for n_threads in (threads, 1):
                _, short = trained(3, n_threads)
                _, long = trained(11, n_threads)
                result.setdefault(f"seconds_per_step_{n_threads}_threads", []).append(round((long - short) / 8, 3))
        result["load_average_after"] = os.getloadavg()[0]
    torch.set_num_threads(threads)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
