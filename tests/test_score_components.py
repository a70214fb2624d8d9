"""Per-component rewards (``Env.score_components()``) in episodes, eval files and training logs, and the rollout
progress bar that moves per turn (issue 23 item 7)."""

from __future__ import annotations

import io
import json
import os

import pytest
from helpers import CounterEnv

from envkit.backends.oracle import OracleBackend
from envkit.cli.app import main
from envkit.rollout import RolloutEngine, SamplingParams, summarize


class Parts(CounterEnv):
    """CounterEnv whose score is made of two named parts."""

    def score_components(self) -> dict[str, float]:
        return {"reached": float(self.total == self.target), "asked_again": float(self.asked_again)}


class BadParts(CounterEnv):
    def score_components(self):
        return {"reached": float("nan")}


def run(env_class, local_tokenizer, workers: str = "threads", seeds=(0, 1)):
    engine = RolloutEngine(
        env_class,
        OracleBackend(env_class, local_tokenizer, list(seeds)),
        local_tokenizer,
        concurrency=2,
        env_workers=workers,
    )
    try:
        return engine.run(list(seeds), 1, SamplingParams(max_new_tokens=64))
    finally:
        engine.close()


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_score_components_reach_the_episode_its_json_and_the_metrics(workers, local_tokenizer):
    episodes = run(Parts, local_tokenizer, workers)
    assert all(e.error is None and e.score == 1.0 for e in episodes), [e.error for e in episodes]
    assert [e.score_components for e in episodes] == [{"reached": 1.0, "asked_again": 1.0}] * 2
    assert json.loads(episodes[0].to_json())["score_components"] == {"reached": 1.0, "asked_again": 1.0}
    metrics = summarize(episodes)
    assert metrics["score/reached"] == 1.0 and metrics["score/asked_again"] == 1.0


def test_an_env_without_components_records_none(local_tokenizer):
    episodes = run(CounterEnv, local_tokenizer)
    assert all(e.error is None and e.score_components == {} for e in episodes)
    assert not any(key.startswith("score/") for key in summarize(episodes))


@pytest.mark.parametrize("workers", ["threads", "processes"])
def test_a_component_that_is_not_a_finite_number_fails_the_episode(workers, local_tokenizer):
    episodes = run(BadParts, local_tokenizer, workers, seeds=(0,))
    assert episodes[0].score == 0.0 and episodes[0].score_components == {}
    assert episodes[0].error == "BadParts.score_components() has 'reached': nan; a component must be finite"


def test_the_progress_bar_counts_turns_before_any_episode_ends(local_tokenizer, monkeypatch):
    """A real model takes minutes per episode: the bar must move per turn, not sit at 0/N."""
    import tqdm.auto

    stream = io.StringIO()
    real = tqdm.auto.tqdm
    monkeypatch.setattr(tqdm.auto, "tqdm", lambda *a, **k: real(*a, **{**k, "file": stream}))
    seen: list[int] = []
    engine = RolloutEngine(CounterEnv, OracleBackend(CounterEnv, local_tokenizer, [3]), local_tokenizer, progress=True)
    episodes = engine.run([3], 1, SamplingParams(max_new_tokens=64), on_turn=lambda e: seen.append(e.turns))
    assert episodes[0].error is None and episodes[0].turns >= 3
    assert seen == list(range(1, episodes[0].turns + 1))
    frames = stream.getvalue().replace("\r", "\n").splitlines()
    assert any("0/1" in frame and "1 turns" in frame for frame in frames), frames


def test_eval_cli_writes_components_and_shows_turns(tiny_model_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    out = tmp_path / "episodes.jsonl"
    argv = ["eval", f"{__name__}:Parts", "--model", str(tiny_model_dir), "--tasks", "2", "--samples", "1"]
    code = main([*argv, "--max-new-tokens", "8", "--max-turns", "2", "--out", str(out)])
    assert code == 0
    captured = capsys.readouterr()
    assert "score/reached" in captured.out and "score/asked_again" in captured.out  # the metrics table
    frames = captured.err.replace("\r", "\n").splitlines()
    assert any("0/2" in frame and " turns" in frame for frame in frames), frames
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(set(line["score_components"]) == {"reached", "asked_again"} for line in lines)
    assert main([*argv, "--max-new-tokens", "8", "--max-turns", "1", "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert {"score/reached", "score/asked_again"} <= set(metrics)
    assert all(0.0 <= metrics[key] <= 1.0 for key in ("score/reached", "score/asked_again"))


def test_training_logs_each_component(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(os.path.dirname(__file__))
    argv = ["train", "--env", f"{__name__}:Parts", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path)]
    fast = ["--max-steps", "1", "--rl-max-new-tokens", "8", "--max-turns", "2", "--per-device-train-batch-size", "4"]
    assert main([*argv, *fast, "--rl-num-generations", "2", "--train-tasks", "4", "--eval-tasks", "0"]) == 0
    history = json.loads((tmp_path / "log_history.json").read_text())
    logged = [entry for entry in history if "loss" in entry]
    assert logged and all({"envkit/score/reached", "envkit/score/asked_again"} <= set(entry) for entry in logged)
