"""What handing a closed env's JVM on to the next env saves, where every episode gets a fresh env (as the rollout engine
and ``envkit validate`` build them): TextWorldExpress games (ScienceWorld's envs do not hand theirs on; see
``envkit.adapters.scienceworld``).

Two arms on identical work: ``new`` starts a JVM for every env (``JVM_IDLE_SECONDS = 0``); ``handed-on`` lets each
closed env's JVM wait for the next one (the default). Per arm and repeat, a fresh Python process builds a new env for
each of ``--episodes`` task seeds of every spec, plays the gold path (the oracle's commands) and closes it. It times the
env's side of an episode (construction, reset, steps, close; the oracle's calls are timed apart), and records every
episode's commands, score and messages: every run must play the same commands to the same scores, and the figures say
whether the messages were the same too. Arms alternate (new, handed-on, handed-on, new, …) over ``--repeats`` pairs;
the figures are the median over repeats of each repeat's total, with the range.

    .venv/bin/python benchmarks/jvm_reuse.py                      # a few games and tasks, 3 repeats
    .venv/bin/python benchmarks/jvm_reuse.py --repeats 5 --out jvm_reuse.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
import time
from typing import Any

SPECS = [
    "textworld-express:cookingworld",
    "textworld-express:arithmetic",
    "textworld-express:mapreader",
]
ARMS = ("new", "handed-on")


def play(specs: list[str], episodes: int, arm: str) -> dict[str, Any]:
    """One arm in this process: a fresh env per episode of every spec; per spec, the seconds of the env's side and of
    the oracle, and a digest of every episode's messages and score."""
    import envkit
    from envkit.adapters.textworld_express import java

    if arm == "new":
        java.JVM_IDLE_SECONDS = 0
    result: dict[str, Any] = {}
    for spec in specs:
        env_s = oracle_s = 0.0
        played, seen = hashlib.sha256(), hashlib.sha256()
        for seed in range(episodes):
            start = time.perf_counter()
            env = envkit.make(spec)
            env.reset(seed=seed)
            env_s += time.perf_counter() - start
            while not env.done:
                start = time.perf_counter()
                action = env.oracle()
                oracle_s += time.perf_counter() - start
                if action is None:
                    break
                start = time.perf_counter()
                env.step(action)
                env_s += time.perf_counter() - start
            commands = [m["content"] for m in env.messages if m["role"] == "assistant"]
            played.update(json.dumps([commands, env.score()]).encode())
            seen.update(json.dumps(env.messages).encode())
            start = time.perf_counter()
            env.close()
            env_s += time.perf_counter() - start
        result[spec] = {
            "env_s": env_s,
            "oracle_s": oracle_s,
            "played_sha256": played.hexdigest(),
            "messages_sha256": seen.hexdigest(),
        }
    java.end_idle_jvms()
    return result


def spread(values: list[float]) -> str:
    """``median (min–max)`` of ``values``."""
    return f"{statistics.median(values):.1f} s ({min(values):.1f}–{max(values):.1f})"


def main() -> int:
    """Run the arms, alternated, each repeat in a fresh process; print (or save) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", default=",".join(SPECS), help="comma-separated env specs (Java games)")
    parser.add_argument("--episodes", type=int, default=8, help="episodes (task seeds 0..N-1) per spec (default 8)")
    parser.add_argument("--repeats", type=int, default=3, help="repeats of each arm, alternated (default 3)")
    parser.add_argument("--out", default=None, help="also write the figures (JSON) here")
    parser.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # one arm in this process (the child's side)
    args = parser.parse_args()
    specs = [s for s in args.specs.split(",") if s]
    if args.arm:
        print(json.dumps(play(specs, args.episodes, args.arm)))
        return 0
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    for repeat in range(args.repeats):
        for arm in ARMS if repeat % 2 == 0 else ARMS[::-1]:
            child = [
                sys.executable,
                __file__,
                "--arm",
                arm,
                "--specs",
                ",".join(specs),
                "--episodes",
                str(args.episodes),
            ]
            done = subprocess.run(child, capture_output=True, text=True, check=True)
            runs[arm].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(
                f"repeat {repeat + 1} {arm}: " + ", ".join(f"{s} {r['env_s']:.1f} s" for s, r in runs[arm][-1].items())
            )

    def agree(spec: str, field: str) -> bool:
        return len({run[spec][field] for arm in ARMS for run in runs[arm]}) == 1

    same = all(agree(spec, "played_sha256") for spec in specs)
    summary: dict[str, Any] = {"episodes_per_spec": args.episodes, "repeats": args.repeats, "same_episodes": same}
    for spec in specs:
        summary[spec] = {
            arm: {
                "env_s": [run[spec]["env_s"] for run in runs[arm]],
                "oracle_s": [run[spec]["oracle_s"] for run in runs[arm]],
            }
            for arm in ARMS
        }
        summary[spec]["same_commands_and_scores"] = agree(spec, "played_sha256")
        summary[spec]["same_messages"] = agree(spec, "messages_sha256")
        new, handed = (summary[spec][arm]["env_s"] for arm in ARMS)
        print(
            f"{spec}: env side of {args.episodes} episodes, new JVM {spread(new)}, handed on {spread(handed)} "
            f"({statistics.median(new) / statistics.median(handed):.1f}x); oracle "
            f"{spread(summary[spec]['new']['oracle_s'])} vs {spread(summary[spec]['handed-on']['oracle_s'])}; the same "
            f"commands and scores in every run: {summary[spec]['same_commands_and_scores']}, the same messages: "
            f"{summary[spec]['same_messages']}"
        )
    if args.out:
        with open(args.out, "w") as out:
            json.dump(summary, out, indent=2)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
