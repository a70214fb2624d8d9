"""Failed episodes in GRPO: no gradient, no skew of their group's baseline, counted, and a stop on too many.

Checked on GRPOTrainer's own tensors (``_generate_and_score_completions``: the loss mask and the advantages it feeds
to the loss), not on envkit's side of the hand-off.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from typing import ClassVar

import pytest
from helpers import CheckedOracleBackend, CounterEnv

from envkit.adapters.trl import (
    ErrorRateExceeded,
    build_dataset,
    env_score_reward,
    group_advantages,
    make_reward_funcs,
    make_rollout_func,
)

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


class Graded(CounterEnv):
    """CounterEnv whose k-th instance on a seed scores k / 4, and whose second instance on seed 0 raises in step:
    groups with unequal scores (so advantages are not all 0) and one failed member."""

    _lock = threading.Lock()
    _instances: ClassVar[dict[int, itertools.count]] = {}

    def reset(self, *, seed=None, options=None):
        with self._lock:
            self.k = next(self._instances.setdefault(seed, itertools.count()))
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self.np_random_seed == 0 and self.k == 1:
            raise ConnectionError("env backend went away")
        return super().step(action)

    def score(self) -> float:
        return self.k / 4


def _trainer(tiny_model_dir, tokenizer, tmp_path, rollout, reward_funcs=env_score_reward, **config):
    from transformers import AutoModelForCausalLM
    from trl import GRPOConfig, GRPOTrainer

    tokenizer.padding_side = "left"
    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=6,
        num_generations=3,
        max_steps=1,
        bf16=False,
        use_cpu=True,
        report_to="none",
        beta=0.0,
        **config,
    )
    return GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)),
        args=args,
        reward_funcs=reward_funcs,
        train_dataset=build_dataset(Graded, [0, 1]),
        processing_class=tokenizer,
        rollout_func=rollout,
    )


@pytest.mark.parametrize("shaped", [False, True])
def test_a_failed_episode_has_zero_weight_in_the_loss_and_no_say_in_its_groups_baseline(
    local_tokenizer, tiny_model_dir, tmp_path, shaped
):
    Graded._instances.clear()
    captured = []
    backend = CheckedOracleBackend(CounterEnv, local_tokenizer, [0, 1])
    rollout = make_rollout_func(
        Graded, tokenizer=local_tokenizer, backend=backend, on_episodes=captured.extend, max_error_rate=None
    )
    reward_funcs = env_score_reward
    if shaped:  # a shaped reward must not make the failed row scorable again
        reward_funcs = make_reward_funcs(
            {"turns": (lambda completions, envkit_turns, **_: [0.0] * len(envkit_turns), 1)}
        )[0]
    trainer = _trainer(tiny_model_dir, local_tokenizer, tmp_path / "t", rollout, reward_funcs)
    inputs = [trainer.train_dataset[i] for i in (0, 0, 0, 1, 1, 1)]
    trainer.model.train()  # as inside trainer.train(): metrics go to the "train" logs
    output = trainer._generate_and_score_completions(inputs)

    failed = [i for i, e in enumerate(captured) if e.error is not None]
    assert len(captured) == 6 and len(failed) == 1 and "env backend went away" in captured[failed[0]].error
    assert failed[0] < 3  # in seed 0's group
    loss_mask = (output["completion_mask"] * output["tool_mask"]).tolist()
    assert not any(loss_mask[failed[0]])  # no token of it reaches the loss
    assert all(any(row) for i, row in enumerate(loss_mask) if i not in failed)
    scores = [None if e.error is not None else e.score for e in captured]
    assert len({s for s in scores[:3] if s is not None}) == 2  # the group has a real spread
    expected = group_advantages(scores[:3]) + group_advantages(scores[3:])
    assert output["advantages"].tolist() == pytest.approx(expected, abs=1e-4)
    # What the old hand-off did (the failed episode as reward 0) gives other advantages: the check can fail.
    as_zero = group_advantages([0.0 if s is None else s for s in scores[:3]])
    assert as_zero != pytest.approx(expected[:3], abs=1e-3)
    metrics = trainer._metrics["train"]
    assert metrics["envkit/error_rate"][-1] == pytest.approx(1 / 6)


def test_training_stops_with_one_line_when_a_steps_error_rate_exceeds_the_limit(
    local_tokenizer, tiny_model_dir, tmp_path
):
    Graded._instances.clear()
    backend = CheckedOracleBackend(CounterEnv, local_tokenizer, [0, 1])
    rollout = make_rollout_func(Graded, tokenizer=local_tokenizer, backend=backend, max_error_rate=0.1)
    trainer = _trainer(tiny_model_dir, local_tokenizer, tmp_path / "t", rollout)
    inputs = [trainer.train_dataset[i] for i in (0, 0, 0, 1, 1, 1)]
    with pytest.raises(ErrorRateExceeded) as raised:
        trainer._generate_and_score_completions(inputs)
    message = str(raised.value)
    assert "\n" not in message
    assert "1 of 6 episodes failed at step 0 (error rate 0.17 > --max-error-rate 0.1)" in message
    assert "ConnectionError: env backend went away" in message


class AlwaysFails(CounterEnv):
    """Every step raises: a broken env that `envkit train` must stop on at its first step."""

    def step(self, action):
        raise RuntimeError("the env's database is down")


def test_envkit_train_stops_at_the_first_step_of_a_broken_env(tiny_model_dir, tmp_path, capsys, monkeypatch):
    from envkit.cli.app import main

    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    code = main(
        [
            "train",
            "--env",
            f"{__name__}:AlwaysFails",
            "--model",
            str(tiny_model_dir),
            "--output-dir",
            str(tmp_path / "out"),
            "--max-steps",
            "3",
            "--rl-max-new-tokens",
            "4",
            "--per-device-train-batch-size",
            "4",
            "--rl-num-generations",
            "2",
            "--train-tasks",
            "4",
            "--eval-tasks",
            "0",
        ]
    )
    err = capsys.readouterr().err
    assert code == 1, err[-2000:]
    line = [x for x in err.replace("\r", "\n").splitlines() if x.startswith("error: training stopped:")]
    assert len(line) == 1, err[-3000:]
    assert "4 of 4 episodes failed at step 0" in line[0] and "database is down" in line[0]
    assert not (tmp_path / "out" / "model.safetensors").exists()
    assert sys.modules.get(__name__) is not None
