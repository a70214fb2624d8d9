"""Tutorial 1: a first env, end to end — write it, validate it offline, watch its oracle, evaluate a model on it.

Run it: ``python docs/tutorials/first_env.py`` (about a minute on a laptop CPU; nothing is downloaded: the model is a
tiny random one built here, so its score is near 0 — the point is the pipeline, the score comes with training).
"""

from __future__ import annotations

import envkit
from envkit.backends import SamplingParams, TransformersBackend
from envkit.rollout import RolloutEngine, summarize
from envkit.testing import build_tiny_model, build_tokenizer
from envkit.validate import validate_env

CAPITALS = {"France": "Paris", "Japan": "Tokyo", "Kenya": "Nairobi", "Peru": "Lima", "Canada": "Ottawa"}


class CapitalsEnv(envkit.ToolEnv):
    """Ask for a country's capital; the agent may look it up, then must name it (and no other capital)."""

    max_turns = 4

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        self.country = sorted(CAPITALS)[self.np_random.integers(len(CAPITALS))]
        return [{"role": "user", "content": f"What is the capital of {self.country}?"}], {}

    @envkit.tool
    def lookup_capital(self, country: str) -> str:
        """Look up the capital city of a country.

        Args:
            country: The country's English name, e.g. "France".
        """
        if country not in CAPITALS:
            raise envkit.ToolError(f"unknown country {country!r}")
        return CAPITALS[country]

    def score(self) -> float:
        """1.0 when the final reply is exactly the capital (or "The capital is X."): a reply that also names other
        places, or hedges, must not win, or GRPO would learn to hedge (``envkit validate`` check 15 tries it)."""
        last = self.messages[-1]
        answer = (last["content"] or "").strip().removesuffix(".").strip()
        capital = CAPITALS[self.country]
        return float(last["role"] == "assistant" and answer in {capital, f"The capital is {capital}"})

    def oracle(self):
        if self.messages[-1]["role"] == "user":
            call = {"type": "function", "function": {"name": "lookup_capital", "arguments": {"country": self.country}}}
            return {"role": "assistant", "content": "", "tool_calls": [call]}
        return {"role": "assistant", "content": f"The capital is {self.messages[-1]['content']}."}

    def canaries(self):
        """A reply that lists every capital must not win."""
        return {"every capital in one reply": [", ".join(CAPITALS.values())]}


def main() -> None:
    # 1. Validate offline: scripted policies (the oracle, no-ops, fuzzers, the canaries) find the bugs that wreck RL.
    report = validate_env(CapitalsEnv, target="CapitalsEnv", episodes=5)
    print(report.summary())
    assert not report.failed, report.summary()

    # 2. The oracle's episode, by hand: reset, step, score.
    env = CapitalsEnv()
    opening, _ = env.reset(seed=3)
    while not env.done:
        env.step(env.oracle())
    print(f"oracle on seed 3: {opening[0]['content']} -> {env.messages[-1]['content']} score {env.score()}")
    assert env.score() == 1.0

    # 3. Evaluate a model: the rollout engine plays 5 tasks x 2 samples, token-exact, and summarizes them.
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer)
    engine = RolloutEngine(CapitalsEnv, TransformersBackend(model, tokenizer), tokenizer, concurrency=10)
    episodes = engine.run(tasks=range(5), group_size=2, sampling=SamplingParams(max_new_tokens=16, seed=0))
    metrics = summarize(episodes)
    print(f"tiny random model: mean score {metrics['mean_score']:.2f} over {len(episodes)} episodes")
    assert len(episodes) == 10 and all(len(e.completion_ids) == len(e.env_mask) for e in episodes)


if __name__ == "__main__":
    main()
