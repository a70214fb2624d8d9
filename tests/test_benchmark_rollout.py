"""Smoke test of benchmarks/rollout (``python -m benchmarks.rollout``): its whole pipeline at tiny sizes (random
model, no SFT, one repeat)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

pytest.importorskip("trl")


def load_benchmark():
    return importlib.import_module("benchmarks.rollout")


def test_rollout_benchmark_pipeline(tmp_path):
    bench = load_benchmark()
    results = bench.run_benchmark(
        episodes=[4],
        repeats=1,
        workloads=list(bench.WORKLOADS),
        checkpoint=tmp_path / "model",
        sft=False,
        per_turn=4,
        log=lambda _: None,
    )
    json.dumps(results, default=float)  # what --json prints
    for key in ("ratio_vs_trl", "ratio_vs_trl_latency50ms", "ratio_vs_trl_hetero", "overhead_fraction"):
        assert isinstance(results[key], float), key
    for name in bench.WORKLOADS:
        data = results["workloads"][name]["4"]
        arms = data["arms"]
        assert set(arms) == {"trl", "envkit_trl", "envkit", "limit"}
        for arm in ("trl", "envkit_trl", "envkit"):
            assert [run["episodes"] for run in arms[arm]["runs"]] == [4], (name, arm)
            assert arms[arm]["max_turn_tokens"] <= 4, (name, arm)  # the per-turn cap holds on every arm
            assert len(arms[arm]["seconds"]["all"]) == 1  # the warm-up is not reported
        assert data["limit_tokens_identical"], name  # the limit arm regenerated exactly the recorded tokens
    assert results["malformed"] == "end"  # the default: the same turn rule as TRL's loop (see the test below)

    # --pool: several runs' --out files together, per run and every repeat pooled
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    for path in (first, second):
        path.write_text(json.dumps(results, default=float))
    pooled = bench.pool_runs([json.loads(first.read_text()), json.loads(second.read_text())])
    assert set(pooled) == {f"{name} 4" for name in bench.WORKLOADS}
    instant = pooled["instant 4"]
    assert (instant["runs"], instant["repeats"]) == (2, 2)
    assert instant["median_run_ratio"] == results["ratio_vs_trl"]
    low, high = instant["repeat_ratio_95"]
    assert low <= instant["median_repeat_ratio"] <= high
    bench.main(["--pool", str(first), str(second)])
    with pytest.raises(SystemExit):  # a file that is not a result: one line, no traceback
        bench.main(["--pool", str(tmp_path / "missing.json")])

    # the command line, as the docs give it: python -m benchmarks.rollout, from the repository root
    pooled_line = subprocess.run(
        [sys.executable, "-m", "benchmarks.rollout", "--pool", str(first), str(second)],
        cwd=BENCHMARKS.parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert pooled_line.startswith("instant 4 episodes: 2 runs, ratio vs TRL per run"), pooled_line


def test_gather_window_benchmark_runs_every_window_on_the_same_work(tmp_path):
    # benchmarks/gather.py: the bare engine with several gather windows, side by side (random model, tiny sizes).
    spec = importlib.util.spec_from_file_location("benchmark_gather", BENCHMARKS / "gather.py")
    gather = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gather)
    gather.rollout.prepare_checkpoint(tmp_path / "model", sft=False, log=lambda _: None)
    results = gather.bench("hetero", 4, 1, tmp_path / "model", [0.05, 0.25])
    json.dumps(results, default=float)
    assert set(results) == {"gather 0.05 s", "gather 0.25 s"}
    first, second = (results[name]["runs"][0] for name in results)
    assert first["model_tokens"] == second["model_tokens"]  # the same seeds: the same tokens generated
    assert first["errors"] == second["errors"] == 0


def test_a_call_that_does_not_parse_ends_the_episode_in_every_arm_as_in_trls_loop():
    # TRL's loop reads a tool call that does not parse as plain text, which ends its episode; the benchmark's envs end
    # envkit's episode on it too (--malformed end), so both arms play the same turns. --malformed answer keeps
    # envkit's rule: an error message, and the episode goes on.
    from trl.chat_template_utils import parse_response, qwen3_template

    from envkit.chat.parsing import parse_assistant
    from envkit.testing import build_tokenizer

    bench = load_benchmark()
    cut = '<tool_call>\n{"name": "lookup_capital", "arguments": {"country": "Pe'  # the per-turn budget ran out
    tokenizer = build_tokenizer()
    tokenizer.response_template = qwen3_template  # as the benchmark's TRL arm sets it
    trl_reads = parse_response(tokenizer, tokenizer(cut + "<|im_end|>", add_special_tokens=False)["input_ids"])
    assert not trl_reads.get("tool_calls")  # TRL: no call, so the episode ends with this text as its answer

    for env_cls in (bench.capitals_class(0.0), bench.ChainEnv):
        ends = env_cls()
        ends.reset(seed=1)
        observation, _, terminated, _, _ = ends.step(parse_assistant(cut))
        assert (observation, terminated) == ([], True), env_cls
        assert ends.messages[-1]["content"].startswith("<tool_call>")  # the text is the final answer, as in TRL

        goes_on = type("Answers", (env_cls,), {"malformed_ends_episode": False})()
        goes_on.reset(seed=1)
        observation, _, terminated, _, info = goes_on.step(parse_assistant(cut))
        assert not terminated and info["malformed_tool_calls"] == 1
        assert observation[0]["content"].startswith("Error: could not parse tool call")

    well_formed = parse_assistant(
        '<tool_call>\n{"name": "lookup_capital", "arguments": {"country": "Peru"}}\n</tool_call>'
    )
    env = bench.capitals_class(0.0)()
    env.reset(seed=1)
    observation, _, terminated, _, _ = env.step(well_formed)  # a call that parses runs as before
    assert observation[0]["content"] == "Lima" and not terminated
