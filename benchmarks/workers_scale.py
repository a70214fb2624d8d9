"""Many concurrent long episodes on multiplexed process env workers, with a scripted model (no generation cost): what
the env workers and the engine's per-step work cost at scale, and whether anything is lost.

Every episode of a counter env (tests/worker_envs.py ``LongCounter``) runs ``--turns`` turns, each a tool call
(``add(1)``) rendered with the Qwen2.5 tokenizer from ``../shared/tokenizers`` (or a locally trained one), all
``--episodes`` at once on ``ProcessWorkers(episodes)`` (``default_workers``: ``min(episodes, 2 x cores)`` processes, at
least 4). Reports wall time, the driver's CPU (this process: event loop, parsing, rendering) per step, worker
processes, peak envs alive at once, the bytes of a step's reply at the first and the last turn, and errors; and how
much of the driver's CPU per step is parsing the model's turn and rendering the env's reply (the part that could move
to the workers). With ``--env-workers threads`` the envs live in this process (the engine's default) and the same
figures measure the engine's own per-step work: the hop to an env thread and back, the step's deadline, the batcher.
``driver_cpu_ms_per_step_at_turn`` says how that per-step CPU changes as the history grows (turn 10 against turn 200).

Usage::

    .venv/bin/python benchmarks/workers_scale.py --episodes 1024 --turns 50
    .venv/bin/python benchmarks/workers_scale.py --episodes 512 --turns 5 --env-workers threads
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class TurnClock:
    """Wraps the scripted backend: the process CPU time at each ``generate`` call and its number of requests.

    With every episode in lockstep (an instant model, all episodes in each batch) call ``t`` is turn ``t``, and the
    CPU between call ``t`` and call ``t + 1`` over its requests is the driver's CPU per step at turn ``t``: what the
    engine spent on that turn's steps (parse, step, render, scheduling), as the history grows.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[float, int]] = []

    def generate(
        self,
        prompts: list[list[int]],
        sampling: Any,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> Any:
        """The inner backend's generations, the call's CPU time and size recorded first."""
        self.calls.append((time.process_time(), len(prompts)))
        return self.inner.generate(prompts, sampling, seeds=seeds, max_new_tokens=max_new_tokens)

    def per_turn(self, turns: int, cpu_end: float) -> dict[str, float] | str:
        """Driver CPU ms per step at turns 1, 10, 50, 100, 200 and the last (each the median of the turns within two
        of it), or why it cannot be told (batches that did not follow the turns)."""
        if len(self.calls) != turns:
            return f"{len(self.calls)} backend calls for {turns} turns: calls are not turns"
        ends = [cpu for cpu, _ in self.calls[1:]] + [cpu_end]
        per_step = [1000 * (end - start) / n for (start, n), end in zip(self.calls, ends, strict=True)]
        marks = sorted({t for t in (1, 10, 50, 100, 200) if t <= turns} | {turns})
        return {str(t): round(statistics.median(per_step[max(0, t - 3) : min(turns, t + 2)]), 4) for t in marks}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1024)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--processes", type=int, default=None, help="worker processes (default: default_workers)")
    parser.add_argument(
        "--env-workers",
        default="processes",
        choices=["processes", "threads"],
        help="processes (multiplexed ProcessWorkers, the default) or threads (the envs in this process, the engine's "
        "default: then the driver's CPU includes the env steps)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT / "tests"))  # worker_envs (the counter env, importable by worker processes)

    from envkit.backends import ScriptedBackend
    from envkit.rollout import RolloutEngine, SamplingParams
    from envkit.testing import build_tokenizer, load_shared_tokenizer
    from envkit.workers import EnvFactory
    from envkit.workers.processes import ProcessWorkers

    tokenizer = load_shared_tokenizer("qwen2.5-instruct") or build_tokenizer()
    workers: Any = (
        ProcessWorkers(args.episodes, processes=args.processes) if args.env_workers == "processes" else "threads"
    )
    add_one = TurnClock(
        ScriptedBackend(  # every turn calls add(1): each episode runs all its turns
            '<tool_call>{"name": "add", "arguments": {"amount": 1}}</tool_call><|im_end|>', tokenizer=tokenizer
        )
    )
    sizes: dict[int, list[int]] = {}
    factory = EnvFactory("worker_envs:LongCounter")
    engine = RolloutEngine(
        factory,
        add_one,
        tokenizer,
        max_turns=args.turns,
        concurrency=args.episodes,
        step_timeout_s=120,
        env_workers=workers,
    )
    try:
        engine.run([0, 1], 1, SamplingParams())  # start the worker processes: start-up is not what is measured
        if args.env_workers == "threads":  # and the process's env threads, one per concurrent call (kept for reuse)
            warm = RolloutEngine(factory, add_one, tokenizer, max_turns=1, concurrency=args.episodes)
            warm.run(list(range(args.episodes)), 1, SamplingParams())
            warm.close()
        if args.env_workers == "processes":
            opening = workers.open

            async def open_recording(factory, *, timeout_s):  # each step's reply size, by turn
                session = await opening(factory, timeout_s=timeout_s)
                step = session.step

                async def recorded(action, *, timeout_s):
                    outcome = await step(action, timeout_s=timeout_s)
                    sizes.setdefault(len(outcome.history) // 2, []).append(session.bytes_received)
                    return outcome

                session.step = recorded
                return session

            workers.open = open_recording
        sys.path.insert(0, str(Path(__file__).parent))
        from sweep import step_timer  # thread CPU of each parse and each render (threads: each whole step)

        samples, undo = step_timer()
        add_one.calls.clear()
        load_before = os.getloadavg()
        start, cpu = time.perf_counter(), time.process_time()
        try:
            episodes = engine.run(list(range(args.episodes)), 1, SamplingParams())
        finally:
            undo()
        wall, cpu_end = time.perf_counter() - start, time.process_time()
        cpu = cpu_end - cpu
        steps = sum(len(e.rewards) for e in episodes)
        result = {
            "env_workers": args.env_workers,
            "episodes": len(episodes),
            "turns": args.turns,
            "errors": sum(e.error is not None for e in episodes),
            "steps": steps,
            "wall_s": round(wall, 2),
            "wall_ms_per_step": round(1000 * wall / max(steps, 1), 3),
            "driver_cpu_s": round(cpu, 2),
            "driver_cpu_ms_per_step": round(1000 * cpu / max(steps, 1), 3),
            # processes: parsing + rendering; threads: each whole step (parse, the env's step, render) on its thread
            "step_work_cpu_ms_per_step": round(sum(samples) / max(steps, 1), 3),
            "driver_cpu_ms_per_step_at_turn": add_one.per_turn(args.turns, cpu_end),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        }
        if args.env_workers == "processes":
            first, last = min(sizes), max(sizes)
            result |= {
                "worker_processes": len(workers.pids),
                "processes_started": workers.pool.started,
                "peak_envs_alive": workers.pool.peak_sessions,
                "step_reply_bytes_first_turn": max(sizes[first]),
                "step_reply_bytes_last_turn": max(sizes[last]),
            }
    finally:
        engine.close()
    print(json.dumps(result, indent=None if args.json else 1))
    return result


if __name__ == "__main__":
    main()
