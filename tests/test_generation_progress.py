"""Progress inside a turn: the transformers backend counts the tokens of a call while it runs, and the rollout bar
shows them with the turn under way (a long first turn on a slow CPU does not look like a hang)."""

from __future__ import annotations

import io
import itertools
import threading

import pytest
from transformers import AutoModelForCausalLM

import envkit
from envkit.backends import SamplingParams, TransformersBackend
from envkit.backends.base import ReportsTokens
from envkit.rollout import RolloutEngine
from envkit.rollout.progress import progress_text


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    """The tiny random model, loaded once."""
    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))


def test_the_hook_gets_increasing_counts_during_one_real_call(tiny_model, local_tokenizer):
    calls: list[tuple[int, float, str]] = []
    returned = threading.Event()

    def hook(count: int, seconds: float) -> None:
        calls.append((count, seconds, "after" if returned.is_set() else "during"))

    # A stop token the random model never emits (the last id), so every row runs its full budget.
    stop = [len(local_tokenizer) - 1]
    backend = TransformersBackend(tiny_model, local_tokenizer, stop_token_ids=stop, token_hook=hook, token_report_s=0)
    assert isinstance(backend, ReportsTokens)
    prompts = [local_tokenizer.encode("one two three"), local_tokenizer.encode("four")]
    sampling = SamplingParams(max_new_tokens=24, seed=7)
    generations = backend.generate(prompts, sampling)
    returned.set()
    counts = [count for count, _, _ in calls]
    assert all(when == "during" for _, _, when in calls)
    assert len(calls) >= 10  # one report per step here (token_report_s=0), and one at the end
    assert counts == sorted(counts) and counts[0] < counts[-1]
    assert counts[-1] == sum(len(g.token_ids) for g in generations) == 48
    assert all(b >= a for (_, a, _), (_, b, _) in itertools.pairwise(calls))  # seconds since the call began
    # Counting changes nothing generated.
    plain = TransformersBackend(tiny_model, local_tokenizer, stop_token_ids=stop).generate(prompts, sampling)
    assert [g.token_ids for g in plain] == [g.token_ids for g in generations]
    assert [g.logprobs for g in plain] == [g.logprobs for g in generations]


def test_rows_that_stop_early_count_only_their_tokens(tiny_model, local_tokenizer):
    counts: list[int] = []
    backend = TransformersBackend(tiny_model, local_tokenizer, token_hook=lambda n, s: counts.append(n))
    budgets = [3, 11]
    generations = backend.generate(
        [local_tokenizer.encode("a b"), local_tokenizer.encode("c")],
        SamplingParams(max_new_tokens=11, seed=3),
        max_new_tokens=budgets,
    )
    assert counts and counts[-1] >= sum(len(g.token_ids) for g in generations)
    assert counts[-1] <= sum(len(g.token_ids) for g in generations) + 1  # the stop token a budget forces is counted


def test_the_bar_shows_tokens_and_the_turn_during_generation(tiny_model, local_tokenizer, monkeypatch):
    import tqdm.auto

    stream = io.StringIO()
    real = tqdm.auto.tqdm
    monkeypatch.setattr(tqdm.auto, "tqdm", lambda *a, **k: real(*a, **{**k, "file": stream}))
    backend = TransformersBackend(tiny_model, local_tokenizer, token_report_s=0)
    engine = RolloutEngine(lambda: envkit.make("arithmetic"), backend, local_tokenizer, max_turns=2, progress=True)
    episodes = engine.run([0, 1], 1, SamplingParams(max_new_tokens=16, seed=1))
    engine.close()
    assert all(e.error is None for e in episodes)
    frames = stream.getvalue().replace("\r", "\n").splitlines()
    shown = [frame for frame in frames if "0/2" in frame and "turn 1 of 2: " in frame and " tok/s" in frame]
    assert shown, frames
    assert backend.token_hook is None  # the run's hook goes with it


def test_no_bar_no_hook(tiny_model, local_tokenizer):
    seen: list[object] = []

    class Watching(TransformersBackend):
        def generate(self, *args, **kwargs):
            seen.append(self.token_hook)
            return super().generate(*args, **kwargs)

    engine = RolloutEngine(lambda: envkit.make("arithmetic"), Watching(tiny_model, local_tokenizer), local_tokenizer)
    engine.run([0], 1, SamplingParams(max_new_tokens=4, seed=1))
    engine.close()
    assert seen and all(hook is None for hook in seen)


@pytest.mark.parametrize(
    ("args", "text"),
    [
        ((0, 0, 10, None, 0.0), "0 turns"),
        ((0, 1, 10, None, 0.0), "0 turns · turn 1 of 10"),
        ((3, 2, 10, 57, 6.0), "3 turns · turn 2 of 10: 57 tokens, 9.5 tok/s"),
        ((3, 2, None, 57, 6.0), "3 turns · turn 2: 57 tokens, 9.5 tok/s"),
        ((0, 1, 4, 0, 0.0), "0 turns · turn 1 of 4: 0 tokens, ? tok/s"),
    ],
)
def test_the_text(args, text):
    assert progress_text(*args) == text


def test_the_held_out_eval_of_envkit_train_shows_the_turn_and_tokens(tiny_model_dir, tmp_path, capsys):
    from envkit.cli.app import main

    argv = ["train", "--env", "arithmetic", "--model", str(tiny_model_dir), "--output-dir", str(tmp_path / "run")]
    fast = ["--max-steps", "1", "--rl-max-new-tokens", "8", "--max-turns", "1", "--per-device-train-batch-size", "2"]
    assert main([*argv, *fast, "--rl-num-generations", "2", "--train-tasks", "2", "--eval-tasks", "2"]) == 0
    frames = capsys.readouterr().err.replace("\r", "\n").splitlines()
    assert any(frame.startswith("episodes:") and "turn 1 of 1" in frame for frame in frames), frames
