"""Tutorial 3: a τ²-bench evaluation with a scripted model — the airline domain, its scripted customer, tau2's reward.

Run it: ``python docs/tutorials/tau2_eval.py`` (needs the tau2 extra: ``pip install -e '.[tau2]'``; seconds).

The "model" is :class:`~envkit.backends.oracle.OracleBackend`: it plays each task's gold actions, token for token
through the chat template, exactly where a real model's tokens would go. So the whole evaluation pipeline runs — the
opening prompt with τ²-bench's policy, tool calls parsed from generated text, the customer's replies, the final database
compared with the gold one — and every task should score 1.0: a task that does not is a bug in the env, not in a
model. Swap the backend for ``TransformersBackend(model, tokenizer)`` (or ``envkit eval tau2-airline --model DIR``) to
evaluate a real model the same way.
"""

from __future__ import annotations

import envkit
from envkit.backends import SamplingParams
from envkit.backends.oracle import OracleBackend
from envkit.rollout import RolloutEngine, summarize
from envkit.testing import build_tokenizer


def main(tasks: int = 5) -> dict[str, float]:
    """Play the first ``tasks`` airline tasks of the test split with the oracle; print and return the metrics."""

    def make_env() -> envkit.Env:
        return envkit.make("tau2-airline", split="test")

    tokenizer = build_tokenizer()  # any tokenizer with a chat template that renders tools; this one is built locally
    seeds = list(range(tasks))
    backend = OracleBackend(make_env, tokenizer, seeds)
    engine = RolloutEngine(make_env, backend, tokenizer, concurrency=tasks)
    episodes = engine.run(tasks=seeds, group_size=1, sampling=SamplingParams(max_new_tokens=512))
    for episode in episodes:
        task = episode.info.get("task_id")
        print(f"task {task}: score {episode.score} in {episode.turns} turns, ended {episode.finish_reason}")
    metrics = summarize(episodes)
    print(f"mean score {metrics['mean_score']:.3f}, pass@1 {metrics['pass@1']:.3f}")
    return metrics


if __name__ == "__main__":
    assert main()["mean_score"] == 1.0, "the oracle must solve every task"
