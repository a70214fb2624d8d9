"""Held-out evaluation: episodes at temperature 1 per condition, mean score, format validity, and pass@k by the
unbiased estimator."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import envkit

from .experiments import Experiment
from .files import write_whole


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimator of one task: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k) if k <= n else float("nan")


def format_valid(episode: Any) -> bool:
    """Whether the episode kept the format, right or wrong: every assistant turn is a parsed tool call and one of
    them submits an answer."""
    turns = [m for m in episode.messages if m["role"] == "assistant"]
    calls = [c["function"]["name"] for m in turns for c in m.get("tool_calls") or []]
    return bool(turns) and all(m.get("tool_calls") for m in turns) and "submit_answer" in calls


class ToolFailure(NamedTuple):
    """One failed tool call of an episode, with the turns around it."""

    call: dict[str, Any] | None
    """The assistant turn that made the call (``None`` if none precedes the answer)."""
    answer: dict[str, Any]
    """The tool's answer: the error."""
    next_turn: dict[str, Any] | None
    """The assistant turn after it (``None`` where the episode ended there, at the turn cap)."""


def tool_failures(episode: Any, marker: str) -> list[ToolFailure]:
    """The tool answers of ``episode`` that contain ``marker`` (experiment A's failed calculator calls), in order."""
    messages = episode.messages
    return [
        ToolFailure(
            next((m for m in reversed(messages[:i]) if m["role"] == "assistant"), None),
            message,
            next((m for m in messages[i + 1 :] if m["role"] == "assistant"), None),
        )
        for i, message in enumerate(messages)
        if message["role"] == "tool" and marker in str(message.get("content") or "")
    ]


def after_tool_failure(episodes: list[Any], marker: str) -> dict[str, Any]:
    """How episodes went on after a tool answered with an error containing ``marker`` (experiment A's failed
    calculator call): the failures the model had a turn after, the fraction of them whose next turn called the same
    tool again as a parsed tool call (a retry), and the mean score of the episodes that met a failure and of those
    that did not (``None`` where there are none)."""
    failures = retried = 0
    met, clean = [], []
    for episode in episodes:
        found = tool_failures(episode, marker)
        for failure in found:
            if failure.next_turn is None:  # no turn to retry in
                continue
            failures += 1
            calls = failure.next_turn.get("tool_calls") or []
            retried += bool(calls) and calls[0]["function"]["name"] == failure.answer.get("name")
        (met if found else clean).append(episode.score)
    return {
        "failures": failures,
        "retried": retried / failures if failures else None,
        "episodes_with_failure": len(met),
        "score_with_failure": sum(met) / len(met) if met else None,
        "score_without_failure": sum(clean) / len(clean) if clean else None,
    }


def sample_episodes(
    model: Any,
    tokenizer: Any,
    factory: Callable[[], envkit.Env],
    seeds: list[int],
    samples: int,
    args: argparse.Namespace,
    sampling_seed: int,
) -> list[Any]:
    """Episodes of ``seeds`` × ``samples`` at temperature 1, with the run's turn, token and concurrency limits."""
    from envkit.backends import SamplingParams, TransformersBackend
    from envkit.rollout import RolloutEngine

    model.eval()
    engine = RolloutEngine(
        factory,
        TransformersBackend(model, tokenizer),
        tokenizer,
        max_turns=args.max_turns,
        max_completion_tokens=args.max_completion_tokens,
        concurrency=args.eval_concurrency,
    )
    sampling = SamplingParams(temperature=1.0, top_k=None, max_new_tokens=args.max_new_tokens, seed=sampling_seed)
    try:
        return engine.run(seeds, samples, sampling)
    finally:
        engine.close()


def evaluate(
    model: Any,
    tokenizer: Any,
    factory: Callable[[], envkit.Env],
    seeds: list[int],
    samples: int,
    args: argparse.Namespace,
    sampling_seed: int,
    failure_marker: str | None = None,
) -> dict[str, Any]:
    """:func:`sample_episodes`' mean score, format validity (ended by a submission), the per-task success counts (for
    pass@k) and, with ``failure_marker``, :func:`after_tool_failure`'s figures."""
    episodes = sample_episodes(model, tokenizer, factory, seeds, samples, args, sampling_seed)
    successes: dict[int, int] = {}
    for e in episodes:
        successes[e.task_seed] = successes.get(e.task_seed, 0) + int(e.score >= 1.0)
    result: dict[str, Any] = {
        "mean_score": sum(e.score for e in episodes) / len(episodes),
        "format_valid": sum(map(format_valid, episodes)) / len(episodes),
        "tool_errors": sum(e.tool_errors for e in episodes) / len(episodes),
        "episodes": len(episodes),
        "successes": [successes[s] for s in dict.fromkeys(seeds)],
        "samples": samples,
    }
    if failure_marker is not None:
        result["after_failure"] = after_tool_failure(episodes, failure_marker)
    return result


def evaluate_model(
    model: Any,
    tokenizer: Any,
    exp: Experiment,
    held_out: dict[str, list[int]],
    args: argparse.Namespace,
    seed: int,
    parts: Path | None = None,
    weights: str = "",
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Every held-out condition (``--eval-samples`` per task) and the pass@k condition (``--pass-k-samples``).

    With ``parts`` (a folder), each condition's result is saved there as it finishes, with what it measured: the
    weights (``weights``, a fingerprint of the model: :func:`weights_fingerprint`), the task seeds, the samples per
    task and the sampling seed. A call cut midway goes on with the conditions it had not finished and reads the
    others back where all four are the same. Each condition samples with its own seed, so at ``--eval-concurrency 1``
    the result is the one a call never cut returns; at more, the batches vary with timing, and so do the samples, cut
    or not."""
    plan = [
        (i, label, held_out[label], args.eval_samples, seed * 100 + i)
        for i, label in enumerate(label for label in held_out if label != "pass@k")
    ]
    plan.append((99, "pass@k", held_out["pass@k"], args.pass_k_samples, seed * 100 + 99))
    saved = _saved_parts(parts)
    keys = {index: _key(label, weights, seeds, samples, sampling) for index, label, seeds, samples, sampling in plan}
    done = {index: saved[index]["result"] for index in keys if saved.get(index, {}).get("key") == keys[index]}
    if done:
        log(f"going on after {len(done)} of {len(plan)} held-out conditions (saved in {parts})")
    result: dict[str, Any] = {"conditions": {}}
    for index, label, seeds, samples, sampling in plan:
        if index in done:
            measured = done[index]
        else:
            condition = exp.pass_at_k if label == "pass@k" else label
            marker = None if label == "pass@k" else exp.failure_marker
            factory = exp.factory(exp.conditions[condition])
            measured = evaluate(model, tokenizer, factory, seeds, samples, args, sampling, failure_marker=marker)
            if label == "pass@k":
                measured["pass@k"] = [
                    sum(pass_at_k(samples, c, k) for c in measured["successes"]) / len(measured["successes"])
                    for k in range(1, samples + 1)
                ]
            if parts is not None:
                parts.mkdir(parents=True, exist_ok=True)
                record = json.dumps({"key": keys[index], "result": measured}, indent=1, default=str)
                write_whole(parts / f"{index:02d}.json", record)
        if label == "pass@k":
            result["pass@k"] = measured
        else:
            result["conditions"][label] = measured
    return result


def weights_fingerprint(folder: Path) -> str:
    """A SHA-256 of the weights saved in ``folder`` (its ``*.safetensors`` files): what ties a condition's saved
    result to the model it measured. A folder without them is an error (its fingerprint would match any other)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {folder}")
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _key(label: str, weights: str, seeds: list[int], samples: int, sampling_seed: int) -> dict[str, Any]:
    """What a condition's saved result was measured on: it is read back only where all of it is the same."""
    return {
        "label": label,
        "weights": weights,
        "seeds": list(seeds),
        "samples": samples,
        "sampling_seed": sampling_seed,
    }


def _saved_parts(parts: Path | None) -> dict[int, dict[str, Any]]:
    """The conditions' records saved in ``parts``, by index; a file a cut left unreadable is left out (measured
    again)."""
    found: dict[int, dict[str, Any]] = {}
    for path in sorted(parts.glob("*.json")) if parts is not None and parts.is_dir() else []:
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(saved, dict) and path.stem.isdigit():
            found[int(path.stem)] = saved
    return found
