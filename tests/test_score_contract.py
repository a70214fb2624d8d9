"""The score contract: ``score()`` is a finite number in [0, 1] and a step reward a finite number; anything else ends
the episode as an error naming the env and the value (reward ``None`` in GRPO, counted in ``envkit/error_rate``),
never a reward. Checked in threads and in worker processes, and on GRPOTrainer's own tensors."""

from __future__ import annotations

import math
import os

import pytest
from test_trl_failures import _trainer

import envkit
from envkit.adapters.trl import ErrorRateExceeded, make_rollout_func
from envkit.backends import ScriptedBackend
from envkit.rollout import RolloutEngine, SamplingParams, summarize
from envkit.workers import EnvFactory

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

BAD = {0: math.nan, 1: 7.5, 2: -3.0, 3: "0.5", 4: None, 5: math.inf}
GOOD = 0.25  # every other seed


class ScoresAs(envkit.Env):
    """One turn; seed ``s`` scores ``BAD[s]`` (else 0.25). With ``nan_reward`` its step reward is NaN instead."""

    max_turns = 1

    def __init__(self, nan_reward: bool = False) -> None:
        super().__init__()
        self.nan_reward = nan_reward

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed, options=options)
        return [{"role": "user", "content": f"Say done ({seed})."}], {}

    def step(self, action):
        return [], math.nan if self.nan_reward else 0.0, True, False, {}

    def score(self):
        return BAD.get(self.np_random_seed, GOOD)


def says_done(tokenizer) -> ScriptedBackend:
    return ScriptedBackend("Done.<|im_end|>", tokenizer=tokenizer)


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_a_score_outside_the_contract_is_a_counted_error_naming_the_env_and_the_value(local_tokenizer, workers):
    factory = EnvFactory(f"{__name__}:ScoresAs")
    engine = RolloutEngine(factory, says_done(local_tokenizer), local_tokenizer, concurrency=4, env_workers=workers)
    try:
        episodes = engine.run([0, 1, 2, 3, 4, 5, 6], 1, SamplingParams())
    finally:
        engine.close()
    for episode in episodes[:6]:
        value = BAD[episode.task_seed]
        assert episode.error is not None, (episode.task_seed, episode.score)
        assert f"ScoresAs.score() returned {value!r}" in episode.error and "[0, 1]" in episode.error
        assert episode.score == 0.0
    assert episodes[6].error is None and episodes[6].score == GOOD
    assert summarize(episodes)["error_rate"] == pytest.approx(6 / 7)


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_a_step_reward_that_is_not_finite_is_an_error_naming_the_env(local_tokenizer, workers):
    factory = EnvFactory(f"{__name__}:ScoresAs", {"nan_reward": True})
    engine = RolloutEngine(factory, says_done(local_tokenizer), local_tokenizer, env_workers=workers)
    try:
        (episode,) = engine.run([6], 1, SamplingParams())
    finally:
        engine.close()
    assert episode.finish_reason == "error" and episode.score == 0.0
    assert "ScoresAs.step() returned the reward nan" in episode.error


def test_grpo_gets_no_reward_for_a_score_outside_the_contract_and_counts_it(local_tokenizer, tiny_model_dir, tmp_path):
    """Seed 0 scores NaN and seed 1 scores 7.5 in every episode: on GRPOTrainer's own tensors no token reaches the
    loss, the rewards are NaN (TRL's unscorable), the error rate is 1, and --max-error-rate stops the run."""
    rollout = make_rollout_func(
        ScoresAs, tokenizer=local_tokenizer, backend=says_done(local_tokenizer), max_error_rate=None
    )
    trainer = _trainer(tiny_model_dir, local_tokenizer, tmp_path / "t", rollout)
    inputs = [trainer.train_dataset[i] for i in (0, 0, 0, 1, 1, 1)]
    trainer.model.train()
    output = trainer._generate_and_score_completions(inputs)
    assert not (output["completion_mask"] * output["tool_mask"]).any()
    assert output["advantages"].tolist() == [0.0] * 6
    metrics = trainer._metrics["train"]
    assert metrics["envkit/error_rate"][-1] == 1.0
    assert math.isnan(metrics["rewards/env_score_reward/mean"][-1])  # every reward is None: TRL's NaN

    failed = make_rollout_func(ScoresAs, tokenizer=local_tokenizer, backend=says_done(local_tokenizer))
    strict = _trainer(tiny_model_dir, local_tokenizer, tmp_path / "s", failed)
    with pytest.raises(ErrorRateExceeded, match=r"ScoresAs\.score\(\) returned nan"):
        strict._generate_and_score_completions(inputs)
