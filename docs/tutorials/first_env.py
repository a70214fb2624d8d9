"""Tutorial 1: a first env, end to end — validate it offline, watch its oracle, evaluate a model on it.

The env is the one the quickstart writes, ``examples/capitals.py``, loaded by its spec (``PATH:Class``) as every
``envkit`` command loads a user's env. Run it: ``python docs/tutorials/first_env.py`` (about a minute on a laptop CPU;
nothing is downloaded: the model is a tiny random one built here, so its score is near 0 — the point is the pipeline,
the score comes with training).
"""

from __future__ import annotations

from pathlib import Path

import envkit
from envkit.backends import SamplingParams, TransformersBackend
from envkit.rollout import RolloutEngine, summarize
from envkit.testing import build_tiny_model, build_tokenizer
from envkit.validate import validate_env

SPEC = f"{Path(__file__).resolve().parents[2] / 'examples' / 'capitals.py'}:CapitalsEnv"


def make_env() -> envkit.Env:
    """A fresh CapitalsEnv: the validator and the engine build one per episode."""
    return envkit.make(SPEC)


def main() -> None:
    # 1. Validate offline: scripted policies (the oracle, no-ops, fuzzers, distractors) find the bugs that wreck RL.
    report = validate_env(make_env, target="CapitalsEnv", episodes=5)
    print(report.summary())
    assert not report.failed, report.summary()

    # 2. The oracle's episode, by hand: reset, step, score.
    env = make_env()
    opening, _ = env.reset(seed=3)
    while not env.done:
        env.step(env.oracle())
    print(f"oracle on seed 3: {opening[0]['content']} -> {env.messages[-1]['content']} score {env.score()}")
    assert env.score() == 1.0

    # 3. Evaluate a model: the rollout engine plays 5 tasks x 2 samples, token-exact, and summarizes them.
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer)
    engine = RolloutEngine(make_env, TransformersBackend(model, tokenizer), tokenizer, concurrency=10)
    episodes = engine.run(tasks=range(5), group_size=2, sampling=SamplingParams(max_new_tokens=16, seed=0))
    metrics = summarize(episodes)
    print(f"tiny random model: mean score {metrics['mean_score']:.2f} over {len(episodes)} episodes")
    assert len(episodes) == 10 and all(len(e.completion_ids) == len(e.env_mask) for e in episodes)


if __name__ == "__main__":
    main()
