"""Rollout throughput: envkit's engine vs TRL 1.16's environment_factory tool loop vs a naive sequential loop.

Same tiny model (warm-started by SFT on oracle demonstrations so that it really calls tools), same env, same
sampling and per-turn token budget, one process, measured side by side in one run:

(a) 32 concurrent episodes with instant tools: envkit's engine; TRL's own code path (``GRPOTrainer`` built with the
    env exported by ``to_environment_factory``, timing ``_generate_and_score_completions`` on one batch); the same
    TRL trainer fed by envkit's ``rollout_func``; a naive loop (one episode at a time, one turn at a time).
(b) the same with every tool call taking 50 ms (simulated I/O).
(c) the backend's raw generation time inside the engine run, to get the engine's overhead fraction.

The env ends an episode at the first turn without tool calls, which is exactly where TRL's loop stops, so both do
the same work per episode. Usage: ``python benchmarks/rollout.py [--episodes 32] [--repeats 3] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from capitals import CAPITALS, CapitalsEnv

import envkit
from envkit.backends import SamplingParams, TransformersBackend
from envkit.rollout import RolloutEngine

MAX_NEW_TOKENS = 40


class LatencyCapitals(CapitalsEnv):
    """The README's capitals env with a configurable tool latency (simulated I/O)."""

    latency_s = 0.0

    @envkit.tool
    def lookup_capital(self, country: str) -> str:
        """Look up the capital city of a country.

        Args:
            country: The country's English name, e.g. "France".
        """
        if self.latency_s:
            time.sleep(self.latency_s)
        if country not in CAPITALS:
            raise envkit.ToolError(f"unknown country {country!r}")
        return CAPITALS[country]


def env_class(latency_s: float) -> type[LatencyCapitals]:
    return type("Capitals", (LatencyCapitals,), {"latency_s": latency_s})


class TimedBackend:
    """Wraps a backend and adds up the time spent in ``generate`` and the tokens it produced."""

    def __init__(self, backend: Any) -> None:
        self.backend, self.seconds, self.tokens, self.calls = backend, 0.0, 0, 0

    @property
    def max_model_len(self) -> int | None:
        return getattr(self.backend, "max_model_len", None)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[Any]:
        start = time.perf_counter()
        out = self.backend.generate(prompts, sampling)
        self.seconds += time.perf_counter() - start
        self.tokens += sum(len(g.token_ids) for g in out)
        self.calls += 1
        return out


def warm_model(workdir: Path) -> tuple[Any, Any]:
    """A tiny Qwen2 model on a locally trained tokenizer, SFT'd on oracle episodes so it calls the tool."""
    from envkit.sft import sft_on_oracle
    from envkit.testing import build_tiny_model, build_tokenizer

    tokenizer = build_tokenizer(
        workdir / "tokenizer", extra_corpus=[f"capital of {c} is {v}" for c, v in CAPITALS.items()]
    )
    model = build_tiny_model(tokenizer, seed=0)
    sft_on_oracle(
        model,
        tokenizer,
        CapitalsEnv,
        seeds=list(range(40)),
        output_dir=str(workdir / "sft"),
        max_steps=150,
        learning_rate=3e-3,
        save=False,
        log=lambda _: None,
        disable_tqdm=True,
    )
    tokenizer.padding_side = "left"
    return model, tokenizer


def run_engine(model: Any, tokenizer: Any, cls: type, seeds: list[int], group: int) -> dict[str, float]:
    timed = TimedBackend(TransformersBackend(model, tokenizer))
    engine = RolloutEngine(cls, timed, tokenizer, concurrency=64)
    start = time.perf_counter()
    episodes = engine.run(seeds, group, SamplingParams(temperature=1.0, top_k=0, max_new_tokens=MAX_NEW_TOKENS))
    wall = time.perf_counter() - start
    return {
        "seconds": wall,
        "episodes": len(episodes),
        "model_tokens": sum(sum(e.env_mask) for e in episodes),
        "turns": sum(e.turns for e in episodes),
        "generate_seconds": timed.seconds,
        "generate_calls": timed.calls,
        "mean_score": sum(e.score for e in episodes) / len(episodes),
    }


def run_naive(model: Any, tokenizer: Any, cls: type, seeds: list[int], group: int) -> dict[str, float]:
    """One episode at a time, one turn at a time: the loop people write first."""
    backend = TransformersBackend(model, tokenizer)
    sampling = SamplingParams(temperature=1.0, top_k=0, max_new_tokens=MAX_NEW_TOKENS)
    start, tokens, turns, episodes = time.perf_counter(), 0, 0, 0
    for seed in seeds:
        for _ in range(group):
            env = cls()
            renderer = envkit.ChatRenderer(tokenizer, env.tools)
            opening, _ = env.reset(seed=seed)
            ids = renderer.prompt_ids(opening)
            while not env.done:
                generation = backend.generate([ids], sampling)[0]
                ids = ids + generation.token_ids + renderer.turn_close_ids(generation.token_ids)
                tokens += len(generation.token_ids)
                turns += 1
                observation, *_ = env.step(envkit.parse_assistant(tokenizer.decode(generation.token_ids), tokenizer))
                if observation:
                    ids += renderer.suffix_ids(env.messages[: -len(observation)], observation)
            episodes += 1
    return {"seconds": time.perf_counter() - start, "episodes": episodes, "model_tokens": tokens, "turns": turns}


def make_trainer(model: Any, tokenizer: Any, cls: type, episodes: int, group: int, rollout: bool, out: Path) -> Any:
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from envkit.adapters.trl import build_dataset, env_score_reward, make_rollout_func, to_environment_factory

    tokenizer.response_template = qwen3_template  # TRL's Hermes/Qwen parser, for its own tool loop
    config = GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=episodes,
        num_generations=group,
        max_steps=1,
        max_completion_length=MAX_NEW_TOKENS * 4,
        temperature=1.0,
        top_k=0,
        learning_rate=1e-6,
        beta=0.0,
        bf16=False,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        max_tool_calling_iterations=4,
    )
    dataset = build_dataset(cls, range(episodes // group))
    if rollout:
        inner = make_rollout_func(
            cls, tokenizer=tokenizer, sampling=SamplingParams(temperature=1.0, top_k=0, max_new_tokens=MAX_NEW_TOKENS)
        )

        def timed_rollout(prompts: list[Any], trainer: Any) -> dict[str, list]:
            start = time.perf_counter()
            out = inner(prompts, trainer)
            timed_rollout.seconds = time.perf_counter() - start  # type: ignore[attr-defined]
            timed_rollout.model_tokens = sum(map(sum, out["env_mask"]))  # type: ignore[attr-defined]
            return out

        trainer = GRPOTrainer(
            model=model,
            reward_funcs=env_score_reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            rollout_func=timed_rollout,
        )
        trainer.timed_rollout = timed_rollout
        return trainer
    return GRPOTrainer(
        model=model,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        environment_factory=to_environment_factory(cls),
    )


def run_trainer(trainer: Any, episodes: int, group: int) -> dict[str, float]:
    """Time TRL's generation step (``_generate_and_score_completions``) on one batch of ``episodes`` rollouts."""
    rows = [trainer.train_dataset[i] for i in range(episodes // group)]
    inputs = [row for row in rows for _ in range(group)]
    start = time.perf_counter()
    output = trainer._generate_and_score_completions(inputs)
    wall = time.perf_counter() - start
    timed = getattr(trainer, "timed_rollout", None)
    if timed is not None:  # envkit's rollout_func: its own time and the model tokens by env_mask
        return {
            "seconds": wall,
            "episodes": episodes,
            "model_tokens": timed.model_tokens,
            "rollout_func_seconds": timed.seconds,
        }
    mask = output.get("tool_mask")
    completion_mask = output["completion_mask"]
    model_tokens = int((completion_mask * mask).sum()) if mask is not None else int(completion_mask.sum())
    return {"seconds": wall, "episodes": episodes, "model_tokens": model_tokens}


def median_run(function: Any, repeats: int) -> dict[str, float]:
    runs = [function() for _ in range(repeats)]
    best = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    return {**best, "seconds_all": [round(r["seconds"], 3) for r in runs]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=32, help="concurrent episodes (default 32)")
    parser.add_argument("--group", type=int, default=4, help="episodes per task (default 4)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement; the median is reported")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import torch

    torch.manual_seed(0)
    seeds = list(range(args.episodes // args.group))
    results: dict[str, Any] = {
        "episodes": args.episodes,
        "max_new_tokens_per_turn": MAX_NEW_TOKENS,
        "torch_threads": torch.get_num_threads(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = warm_model(Path(tmp))
        for label, latency in (("", 0.0), ("_latency50ms", 0.05)):
            cls = env_class(latency)
            engine = median_run(lambda cls=cls: run_engine(model, tokenizer, cls, seeds, args.group), args.repeats)
            naive = median_run(lambda cls=cls: run_naive(model, tokenizer, cls, seeds, args.group), 1)
            trl_loop = make_trainer(model, tokenizer, cls, args.episodes, args.group, False, Path(tmp) / "trl")
            trl = median_run(lambda t=trl_loop: run_trainer(t, args.episodes, args.group), args.repeats)
            via = make_trainer(model, tokenizer, cls, args.episodes, args.group, True, Path(tmp) / "via")
            via_trl = median_run(lambda t=via: run_trainer(t, args.episodes, args.group), args.repeats)
            results[f"envkit{label}"] = engine
            results[f"trl_loop{label}"] = trl
            results[f"envkit_via_trl{label}"] = via_trl
            results[f"naive{label}"] = naive
            results[f"envkit_eps_per_s{label}"] = engine["episodes"] / engine["seconds"]
            results[f"trl_loop_eps_per_s{label}"] = trl["episodes"] / trl["seconds"]
            results[f"naive_eps_per_s{label}"] = naive["episodes"] / naive["seconds"]
            results[f"ratio_vs_trl{label}"] = trl["seconds"] / engine["seconds"]
            results[f"ratio_via_trl_vs_trl{label}"] = trl["seconds"] / via_trl["seconds"]
            results[f"ratio_vs_naive{label}"] = naive["seconds"] / engine["seconds"]
            if not label:
                results["overhead_fraction"] = 1.0 - engine["generate_seconds"] / engine["seconds"]
    if args.json:
        print(json.dumps(results, indent=2, default=float))
        return
    for label in ("", "_latency50ms"):
        print(f"--- tools {'instant' if not label else '50 ms'} ({args.episodes} episodes)")
        for name in ("envkit", "envkit_via_trl", "trl_loop", "naive"):
            r = results[f"{name}{label}"]
            print(
                f"{name:16} {r['episodes'] / r['seconds']:8.2f} eps/s  {r['model_tokens'] / r['seconds']:9.1f} "
                f"model tok/s  ({r['seconds']:.2f} s, {r['model_tokens']} model tokens)"
            )
        print(
            f"ratio vs TRL loop: {results[f'ratio_vs_trl{label}']:.2f}x; vs naive: "
            f"{results[f'ratio_vs_naive{label}']:.2f}x"
        )
    print(f"engine overhead fraction (time outside backend.generate): {results['overhead_fraction']:.3f}")


if __name__ == "__main__":
    main()
