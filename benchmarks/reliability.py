"""Reliability on process workers: a run where envs raise, hang and get killed, and the model emits broken tool calls.

256 episodes (one task seed each) of a flaky counter env on ``ProcessWorkers(32)``: per step, a seeded RNG in the env
makes 10% of steps raise and 5% hang forever; the scripted model's turns are 20% malformed tool calls (``<tool_call>``
with broken JSON); one worker process leased by a running episode is killed with SIGKILL from outside once a third of
the episodes are done. The run must return every episode (none lost, none duplicated), end within its bound
(``ceil(episodes / concurrency) × (max_turns + 3) × step_timeout_s``: see :mod:`envkit.workers.processes`), never crash,
and report every failure in the summary.

Usage: python benchmarks/reliability.py [--episodes 256] [--concurrency 32] [--step-timeout 2] (prints a JSON summary;
exit code 1 when an episode is missing or the run overran its bound)
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import envkit

MAX_TURNS = 6


class FlakyEnv(envkit.ToolEnv):
    """Bring a total to a target with ``add``; each step raises with ``raise_rate`` and hangs forever with
    ``hang_rate``, decided by an RNG seeded with (task seed, turn): the same faults on every run."""

    max_turns = MAX_TURNS

    def __init__(self, raise_rate: float = 0.10, hang_rate: float = 0.05) -> None:
        super().__init__()
        self.raise_rate, self.hang_rate = raise_rate, hang_rate

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.task_seed = seed
        self.target = int(self.np_random.integers(5, 50))
        self.total = 0
        return [{"role": "user", "content": f"Bring the total to {self.target} with the add tool, then say done."}], {}

    def step(self, action):
        draw = random.Random(f"{self.task_seed}:{self.turns}").random()
        if draw < self.raise_rate:
            raise RuntimeError(f"flaky env: step {self.turns} of task {self.task_seed} failed")
        if draw < self.raise_rate + self.hang_rate:
            time.sleep(10**9)  # hangs forever
        return super().step(action)

    @envkit.tool
    def add(self, amount: int) -> str:
        """Add an amount to the running total.

        Args:
            amount: The whole number to add.
        """
        self.total += amount
        return f"total is now {self.total}"

    def on_text(self, message):
        return None

    def score(self) -> float:
        return float(self.total == self.target)


REPLIES = {
    "malformed": '<tool_call>{"name": "add", "arguments": {"amount": </tool_call><|im_end|>',
    "call": '<tool_call>{"name": "add", "arguments": {"amount": 7}}</tool_call><|im_end|>',
    "answer": "Done.<|im_end|>",
}


def scripted_model(tokenizer: Any, malformed_rate: float, seed: int) -> tuple[Any, collections.Counter]:
    """A backend replying, per prompt (seeded by its tokens): a malformed tool call with ``malformed_rate``, else
    ``add(7)``, or a final answer one time in six; and the count of its replies by kind."""
    from envkit.backends import ScriptedBackend

    turns: collections.Counter = collections.Counter()

    def reply(request: Any) -> str:
        draw = random.Random(hash((seed, *request.ids))).random()
        kind = "malformed" if draw < malformed_rate else "answer" if draw > 1 - 1 / 6 else "call"
        turns[kind] += 1
        return REPLIES[kind]

    return ScriptedBackend(reply, tokenizer=tokenizer), turns


def classify(episode: Any) -> str:
    if episode.finish_reason == "timeout":
        return "timeout (hung env killed)"
    error = episode.error or ""
    if error.startswith("RuntimeError: flaky env"):
        return "env raised (RuntimeError)"
    if error.startswith("EnvWorkerLost"):
        return "worker lost (EnvWorkerLost)"
    return f"other: {error[:120]}"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--step-timeout", type=float, default=2.0)
    parser.add_argument("--raise-rate", type=float, default=0.10)
    parser.add_argument("--hang-rate", type=float, default=0.05)
    parser.add_argument("--malformed-rate", type=float, default=0.20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-method", default=None, help="forkserver (default) or spawn")
    args = parser.parse_args(argv)

    from envkit.rollout import RolloutEngine, SamplingParams
    from envkit.testing import build_tokenizer
    from envkit.workers import EnvFactory
    from envkit.workers.processes import ProcessWorkers

    tokenizer = build_tokenizer()
    workers = ProcessWorkers(args.concurrency, start_method=args.start_method)
    spec = f"{Path(__file__).resolve()}:FlakyEnv"

    def engine(raise_rate: float, hang_rate: float, model: Any) -> RolloutEngine:
        factory = EnvFactory(spec, {"raise_rate": raise_rate, "hang_rate": hang_rate})
        return RolloutEngine(
            factory,
            model,
            tokenizer,
            max_turns=MAX_TURNS,
            concurrency=args.concurrency,
            step_timeout_s=args.step_timeout,
            env_workers=workers,
        )

    # Warm-up: start every worker process and load the env's module there (start-up is not what the bound covers).
    start = time.perf_counter()
    engine(0.0, 0.0, scripted_model(tokenizer, 0.0, args.seed)[0]).run(
        list(range(10**6, 10**6 + args.concurrency)), 1, SamplingParams()
    )
    warmup_s = time.perf_counter() - start

    model, model_turns = scripted_model(tokenizer, args.malformed_rate, args.seed)
    run_engine = engine(args.raise_rate, args.hang_rate, model)
    finished = []
    killed: dict[str, Any] = {}

    def kill_one() -> None:  # a worker of a running episode, once a third of the episodes are done
        while len(finished) < args.episodes // 3:
            time.sleep(0.01)
        while not workers.pool.leased:
            time.sleep(0.01)
        pid = workers.pool.leased[0].pid
        os.kill(pid, signal.SIGKILL)
        killed.update(pid=pid, after_episodes=len(finished))

    threading.Thread(target=kill_one, daemon=True).start()
    start = time.perf_counter()
    episodes = run_engine.run(list(range(args.episodes)), 1, SamplingParams(), on_episode=finished.append)
    wall_s = time.perf_counter() - start

    bound_s = math.ceil(args.episodes / args.concurrency) * (MAX_TURNS + 3) * args.step_timeout
    seeds = sorted(e.task_seed for e in episodes)
    lost_to_kill = [e.task_seed for e in episodes if killed and f"process {killed['pid']} " in (e.error or "")]
    summary = {
        "episodes": args.episodes,
        "returned": len(episodes),
        "every_episode_accounted_for": seeds == list(range(args.episodes)),
        "finish_reasons": dict(collections.Counter(e.finish_reason for e in episodes)),
        "errors_by_kind": dict(collections.Counter(classify(e) for e in episodes if e.error is not None)),
        "episodes_without_error": sum(e.error is None for e in episodes),
        "model_turns": dict(model_turns),
        "tool_errors": sum(e.tool_errors for e in episodes),
        "killed_worker": {**killed, "its_episode": lost_to_kill[0] if lost_to_kill else None},
        "workers_started": workers.pool.started,
        "workers_replaced": workers.pool.replaced,
        "wall_s": round(wall_s, 2),
        "bound_s": bound_s,
        "within_bound": wall_s < bound_s,
        "warmup_s": round(warmup_s, 2),
        "settings": {
            "concurrency": args.concurrency,
            "step_timeout_s": args.step_timeout,
            "max_turns": MAX_TURNS,
            "raise_rate": args.raise_rate,
            "hang_rate": args.hang_rate,
            "malformed_rate": args.malformed_rate,
            "start_method": workers.start_method,
        },
    }
    workers.close()
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    result = main()
    sys.exit(0 if result["every_episode_accounted_for"] and result["within_bound"] else 1)
