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
The driver's CPU excludes the scripted model's own (``scripted_model_cpu_s``, reported apart).
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
    """Wraps the scripted backend: the process CPU time at each ``generate`` call, its number of requests and the CPU
    the backend itself spent in it (the scripted model copies every prompt: not the driver's work).

    Every episode runs the same turns with an instant model, so the episodes move (nearly) in lockstep: the ``r``-th
    request of the run, counted over all calls, is turn ``r // episodes + 1``. The process CPU between one call and
    the next, less the backend's own, over the first call's requests, is the driver's CPU per step for those requests'
    turn: what the engine spent on those steps (parse, step, render, scheduling), as the history grows. A batch split
    across turns counts at the turn of its middle request.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[tuple[float, int]] = []
        self.backend_cpu: list[float] = []

    def generate(
        self,
        prompts: list[list[int]],
        sampling: Any,
        *,
        seeds: list[int] | None = None,
        max_new_tokens: list[int] | None = None,
    ) -> Any:
        """The inner backend's generations; the call's CPU time and size recorded first, its own CPU after."""
        self.calls.append((time.process_time(), len(prompts)))
        start = time.thread_time()
        try:
            return self.inner.generate(prompts, sampling, seeds=seeds, max_new_tokens=max_new_tokens)
        finally:
            self.backend_cpu.append(time.thread_time() - start)

    def per_turn(self, episodes: int, turns: int, cpu_end: float) -> dict[str, float]:
        """Driver CPU ms per step at turns 1, 10, 50, 100, 200 and the last: the median over the calls whose turn is
        within two of it, each call's CPU divided by its requests (the last turn's own calls left out: after them
        the engine also scores and closes every env)."""
        ends = [cpu for cpu, _ in self.calls[1:]] + [cpu_end]
        by_turn: dict[int, list[float]] = {}
        first = 0  # the run's index of the call's first request
        for (start, n), own, end in zip(self.calls, self.backend_cpu, ends, strict=True):
            turn = (first + n // 2) // episodes + 1
            if turn < turns:  # the last turn's steps end the episodes: their CPU has each env's score and close too
                by_turn.setdefault(turn, []).append(1000 * (end - start - own) / n)
            first += n
        marks = sorted({t for t in (1, 10, 50, 100, 200) if t <= turns} | {turns})
        near = {t: [x for u in range(t - 2, t + 3) for x in by_turn.get(u, [])] for t in marks}
        return {str(t): round(statistics.median(near[t]), 4) for t in marks if near[t]}  # a 1-turn run has none


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
        add_one.backend_cpu.clear()
        load_before = os.getloadavg()
        start, cpu = time.perf_counter(), time.process_time()
        try:
            episodes = engine.run(list(range(args.episodes)), 1, SamplingParams())
        finally:
            undo()
        wall, cpu_end = time.perf_counter() - start, time.process_time()
        model_cpu = sum(add_one.backend_cpu)  # the scripted model's own work: not the driver's
        cpu = cpu_end - cpu - model_cpu
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
            "scripted_model_cpu_s": round(model_cpu, 2),
            # processes: parsing + rendering; threads: each whole step (parse, the env's step, render) on its thread
            "step_work_cpu_ms_per_step": round(sum(samples) / max(steps, 1), 3),
            "driver_cpu_ms_per_step_at_turn": add_one.per_turn(args.episodes, args.turns, cpu_end),
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
