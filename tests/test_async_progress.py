"""``envkit train --async`` shows what the synchronous path shows: :class:`envkit.adapters.trl.progress.TrainProgress`
(a live bar, or with ``--disable-tqdm true`` one plain line per log) in place of transformers' raw dict per step, and
``reward_curve.png`` from the run's log history; and building the trainer warns about nothing it meant to do.

The real ``AsyncGRPOTrainer`` subclass on CPU with a tiny model, trained two steps; the rollout worker is the queue
of ``test_async_staleness`` (what stands in: the worker and the servers' adapter endpoints). End to end through the
command line against a real vLLM server: ``tests/test_async_cli.py``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("trl.experimental.async_grpo")

from test_async_staleness import _sample, _trainer
from transformers import TrainerCallback, trainer_callback
from trl.experimental.async_grpo.async_grpo_trainer import StepIntervalCallback

from envkit.adapters.trl import progress

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def test_building_the_async_trainer_warns_of_no_duplicated_callback(
    tiny_model_dir, local_tokenizer, tmp_path, monkeypatch
):
    """TRL adds two ``StepIntervalCallback`` on purpose (weight sync, step metrics): both are kept, and transformers'
    "there is already one" warning, meant for a callback added twice by mistake, is not printed for them."""
    warnings: list[str] = []
    monkeypatch.setattr(trainer_callback.logger, "warning", lambda message, *a, **k: warnings.append(str(message)))
    trainer, _ = _trainer(tiny_model_dir, local_tokenizer, tmp_path, [])
    assert not [w for w in warnings if "there is already one" in w], warnings
    intervals = [c for c in trainer.callback_handler.callbacks if isinstance(c, StepIntervalCallback)]
    assert len(intervals) == 2  # both still run
    trainer.add_callback(progress.TrainProgress())
    trainer.add_callback(progress.TrainProgress())  # a real duplicate still warns
    assert [w for w in warnings if "there is already one" in w]


def test_async_training_logs_plain_lines_and_writes_the_reward_curve(tiny_model_dir, local_tokenizer, tmp_path, capsys):
    """Two real steps with the sync path's display installed in plain-log mode: one line per step with the mean
    score and turns the rollout worker reported (not TRL's ~60-key dict), a closing line, and ``reward_curve.png``
    drawn from the same log history, one point per step."""
    samples = [_sample([7, 8, 9 + i], version=1, advantage=(-1.0) ** i, group=i // 2) for i in range(4)]
    samples += [_sample([7, 8], version=2, advantage=1.0, group=20 + i // 2) for i in range(2)]  # fetched ahead
    trainer, worker = _trainer(tiny_model_dir, local_tokenizer, tmp_path, samples, steps=2, batch=2)
    lines: list[str] = []
    progress.install(trainer, disable=True, log=lines.append)

    class Report(TrainerCallback):
        """What the rollout worker puts on TRL's metrics queue for the groups of each step."""

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            score = 0.25 * (state.global_step + 1)
            worker.metrics_queue.put({"envkit/mean_score": score, "envkit/mean_turns": 1.0})

    trainer.add_callback(Report())
    trainer.train()
    printed = capsys.readouterr().out
    assert "{'loss'" not in printed and "envkit/mean_score" not in printed  # no raw dict
    assert [line.split(" · ETA")[0].rsplit(" · loss", 1)[0] for line in lines[:2]] == [
        "step 1/2 · score 0.250 · turns 1.00",
        "step 2/2 · score 0.500 · turns 1.00",
    ]
    assert lines[2].startswith("done: 2/2 steps in ")

    path = progress.write_reward_curve(trainer.state.log_history, tmp_path / "out", log=lines.append)
    assert path == tmp_path / "out" / progress.CURVE_FILE and path.stat().st_size > 0
    assert progress.score_points(trainer.state.log_history) == ("envkit/mean_score", [(1, 0.25), (2, 0.5)])
