"""Rendering cost per step: ``ChatRenderer.suffix_ids`` at turn 10, 50 and 200, full render vs incremental.

Qwen2.5 tokenizer (../shared/tokenizers/qwen2.5-instruct), the hotel-booking env's tools and opening; every turn is
an assistant tool call and its tool result. "full" renders the whole history twice per step (envkit before issue 24),
"incremental" a bounded local context.

Usage: python benchmarks/render_cost.py [--repeats 50] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import envkit
from envkit.chat.render import ChatRenderer
from envkit.testing import load_shared_tokenizer

TURNS = (10, 50, 200)


def conversation(env, turns: int) -> tuple[list[dict], list[dict]]:
    """Hotel-booking history of ``turns`` tool-calling turns ending with the assistant's call, and its tool result."""
    history, _ = env.reset(seed=0)
    history = list(history)
    for turn in range(turns):
        tool = env.tools[turn % len(env.tools)]["function"]["name"]
        call = {"type": "function", "function": {"name": tool, "arguments": {"city": "Lisbon", "guest_id": "G-1"}}}
        history.append({"role": "assistant", "content": "", "tool_calls": [call]})
        result = {"role": "tool", "name": tool, "content": json.dumps({"turn": turn, "hotels": ["Harbour", "Plaza"]})}
        if turn < turns - 1:
            history.append(result)
    return history, [result]


def ms_per_step(renderer: ChatRenderer, history: list[dict], new: list[dict], repeats: int) -> float:
    """Median milliseconds of one ``suffix_ids`` call."""
    renderer.suffix_ids(history, new)  # warm the template compilation
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        renderer.suffix_ids(history, new)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    tokenizer = load_shared_tokenizer("qwen2.5-instruct")
    if tokenizer is None:
        sys.exit("../shared/tokenizers/qwen2.5-instruct is not present: this benchmark needs the real tokenizer")
    env = envkit.make("hotel-booking")
    incremental = ChatRenderer(tokenizer, env.tools)
    full = ChatRenderer(tokenizer, env.tools)
    full.suffix_mode = "full"  # the pre-issue-24 behaviour: the whole history, twice per step
    results = []
    for turns in TURNS:
        history, new = conversation(env, turns)
        same = incremental.suffix_ids(history, new) == full.suffix_ids(history, new)
        results.append(
            {
                "turn": turns,
                "full_ms": ms_per_step(full, history, new, args.repeats),
                "incremental_ms": ms_per_step(incremental, history, new, args.repeats),
                "token_exact": same,
            }
        )
    if args.json:
        print(json.dumps({"suffix_mode": incremental.suffix_mode, "results": results}, indent=2))
        return
    print(f"suffix_ids per step, Qwen2.5 + hotel-booking tools (mode: {incremental.suffix_mode}; median ms)")
    print(f"{'turn':>5} {'full':>8} {'incremental':>12} {'same tokens':>12}")
    for r in results:
        print(f"{r['turn']:>5} {r['full_ms']:>8.2f} {r['incremental_ms']:>12.2f} {r['token_exact']!s:>12}")
    ratio = results[-1]["incremental_ms"] / results[0]["incremental_ms"]
    print(f"incremental turn {TURNS[-1]} / turn {TURNS[0]}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
