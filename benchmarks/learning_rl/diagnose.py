"""What a model of either experiment gets wrong, call by call: ``python -m benchmarks.learning_rl.diagnose MODEL``.

- **A** (:func:`retries`): what the turn after a failed calculator call did: call it again with the expression the
  error printed, with another one, submit, or no tool call at all.
- **B** (:func:`chain_calls`): at each step of a chain, whether the calculator call started from the previous result,
  took the step's operator and copied its operand; and whether the submission copied the last result.

It samples the validation tasks (those the warm start's probe and gate use; never trained on) at temperature 1 with
the runs' limits, and prints the counts as JSON, with ``--show`` a few episodes that went wrong.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import envkit

from .envs import OPERATIONS
from .evaluation import sample_episodes, tool_failures
from .experiments import EXPERIMENTS, VALIDATION_START

DEFAULT_CONDITION = {"A": "p=0.3", "B": "k=3"}


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [c["function"] for c in message.get("tool_calls") or []]


def retries(episodes: list[Any], marker: str) -> dict[str, int]:
    """Experiment A: for every failed call (a tool message containing ``marker``) that the model had a turn after,
    what that turn did — ``same expression`` (the call the error printed, again), ``other expression``,
    ``submitted``, ``no tool call``."""
    counts: Counter[str] = Counter()
    for failure in (f for episode in episodes for f in tool_failures(episode, marker)):
        if failure.next_turn is None:
            continue
        calls, before = _calls(failure.next_turn), _calls(failure.call or {})
        if not calls:
            counts["no tool call"] += 1
        elif calls[0]["name"] == "submit_answer":
            counts["submitted"] += 1
        elif before and calls[0]["arguments"] == before[0]["arguments"]:
            counts["same expression"] += 1
        else:
            counts["other expression"] += 1
    return dict(counts)


def _result(answer: str) -> str | None:
    """The result a calculator answer gives: ``Step 1 done: 33`` (numbered, perhaps followed by the next step) or a
    bare number."""
    numbered = re.search(r"done: (-?\d+)", answer)
    numbers = re.findall(r"-?\d+", answer)
    return numbered.group(1) if numbered else numbers[-1] if numbers else None


def chain_calls(episodes: list[Any], factory: Callable[[], envkit.Env]) -> dict[str, dict[str, int]]:
    """Experiment B: per step ``step N``, how many calculator calls had the right previous value (``previous``: the
    start, then the last result), the step's ``operator`` and its ``operand``, each as ``[right, wrong]``; and
    ``submission``: ``[copied the last result, anything else]``. A call that is not ``a OP b`` counts as wrong in
    all three; calls past the chain's depth are not counted."""
    counts: dict[str, dict[str, list[int]]] = {}

    def tally(step: str, part: str, right: bool) -> None:
        counts.setdefault(step, {}).setdefault(part, [0, 0])[0 if right else 1] += 1

    for episode in episodes:
        env = factory()
        env.reset(seed=episode.task_seed)
        previous = str(env.start)
        calls = 0
        for message in episode.messages:
            if message["role"] == "tool" and message.get("name") == "calculator":
                previous = _result(str(message.get("content"))) or previous
            for call in _calls(message) if message["role"] == "assistant" else []:
                if call["name"] == "submit_answer":
                    tally("submission", "copied", str(call["arguments"].get("answer")) == previous)
                    continue
                if calls >= len(env.steps):
                    continue
                name, operand = env.steps[calls]
                calls += 1
                found = re.fullmatch(r"\s*(-?\d+)\s*([-+*])\s*(-?\d+)\s*", str(call["arguments"].get("expression")))
                left, operator, right = found.groups() if found else (None, None, None)
                tally(f"step {calls}", "previous", left == previous)
                tally(f"step {calls}", "operator", operator == OPERATIONS[name][1])
                tally(f"step {calls}", "operand", right == str(operand))
    return counts


def parser() -> argparse.ArgumentParser:
    """The command line."""
    from .cli import parser as run_parser

    defaults = run_parser().parse_args([])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("model", type=Path, help="a saved model folder (a warm start, an arm, an attempt)")
    p.add_argument("--experiment", choices=list(EXPERIMENTS), required=True)
    p.add_argument("--condition", help="a held-out condition's label (default: A p=0.3, B k=3)")
    p.add_argument("--tasks", type=int, default=32, help="validation tasks")
    p.add_argument("--samples", type=int, default=2, help="episodes per task")
    p.add_argument("--seed", type=int, default=8, help="sampling seed")
    p.add_argument("--show", type=int, default=0, help="print this many episodes that scored 0")
    # sample_episodes reads the runs' limits from the arguments: the run command's defaults.
    limits = ("max_turns", "max_completion_tokens", "max_new_tokens", "eval_concurrency")
    p.set_defaults(**{k: getattr(defaults, k) for k in limits})
    return p


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Sample, count and print (see the module's docstring); returns what it printed."""
    from .training import load

    args = parser().parse_args(argv)
    exp = EXPERIMENTS[args.experiment]
    label = args.condition or DEFAULT_CONDITION[exp.name]
    if label not in exp.conditions:
        sys.exit(f"--condition {label!r}: experiment {exp.name} has {', '.join(exp.conditions)}")
    if not (args.model / "config.json").exists():
        sys.exit(f"{args.model}: no saved model there (config.json missing)")
    model, tokenizer = load(args.model)
    factory = exp.factory(exp.conditions[label])
    seeds = list(range(VALIDATION_START, VALIDATION_START + args.tasks))
    episodes = sample_episodes(model, tokenizer, factory, seeds, args.samples, args, args.seed)
    result: dict[str, Any] = {
        "model": str(args.model),
        "condition": label,
        "episodes": len(episodes),
        "mean_score": sum(e.score for e in episodes) / len(episodes),
    }
    if exp.failure_marker is not None:
        result["after a failed call"] = retries(episodes, exp.failure_marker)
    else:
        result["chain calls, [right, wrong]"] = chain_calls(episodes, factory)
    print(json.dumps(result, indent=1))
    for episode in [e for e in episodes if e.score < 1.0][: args.show]:
        print("---")
        for message in episode.messages[1:]:
            calls = [c["arguments"] for c in _calls(message)]
            print(f"{message['role']}: {message.get('content') or ''}{json.dumps(calls) if calls else ''}")
    return result


if __name__ == "__main__":
    main()
