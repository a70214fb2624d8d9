"""Where the time goes: one bare engine run profiled on the event-loop thread and every worker thread."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .arms import EngineArm, envkit_backend, quiet
from .model import load
from .workloads import Workload

_PROFILE_KEYS = {
    "envkit sampler (_RowSampler.__call__)": ("backends/transformers.py", "__call__", 0),
    "transformers generate (whole)": ("generation/utils.py", "generate", 0),
    "env step on a worker (parse + step + render)": ("rollout/steps.py", "step_in_process", 0),
    "  parse_assistant": ("chat/parsing.py", "parse_assistant", 0),
    "  env.step": ("core/tools.py", "step", 0),
    "  ChatRenderer.suffix_ids": ("chat/render.py", "suffix_ids", 0),
    "env reset (reset_outcome)": ("workers/base.py", "reset_outcome", 0),
    "ChatRenderer.prompt_ids": ("chat/render.py", "prompt_ids", 0),
    "Thread.start (a pool thread started)": ("threading.py", "start", 0),
    "tool sleeps (time.sleep)": ("~", "<built-in method time.sleep>", 1),
    "event loop waiting (epoll)": ("~", "<method 'poll' of 'select.epoll' objects>", 1),
}


def profile_engine(workload: Workload, episodes: int, checkpoint: Path) -> dict[str, Any]:
    """Profile one bare ``RolloutEngine.run`` (after a warm-up) on the event-loop thread and every worker thread.

    Times are summed over threads (they overlap, so they do not add up to the wall time): cumulative seconds of the
    functions that matter, and the top functions by own time.
    """
    import cProfile
    import pstats
    import threading

    from envkit.backends import TransformersBackend

    model, tokenizer = load(checkpoint)
    backend = envkit_backend(TransformersBackend(model, tokenizer), episodes)
    with quiet():
        warm = EngineArm(backend, tokenizer, workload, episodes, workload.env())
        warm.run(1)  # the model's first calls, off the record
        warm.engine.close()
        # Env calls run on a process-wide pool whose threads outlive an engine; the profile hook below only reaches
        # threads started after it, so let the warm-up's threads retire (they exit after idle_s without work).
        from envkit.workers.threads import SHARED_POOL

        time.sleep(SHARED_POOL.idle_s + 0.5)
        arm = EngineArm(backend, tokenizer, workload, episodes, workload.env())  # its worker threads start profiled
        profiles: list[cProfile.Profile] = []

        def start_thread_profile(*_: Any) -> None:
            profile = cProfile.Profile()
            profiles.append(profile)
            profile.enable()  # replaces this hook for the rest of the thread's life

        main = cProfile.Profile()
        threading.setprofile(start_thread_profile)
        main.enable()
        try:
            run = arm.run(2)
        finally:
            main.disable()
            threading.setprofile(None)  # type: ignore[arg-type]
    arm.engine.close()
    stats = pstats.Stats(main)
    for profile in profiles:
        stats.add(profile)
    table = stats.stats  # type: ignore[attr-defined]
    picked: dict[str, float] = {}
    for label, (path, function, own) in _PROFILE_KEYS.items():
        picked[label] = sum(
            values[2] if own else values[3]
            for (filename, _, name), values in table.items()
            if name == function and (filename.endswith(path) or path == "~")
        )
    idle = ("<method 'get' of '_queue.SimpleQueue' objects>", "<method 'poll' of 'select.epoll' objects>")
    busy = [item for item in table.items() if item[0][2] not in idle and "acquire" not in item[0][2]]
    top = sorted(busy, key=lambda item: item[1][2], reverse=True)[:20]
    return {
        "wall_seconds": run["seconds"],
        "backend_generate_seconds": run["generate_seconds"],
        "generate_calls": run["generate_calls"],
        "threads_profiled": len(profiles) + 1,
        "seconds": picked,
        "top_own_time_excluding_waits": [
            {"function": f"{Path(f).name}:{line}({name})", "own_seconds": v[2], "calls": v[1]}
            for (f, line, name), v in top
        ],
    }
