"""Smoke test of benchmarks/learning_rl (GRPO vs RFT vs SFT where demonstrations fall short) and its envs: the
whole pipeline at tiny sizes, its pilot gate, its held-out check and its statistics."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

import envkit
from benchmarks.learning_rl import cli, envs, evaluation, experiments, files, report, search, training

pytest.importorskip("trl")


def play_oracle(env, seed):
    env.reset(seed=seed)
    while not env.done:
        env.step(env.oracle())
    return env


def test_flaky_calculator_fails_at_its_rate_and_the_oracle_retries():
    """Over 400 tasks at p = 0.3 about 30 % of calls fail; the oracle calls again after each failure and solves all."""
    results = []
    for seed in range(400):
        env = play_oracle(envs.FlakyArithmeticEnv(fail_p=0.3), seed)
        calls = [m["content"] for m in env.messages if m["role"] == "tool" and m.get("name") == "calculator"]
        assert env.score() == 1.0 or len(calls) >= 5  # unsolved only when it ran out of turns
        results += calls
    errors = [r for r in results if r.startswith("Error")]
    assert 0.25 < len(errors) / len(results) < 0.35
    assert all(envs.FAILURE_MARKER in e for e in errors)
    clean = play_oracle(envs.FlakyArithmeticEnv(fail_p=0.0), 0)
    assert not any(str(m.get("content", "")).startswith("Error") for m in clean.messages)


def test_a_failed_call_repeats_its_expression():
    """The error names the expression it failed on, so a retry can copy it from there."""
    env = envs.FlakyArithmeticEnv(fail_p=0.99)
    env.reset(seed=0)
    env.step(envs._call("calculator", {"expression": "12 * 34 - 5"}))
    assert (
        env.messages[-1]["content"] == "Error: calculator temporarily unavailable for 12 * 34 - 5, please call it again"
    )


def test_a_replayed_flaky_episode_meets_the_same_failures():
    """Failures depend on the task and the call count only: the oracle's replicas (and reruns) see the same ones."""

    def failures(seed):
        env = play_oracle(envs.FlakyArithmeticEnv(fail_p=0.5), seed)
        return [m["content"] for m in env.messages if m["role"] == "tool"]

    assert [failures(s) for s in range(20)] == [failures(s) for s in range(20)]


def test_chains_have_their_depth_one_call_per_step_and_hold_out_pairs():
    for seed in range(50):
        env = envs.ChainEnv(depths=[3, 4])
        _, info = env.reset(seed=seed)
        pairs = set(itertools.pairwise(info["operations"]))
        assert info["depth"] in (3, 4) and not pairs & set(envs.HELD_OUT_PAIRS)
        held = envs.ChainEnv(depths=[3], require_pair=True)
        _, info = held.reset(seed=seed)
        assert set(itertools.pairwise(info["operations"])) & set(envs.HELD_OUT_PAIRS)
        solved = play_oracle(envs.ChainEnv(depths=[5]), seed)
        assert solved.score() == 1.0
        assert sum(m["role"] == "tool" and m.get("name") == "calculator" for m in solved.messages) == 5
    env = envs.ChainEnv()
    env.reset(seed=0)
    assert env.calculator("-7 * 3") == "-21"
    with pytest.raises(envkit.ToolError, match="one operation per call"):
        env.calculator("2 + 3 * 4")


def test_numbered_chains_name_each_step_in_the_question_and_in_the_calculators_answers():
    """``numbered``: the question numbers the steps and each answered calculator call says which step it completes
    (a refused call does not count), so the next operation is found by number; the task and its answer are the
    same as unnumbered."""
    env = envs.ChainEnv(depths=[3], numbered=True)
    messages, _ = env.reset(seed=4)
    plain = envs.ChainEnv(depths=[3])
    plain.reset(seed=4)
    (name, operand), start = env.steps[1], env.start
    question = messages[-1]["content"]
    assert (
        question.startswith(f"Start with {start}. Step 1: ")
        and f"Step 2: {envs.OPERATIONS[name][0]} {operand}." in question
    )
    assert (env.values, env.steps) == (plain.values, plain.steps)
    with pytest.raises(envkit.ToolError):
        env.calculator("1 + 2 + 3")
    assert env.calculator(f"{start} + 0") == f"Step 1 done: {start}"
    assert env.calculator("-7 * 3") == "Step 2 done: -21"
    solved = play_oracle(envs.ChainEnv(depths=[4], numbered=True), 9)
    answers = [m["content"] for m in solved.messages if m["role"] == "tool" and m.get("name") == "calculator"]
    assert solved.score() == 1.0 and [a.split(":")[0] for a in answers] == [f"Step {i} done" for i in range(1, 5)]


def test_announced_chains_repeat_the_next_step_in_each_calculator_answer():
    """``announce_next``: each answered call also repeats the question's next step, so the next call's operand is in
    the message before it; after the last step nothing follows. The task and its answer are unchanged."""
    env = envs.ChainEnv(depths=[3], numbered=True, announce_next=True)
    messages, _ = env.reset(seed=4)
    numbered = envs.ChainEnv(depths=[3], numbered=True)
    assert numbered.reset(seed=4)[0] == messages and (env.values, env.steps) == (numbered.values, numbered.steps)
    (second, operand2), (third, operand3) = env.steps[1], env.steps[2]
    assert env.calculator("2 + 3") == f"Step 1 done: 5. Step 2: {envs.OPERATIONS[second][0]} {operand2}."
    assert env.calculator("5 * 2") == f"Step 2 done: 10. Step 3: {envs.OPERATIONS[third][0]} {operand3}."
    assert env.calculator("10 - 1") == "Step 3 done: 9"
    assert env.calculator("9 + 1") == "Step 4 done: 10"  # a call past the chain: nothing to announce
    solved = play_oracle(envs.ChainEnv(depths=[4], numbered=True, announce_next=True), 9)
    assert solved.score() == 1.0
    with pytest.raises(ValueError, match="announce_next needs numbered=True"):
        envs.ChainEnv(announce_next=True)


def test_chain_depth_weights_make_deep_demonstrations_rare():
    """B's demonstrations: 5 % of task seeds draw depth 3; without weights every depth is equally likely."""
    weighted = [
        envs.ChainEnv(depths=[1, 2, 3], depth_weights=[0.475, 0.475, 0.05]).reset(seed=s)[1]["depth"]
        for s in range(2000)
    ]
    assert 0.035 < weighted.count(3) / len(weighted) < 0.065
    even = [envs.ChainEnv(depths=[1, 2, 3]).reset(seed=s)[1]["depth"] for s in range(600)]
    assert all(0.28 < even.count(k) / len(even) < 0.39 for k in (1, 2, 3))
    with pytest.raises(ValueError, match="one non-negative weight per depth"):
        envs.ChainEnv(depths=[1, 2], depth_weights=[1.0])


def test_pass_at_k_is_the_unbiased_estimator():
    """pass@k equals the fraction of k-subsets of the n samples that hold a success, counted by brute force."""
    for n, c in [(6, 0), (6, 1), (6, 3), (6, 6)]:
        samples = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(samples, k))
            assert math.isclose(evaluation.pass_at_k(n, c, k), sum(any(s) for s in subsets) / len(subsets))


def test_after_a_tool_failure_tells_a_retry_from_giving_up():
    """The oracle calls the calculator again after every failure (retried 1.0; a failure on the last turn has no next
    turn and is not counted); a policy that submits a guess after a failure retried 0.0 and lost those tasks.
    Episodes without a failure count apart."""
    from envkit.rollout.episode import Episode

    def episode(env, seed):
        return Episode(task_seed=seed, group_index=0, messages=list(env.messages), score=env.score())

    oracle = [episode(play_oracle(envs.FlakyArithmeticEnv(fail_p=0.5), s), s) for s in range(40)]
    figures = evaluation.after_tool_failure(oracle, envs.FAILURE_MARKER)
    assert figures["failures"] > 10 and figures["retried"] == 1.0
    assert figures["score_without_failure"] == 1.0 and figures["score_with_failure"] > 0.8  # unless out of turns

    gave_up = []
    for seed in range(40):
        env = envs.FlakyArithmeticEnv(fail_p=0.5)
        env.reset(seed=seed)
        env.step(env.oracle())  # the first calculator call, failed or not
        env.step(envs._call("submit_answer", {"answer": -1}))
        gave_up.append(episode(env, seed))
    figures = evaluation.after_tool_failure(gave_up, envs.FAILURE_MARKER)
    assert figures["retried"] == 0.0 and figures["score_with_failure"] == 0.0
    assert 0 < figures["episodes_with_failure"] < 40
    assert evaluation.after_tool_failure(gave_up, "no such error")["retried"] is None


def test_a_held_out_prompt_seen_in_training_is_caught():
    exp = experiments.EXPERIMENTS["B"]
    seen = {experiments.prompt_of(exp.factory(exp.conditions["k=3"]), 1_000_000)}
    with pytest.raises(experiments.HeldOutOverlap):
        experiments.check_disjoint(exp, {"k=3": [1_000_000, 1_000_001]}, seen)
    seeds, dropped = experiments.held_out_split(exp, "k=3", 2, seen, offset=0)
    assert dropped == 1 and seeds == [1_000_001, 1_000_002]


def test_learning_rl_pipeline_end_to_end(tmp_path, capsys):
    """A's probe and pilot gate are set out of reach, so A tries a second initialisation, then stops after its warm
    start and says so; B's gate too, but with ``--ignore-gate`` it runs every arm, and the log and the report say the
    arms ran below the gate. Per-seed JSON, the report's IQM/CI/probability-of-improvement tables, pass@k, figures and
    canaries all come out; a rerun skips what finished."""
    out = tmp_path / "out"
    unreachable = ["--gate", "1.0", "--probe-threshold", "1.1", "--warm-attempts", "2"]
    cli.main(["--quick", "--experiments", "A", *unreachable, "--out", str(out)])
    summary = cli.main(["--quick", "--experiments", "B", "--gate", "1.0", "--ignore-gate", "--out", str(out)])
    printed = capsys.readouterr().out
    a = json.loads((out / "A" / "seed-0.json").read_text())
    assert a["gated"] and not a["gate"]["passed"] and "grpo" not in a
    assert "after_failure" in a["eval"]["warm_start"]["conditions"]["p=0.3"]  # A injects failures, B does not
    # A's gate scores the episodes that met a failure, not the whole condition (mostly the task the warm start knows)
    gate = a["gate"]
    assert gate["solved"] == (gate["after_failure"]["score_with_failure"] or 0.0)
    # A probe out of reach: a second, fresh initialisation was tried, and the warm start says it did not pass.
    assert [t["init_seed"] for t in a["warm_start"]["attempts"]] == [0, 1000] and not a["warm_start"]["passed"]
    assert "FAILED: GRPO and RFT get little or no signal; arms not run" in printed
    assert "FAILED: GRPO and RFT get little or no signal; arms run anyway (--ignore-gate)" in printed
    assert "privileged-lr0.0005: 0 SFT steps, validation 0.000" in printed  # each SFT-to-plateau validation, logged
    b = json.loads((out / "B" / "seed-0.json").read_text())
    assert b["below_gate"] and not b["gate"]["passed"]
    assert b["tasks"]["overlap"] == 0 and set(b["eval"]) == set(experiments.MODELS)
    assert "after_failure" not in b["eval"]["grpo"]["conditions"]["k=3"]
    assert b["rft"]["env_episodes"] == b["grpo"]["env_episodes"] == 8  # equal env episodes
    # The search seed ran every arm at both rates of the grid and scored each run on the validation split; the runs it
    # kept are the ones evaluated held out (the quick runs all score 0: the tie goes to the smaller rate). Its JSON
    # keeps every run's record, the ones not kept too.
    search = json.loads((out / "B" / "search.json").read_text())
    assert search["seed"] == 0 and search["learning_rates"] == [1e-4, 5e-4]
    assert set(search["chosen"]) == set(b["search"]) == set(experiments.ARMS)
    for arm in experiments.ARMS:
        assert set(b["search"][arm]) == {"0.0001", "0.0005"} and b[arm]["learning_rate"] == search["chosen"][arm]
        validation = {rate: run["validation"]["mean_score"] for rate, run in b["search"][arm].items()}
        assert search["validation"][arm] == validation and (out / "B" / "seed-0" / f"{arm}-lr0.0005").is_dir()
        not_kept = json.loads((out / "B" / "seed-0" / f"{arm}-lr0.0005.json").read_text())
        assert b["search"][arm]["0.0005"]["training"] == not_kept
    assert b["sft_compute"]["matched_to"] == b["grpo"]["run"] == "grpo-lr0.0001"  # GRPO's kept run's CPU time
    for model in experiments.MODELS:
        evaluation = b["eval"][model]
        assert set(evaluation["conditions"]) == set(experiments.EXPERIMENTS["B"].conditions)
        assert len(evaluation["pass@k"]["pass@k"]) == 4  # k = 1 … --pass-k-samples
        assert all(0.0 <= c["format_valid"] <= 1.0 for c in evaluation["conditions"].values())
    assert set(summary["B"]["models"]) == set(experiments.MODELS)
    assert set(summary["B"]["probability_of_improvement"]) == set(experiments.MODELS) - {"grpo"}
    results = (out / "results.md").read_text()
    assert "IQM" in results and "Probability of improvement" in results and "gated by the pilot gate: [0]" in results
    assert "Learning-rate search, the same budget for every arm: each ran at 0.0001 and 0.0005 on seed 0" in results
    assert "| privileged | 0.000 | 0.000 | 0.0001 |" in results
    assert "learning rates: grpo 0.0001, rft 0.0001, sft_plateau 0.0001" in results  # each seed's, in its line
    assert f"## Experiment B: {experiments.EXPERIMENTS['B'].title}\n" in results  # the current design, by its title
    assert "arms run below the gate with --ignore-gate: [0]" in results
    assert "initialisations tried: 2, rejected: probe " in results  # A's attempt not kept, with its probe and gate
    assert (out / "B-pass_at_k.png").stat().st_size and (out / "B-learning_curves.png").stat().st_size
    canaries = json.loads((out / "B" / "canaries.json").read_text())
    assert {c["status"] for c in canaries.values()} == {"PASS"}
    cli.main(["--quick", "--experiments", "B", "--gate", "1.0", "--ignore-gate", "--out", str(out)])
    assert "[B seed 0] finished earlier" in capsys.readouterr().out
    # In the default --out, git keeps the records, each finished phase and the warm starts' weights; no arm's weights.
    kept = {"/".join(p.relative_to(out).parts) for p in _kept_by_git(out)}
    assert {"A/args.json", "A/canaries.json", "A/seed-0.json", "A/seed-0/log.txt", "B/seed-0.json"} <= kept
    assert {"A/seed-0/warm-attempt-1/attempt.json", "results.md", "summary.json", "B-pass_at_k.png"} <= kept
    assert "B/search.json" in kept  # what the other seeds' arms run at
    assert {"B/seed-0/warm_start.json", "B/seed-0/grpo-lr0.0005.json", "B/seed-0/eval-grpo-lr0.0001.json"} <= kept
    assert "B/seed-0/warm/model.safetensors" in kept
    assert all(
        p.endswith(("/args.json", "/canaries.json", "/search.json", "/log.txt", "/attempt.json", ".png", ".md"))
        or p == "summary.json"
        or re.fullmatch(r"[AB]/seed-\d+(\.json|/[^/]+\.json|/warm/[^/]+)", p)
        for p in kept
    )
    weights = {"/".join(p.relative_to(out).parts) for p in out.rglob("*.safetensors")}
    assert weights - kept and all("/warm/" in p for p in weights & kept)  # arms' and attempts' weights stay here
    # A pilot's --out beside it (benchmarks/learning_rl_runs_NAME) keeps the same records.
    assert _kept_by_git(out, "benchmarks/learning_rl_runs_h256") == _kept_by_git(out)
    with pytest.raises(SystemExit, match=r"was run with --gate 1\.0 \(now 0\.5\).*same settings"):
        cli.main(["--quick", "--experiments", "B", "--gate", "0.5", "--ignore-gate", "--out", str(out)])


def _kept_by_git(out: Path, folder: str | None = None) -> list[Path]:
    """The files under ``out`` that git would keep if ``out`` were ``folder`` of the repository (default: the default
    ``--out``), by ``.gitignore``'s rules."""
    root = Path(cli.__file__).resolve().parents[2]
    if subprocess.run(["git", "-C", str(root), "rev-parse"], capture_output=True).returncode:
        pytest.skip("not a git checkout: .gitignore's rules cannot be asked")
    files = [p for p in out.rglob("*") if p.is_file()]
    where = Path(folder) if folder else cli.DEFAULT_OUT.relative_to(root)
    paths = "\n".join(str(where / p.relative_to(out)) for p in files)
    ignored = subprocess.run(
        ["git", "-C", str(root), "check-ignore", "--no-index", "--stdin"], input=paths, capture_output=True, text=True
    ).stdout.split()
    return [p for p in files if str(where / p.relative_to(out)) not in ignored]


def _carry(out: Path, clone: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Copy to ``clone`` what another machine gets from a commit: the files git keeps under ``out`` and the
    checkpoints ``--in-progress`` lists there (force-added); returns those, relative to ``out``."""
    capsys.readouterr()
    cli.main(["--in-progress", "--out", str(out)])
    listed = [Path(line) for line in capsys.readouterr().out.splitlines()]
    _copy(_kept_by_git(out) + [f for folder in listed for f in folder.rglob("*") if f.is_file()], out, clone)
    return ["/".join(folder.relative_to(out).parts) for folder in listed]


def _copy(files: list[Path], out: Path, clone: Path) -> None:
    """Copy ``files`` (under ``out``) to the same places under ``clone``."""
    for path in files:
        (clone / path.relative_to(out)).parent.mkdir(parents=True, exist_ok=True)
        (clone / path.relative_to(out)).write_bytes(path.read_bytes())


def test_a_setting_only_one_run_recorded_stops_a_resumed_run(tmp_path):
    """A flag the earlier run did not record (added since) or recorded and this run lacks (removed since) is a change
    of protocol too: the resumed run stops with one line naming it, as it does for a changed value."""
    args = cli.parser().parse_args(["--quick"])
    path = tmp_path / "A" / "args.json"
    path.parent.mkdir()
    cli.same_protocol(path, args, experiments.EXPERIMENTS["A"])
    cli.same_protocol(path, args, experiments.EXPERIMENTS["A"])  # the same settings resume
    recorded = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in recorded.items() if k != "warm_attempts"}))
    with pytest.raises(SystemExit, match=r"was run with --warm-attempts absent \(now 5\): resume with") as stopped:
        cli.same_protocol(path, args, experiments.EXPERIMENTS["A"])
    assert "\n" not in str(stopped.value)
    path.write_text(json.dumps({**recorded, "old_flag": 2}))
    with pytest.raises(SystemExit, match=r"was run with --old-flag 2 \(now absent\): resume with the same settings"):
        cli.same_protocol(path, args, experiments.EXPERIMENTS["A"])


def test_another_version_of_a_package_that_shapes_the_runs_stops_a_resumed_run(tmp_path):
    """The versions of torch, transformers, TRL, tokenizers and accelerate are part of the protocol (an upgrade can
    change what the same seed trains): a resumed run under another one stops with one line that says how to install
    the recorded one; a record made before versions were recorded names them as absent."""
    args = cli.parser().parse_args(["--quick"])
    path = tmp_path / "A" / "args.json"
    path.parent.mkdir()
    cli.same_protocol(path, args, experiments.EXPERIMENTS["A"])
    recorded = json.loads(path.read_text())
    assert recorded["version:transformers"] == metadata.version("transformers")
    path.write_text(json.dumps({**recorded, "version:transformers": "0.0.1"}))
    with pytest.raises(
        SystemExit,
        match=r"was run with transformers '0\.0\.1' \(now '[^']+'\): resume with the same "
        r"settings \(pip install transformers==0\.0\.1\), or start anew",
    ) as stopped:
        cli.same_protocol(path, args, experiments.EXPERIMENTS["A"])
    assert "\n" not in str(stopped.value)
    path.write_text(json.dumps({k: v for k, v in recorded.items() if k != "version:torch"}))
    with pytest.raises(
        SystemExit, match=r"was run with torch absent \(now '[^']+'\): resume with the same settings, or"
    ):
        cli.same_protocol(path, args, experiments.EXPERIMENTS["A"])


def test_a_changed_env_config_of_the_experiment_stops_a_resumed_run(tmp_path):
    """The experiment's definition is part of its protocol, not only the flags: a resumed run whose code gives the
    demonstrations (or any other role) another env config stops with one line naming the field."""
    args = cli.parser().parse_args(["--quick"])
    path = tmp_path / "B" / "args.json"
    path.parent.mkdir()
    before = experiments.EXPERIMENTS["B"]
    cli.same_protocol(path, args, before)
    changed = dataclasses.replace(before, demo={**before.demo, "depth_weights": [0.5, 0.5, 0.0]})
    with pytest.raises(
        SystemExit, match=r"was run with the experiment's demo \{.*\} \(now \{.*\}\): resume"
    ) as stopped:
        cli.same_protocol(path, args, changed)
    assert "[0.5, 0.5, 0.0]" in str(stopped.value) and "\n" not in str(stopped.value)
    cli.same_protocol(path, args, dataclasses.replace(before, title="another wording"))  # words are not protocol


def test_a_report_of_an_earlier_design_uses_its_recorded_conditions_and_says_so(tmp_path):
    """A replaced design's folder (``benchmarks/learning_rl_runs_NAME``) is reported with the env configs and
    conditions its args.json recorded, titled as an earlier design, not under today's definition and title."""
    args = cli.parser().parse_args(["--quick"])
    path = tmp_path / "A" / "args.json"
    path.parent.mkdir()
    current = experiments.EXPERIMENTS["A"]
    earlier = dataclasses.replace(current, demo={"fail_p": 0.02}, conditions={"p=0.9": {"fail_p": 0.9}})
    cli.same_protocol(path, args, earlier)
    recorded = experiments.as_recorded(current, json.loads(path.read_text()))
    assert recorded.demo == {"fail_p": 0.02} and list(recorded.conditions) == ["p=0.9"]
    assert "an earlier design" in recorded.title and "A/args.json" in recorded.title
    cli.same_protocol(tmp_path / "args.json", args, current)
    assert experiments.as_recorded(current, json.loads((tmp_path / "args.json").read_text())) is current


def test_an_experiment_started_without_a_finished_seed_is_in_the_report_saying_so(tmp_path):
    """A seed's records moved aside to run again (or a first seed still training) leave an experiment with no
    finished seed: the report still has its section, saying so, instead of leaving the experiment out."""
    args = cli.parser().parse_args(["--quick"])
    (tmp_path / "B").mkdir()
    cli.same_protocol(tmp_path / "B" / "args.json", args, experiments.EXPERIMENTS["B"])
    report.report(tmp_path, args)
    results = (tmp_path / "results.md").read_text()
    assert f"## Experiment B: {experiments.EXPERIMENTS['B'].title}\n\nNo seed has finished yet" in results
    assert "## Experiment A" not in results  # never started: nothing to say


def test_learning_curves_are_windowed_to_rfts_rounds_and_averaged_over_seeds():
    """GRPO's batch scores are averaged over windows of RFT's round (each point at the window's end), so both arms'
    points are means of as many episodes; the mean over seeds keeps only the points every seed has."""
    grpo = [[32 * step, float(step % 2)] for step in range(1, 21)]  # 20 batches of 32: 0, 1, 0, 1, …
    assert report.windowed(grpo, 320) == [(320, 0.5), (640, 0.5)]
    assert report.windowed([[320, 0.25], [640, 0.75]], 320) == [(320, 0.25), (640, 0.75)]  # RFT's rounds as they are
    assert report.seed_mean([[(320, 0.2), (640, 0.4)], [(320, 0.4)]]) == [(320, pytest.approx(0.3))]


def _tiny_sft() -> tuple[Any, Any, Any, list[Any]]:
    """``--quick``'s settings (SFT batch 2), a tiny model and its tokenizer, and 4 oracle demonstrations of depth-1
    chains: what the ``sft_keep_best`` tests train."""
    from envkit.testing import build_tiny_model, build_tokenizer

    args = cli.parser().parse_args(["--quick"])
    args.sft_batch_size = 2
    tokenizer = build_tokenizer()
    model = build_tiny_model(tokenizer, hidden_size=16)
    return args, tokenizer, model, training.oracle_demos(lambda: envs.ChainEnv(depths=[1]), tokenizer, list(range(4)))


def _keep_best_patience_2(model: Any, tokenizer: Any, demos: list[Any], args: Any, score: Any, **kw: Any) -> Any:
    """``sft_keep_best`` up to 100 steps at 1e-2, scored every 2 steps and before the first, patience 2."""
    return training.sft_keep_best(
        model,
        tokenizer,
        demos,
        args,
        0,
        max_steps=100,
        every=2,
        learning_rate=1e-2,
        score=score,
        stop=lambda _, since_best: since_best >= 2,
        score_first=True,
        **kw,
    )


def test_sft_keep_best_keeps_the_best_checkpoint_and_stops_after_patience():
    """The SFT arms and the warm start keep the checkpoint with the best score, not the last: with scores that rise
    then fall, the model ends with the weights of the best evaluation, and training stops once two evaluations in a
    row fail to beat it."""

    args, tokenizer, model, demos = _tiny_sft()
    scores, weights = iter([0.2, 0.6, 0.4, 0.5, 0.9]), {}

    def score():
        weights[len(weights)] = {k: v.clone() for k, v in model.state_dict().items()}
        return next(scores)

    kept = _keep_best_patience_2(model, tokenizer, demos, args, score)
    assert kept.curve == [[0, 0.2], [2, 0.6], [4, 0.4], [6, 0.5]]  # stopped: 0.4 and 0.5 did not beat 0.6
    assert (kept.steps, kept.best_step, kept.best) == (6, 2, 0.6)
    assert same_weights(model.state_dict(), weights[1])
    assert not same_weights(model.state_dict(), weights[3])


def test_sft_keep_best_spends_no_patience_stop_before_its_min_steps():
    """SFT to its plateau runs at least ``--plateau-min-steps`` before its patience can end it: an early dip (here
    two evaluations below the first) does not stop it; the evaluations that fail to beat the best still count, so the
    first one at ``min_steps`` stops it once the patience is spent there."""
    args, tokenizer, model, demos = _tiny_sft()

    def run(scores: list[float], min_steps: int) -> training.Selection:
        values = iter(scores)
        return _keep_best_patience_2(model, tokenizer, demos, args, lambda: next(values), min_steps=min_steps)

    dip = [0.5, 0.3, 0.4, 0.7, 0.6, 0.6, 0.6]
    assert run(dip, 0).curve == [[0, 0.5], [2, 0.3], [4, 0.4]]  # the old rule: stopped on the dip
    kept = run(dip, 6)
    assert kept.curve == [[0, 0.5], [2, 0.3], [4, 0.4], [6, 0.7], [8, 0.6], [10, 0.6]]
    assert (kept.steps, kept.best_step) == (10, 6)
    assert run([0.5, 0.3, 0.4, 0.2, 0.9], 6).curve == [[0, 0.5], [2, 0.3], [4, 0.4], [6, 0.2]]  # spent by step 6


class Cut(Exception):
    """A session ending mid-run."""


def same_weights(a, b):
    """Whether two state dicts hold equal tensors, bit for bit."""
    import torch

    return all(torch.equal(v, b[k]) for k, v in a.items())


def test_sft_keep_best_cut_after_a_checkpoint_goes_on_from_it_to_the_same_weights(tmp_path):
    """A run given a checkpoints folder survives a cut: the next call goes on from the last evaluation's checkpoint
    (optimizer, schedule, place in the data, and the selection so far with the best weights) and trains and scores
    only what the cut lost, to the same weights at every evaluation as a run never cut, and the same best; a cut
    after the last step, whatever ``every``, trains and scores nothing again."""

    from envkit.testing import build_tiny_model, build_tokenizer

    args = cli.parser().parse_args(["--quick"])
    args.sft_batch_size = 2
    tokenizer = build_tokenizer()
    demos = training.oracle_demos(lambda: envs.ChainEnv(depths=[1]), tokenizer, list(range(8)))
    scores = [0.2, 0.6, 0.4, 0.5, 0.3]  # at steps 0, 2, 4, 6 and the last, 7: the best (step 2) before the cut

    def run(model, folder, weights, cut_at=None, resumed=None):
        def score():
            if len(weights) == cut_at:
                raise Cut
            weights.append({k: v.clone() for k, v in model.state_dict().items()})
            return scores[len(weights) - 1]

        return training.sft_keep_best(
            model,
            tokenizer,
            demos,
            args,
            0,
            max_steps=7,
            every=2,
            learning_rate=1e-2,
            score=score,
            stop=lambda *_: False,
            score_first=True,
            decay=True,
            checkpoints=folder,
            on_resume=resumed.append if resumed is not None else None,
        )

    whole, whole_weights = build_tiny_model(tokenizer, hidden_size=16, seed=0), []
    expected = run(whole, None, whole_weights)

    folder, weights, resumed = tmp_path / training.RESUME_FOLDER, [], []
    with pytest.raises(Cut):
        run(build_tiny_model(tokenizer, hidden_size=16, seed=0), folder, weights, cut_at=4)  # at step 7's score
    assert training.latest_checkpoint(folder).name == "checkpoint-6"  # in the second pass over the 8 demos
    fresh = build_tiny_model(tokenizer, hidden_size=16, seed=0)  # a new process: the model as first built
    kept = run(fresh, folder, weights, resumed=resumed)
    assert resumed == [6] and len(weights) == len(scores)  # step 7 scored, nothing before it again
    assert same_weights(weights[4], whole_weights[4])  # trained on as if never cut
    assert not same_weights(weights[4], weights[1])
    assert (kept.curve, kept.steps, kept.best_step, kept.best) == (expected.curve, 7, 2, 0.6)
    assert same_weights(fresh.state_dict(), whole_weights[1])  # the best, saved with the checkpoint before the cut

    # Cut after the run ended (while its caller went on): the next call trains and scores nothing, same best.
    again = build_tiny_model(tokenizer, hidden_size=16, seed=1)
    assert run(again, folder, list(weights), cut_at=len(scores)).curve == expected.curve
    assert same_weights(again.state_dict(), whole_weights[1])
    training.discard_checkpoints(tmp_path)
    assert not folder.exists()


def test_the_warm_starts_cosine_schedule_takes_smaller_steps_than_a_constant_rate():
    """``decay`` lowers the learning rate along a cosine after the first step: from the same weights and the same
    batches, the decayed run moves the weights less than the constant one (Adam's step scales with the rate)."""
    from envkit.testing import build_tiny_model, build_tokenizer

    args = cli.parser().parse_args(["--quick"])
    args.sft_batch_size = 2
    tokenizer = build_tokenizer()
    demos = training.oracle_demos(lambda: envs.ChainEnv(depths=[1]), tokenizer, list(range(8)))
    start = build_tiny_model(tokenizer, hidden_size=16, seed=0).state_dict()

    def moved(decay: bool) -> float:
        model = build_tiny_model(tokenizer, hidden_size=16, seed=0)
        training.sft_steps(model, tokenizer, demos, 4, args, 0, learning_rate=1e-2, decay=decay)
        return sum((v - start[k]).abs().sum().item() for k, v in model.state_dict().items())

    constant, decayed = moved(False), moved(True)
    assert 0 < decayed < 0.9 * constant


def test_compute_matched_sft_cut_midway_goes_on_with_the_cpu_time_it_had_left(tmp_path):
    """The compute-matched SFT (``sft_for_cpu``) survives a cut: each checkpoint records the training CPU spent, and
    the next call goes on from the newest with the rest of the budget, to the uncut run's steps and weights. Its
    checkpoint is what ``--in-progress`` carries. The clock ticks once per reading, so the budget is exact: writing a
    checkpoint costs a tick that is not counted, and a run that saves none spends its budget on the same steps."""
    from benchmarks.learning_rl.carry import in_progress
    from envkit.testing import build_tiny_model, build_tokenizer

    args = cli.parser().parse_args(["--quick"])
    args.sft_batch_size = 2
    tokenizer = build_tokenizer()
    demos = training.oracle_demos(lambda: envs.ChainEnv(depths=[1]), tokenizer, list(range(8)))

    def ticking(cut_at: int | None = None):
        ticks = itertools.count()

        def clock() -> float:
            tick = next(ticks)
            if tick == cut_at:
                raise Cut
            return float(tick)

        return clock

    def run(checkpoints=None, clock=None, resumed=None):
        model = build_tiny_model(tokenizer, hidden_size=16, seed=0)  # a new process: the model as first built
        steps = training.sft_for_cpu(
            model,
            tokenizer,
            demos,
            args,
            0,
            learning_rate=1e-2,
            cpu_seconds=7,
            checkpoints=checkpoints,
            every=2,
            on_resume=resumed.append if resumed is not None else None,
            clock=clock or ticking(),
        )
        return steps, model.state_dict()

    whole_steps, whole = run()
    assert whole_steps == 7  # one tick per step
    assert run(tmp_path / "saving" / training.RESUME_FOLDER)[0] == 7  # checkpoints' ticks not counted

    folder = tmp_path / "A" / "seed-0" / "sft_compute-lr0.01" / training.RESUME_FOLDER
    with pytest.raises(Cut):
        run(folder, ticking(cut_at=7))  # the clock read at the end of step 5
    newest = training.latest_checkpoint(folder, training.CPU_SPENT_FILE)
    assert newest.name == "checkpoint-4" and in_progress(tmp_path) == [newest]
    assert json.loads((newest / training.CPU_SPENT_FILE).read_text()) == {"cpu_seconds": 4.0}
    resumed: list[int] = []
    steps, weights = run(folder, resumed=resumed)
    assert resumed == [4] and steps == 7 and same_weights(weights, whole)


def test_a_marker_cut_while_it_is_written_leaves_its_checkpoint_incomplete(tmp_path, monkeypatch):
    """The files that mark a checkpoint (or a phase) complete are written whole or not at all: a cut between writing
    and renaming leaves no marker, so the checkpoint before is the one a resumed run goes on from."""
    older, newer = tmp_path / "checkpoint-2", tmp_path / "checkpoint-4"
    for folder in (older, newer):
        folder.mkdir()
    files.write_whole(older / training.CPU_SPENT_FILE, json.dumps({"cpu_seconds": 2.0}))

    def cut(self, target):
        raise Cut

    monkeypatch.setattr(Path, "replace", cut)
    with pytest.raises(Cut):
        files.write_whole(newer / training.CPU_SPENT_FILE, json.dumps({"cpu_seconds": 4.0}))
    monkeypatch.undo()
    assert training.latest_checkpoint(tmp_path, training.CPU_SPENT_FILE) == older


def test_a_run_starting_beside_another_never_reads_the_experiments_settings_half_written(tmp_path, monkeypatch):
    """Two runs on one output folder (one per core) start together and both record the experiment's settings in its
    args.json: while one writes it, the other reads the earlier record whole (or none), never a half-written file
    (it stopped the second run with a JSONDecodeError)."""
    args = cli.parser().parse_args(["--quick"])
    path = tmp_path / "B" / "args.json"
    path.parent.mkdir()
    cli.same_protocol(path, args, experiments.EXPERIMENTS["B"])
    recorded = path.read_text()
    seen: list[str] = []
    write_text = Path.write_text

    def write_with_a_reader_midway(self: Path, text: str) -> int:
        write_text(self, text[: len(text) // 2])
        seen.append(path.read_text())  # the other run, reading the record while this one writes it
        return write_text(self, text)

    monkeypatch.setattr(Path, "write_text", write_with_a_reader_midway)
    cli.same_protocol(path, args, experiments.EXPERIMENTS["B"])
    monkeypatch.undo()
    assert seen == [recorded] and path.read_text() == recorded
    assert [p.name for p in path.parent.iterdir()] == ["args.json"]  # no temporary left behind


def test_a_seed_another_process_is_running_is_skipped(tmp_path, capsys):
    """Two runs on one output folder (one per core) never train the same seed: a seed another process holds is
    skipped, naming that process, whatever arms it would run, and the claim dies with its holder, however it ends."""
    import sys

    out = tmp_path / "runs"
    seed_dir = out / "B" / "seed-0"
    seed_dir.mkdir(parents=True)
    (out / "B" / "canaries.json").write_text("{}")  # not what this test is about
    hold = (
        "import fcntl, os, sys, time\n"
        "claim = open(sys.argv[1], 'a+'); fcntl.flock(claim, fcntl.LOCK_EX); claim.write(str(os.getpid()))\n"
        "claim.flush(); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(seed_dir / cli.CLAIM_FILE)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "held\n"
        cli.main(["--quick", "--experiments", "B", "--seeds", "1", "--out", str(out)])
        assert f"[B seed 0] process {holder.pid} is running it: skipped" in capsys.readouterr().out
        assert not (seed_dir / "log.txt").exists() and not (out / "B" / "seed-0.json").exists()
        arms = ["--arms", "privileged"]  # one arm: the seed's shared phases still belong to the process holding it
        cli.main(["--quick", "--experiments", "B", "--seeds", "1", *arms, "--out", str(out)])
        assert f"[B seed 0] process {holder.pid} is running it: skipped" in capsys.readouterr().out
    finally:
        holder.kill()
        holder.wait()
    with cli.claimed(seed_dir) as other:
        assert other is None
        assert (seed_dir / cli.CLAIM_FILE).read_text() == str(os.getpid())
    assert (seed_dir / cli.CLAIM_FILE).read_text() == ""


def test_a_resumed_warm_start_reads_its_finished_attempts_back(tmp_path, monkeypatch):
    """Each warm-start attempt is saved as it ends: a run cut during a later attempt resumes there, without training
    again an initialisation that already failed its probe (it would fail the same way), and keeps the same best."""
    from benchmarks.learning_rl import seed as seed_module

    args = cli.parser().parse_args(["--quick"])
    for key, value in cli.QUICK.items():
        setattr(args, key, value)
    args.probe_threshold, args.gate, args.warm_attempts = 2.0, 2.0, 2  # no attempt can pass: both run
    first = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path).warm_start()
    assert [a["init_seed"] for a in first["attempts"]] == [0, 1000] and not first["passed"]

    def no_training(*_: object, **__: object) -> None:
        raise AssertionError("a finished attempt was trained again")

    monkeypatch.setattr(seed_module.Seed, "_warm_attempt", no_training)
    again = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path).warm_start()
    assert again["attempts"] == first["attempts"] and again["probes"] == first["probes"]
    assert "finished earlier" in (tmp_path / "B" / "seed-0" / "log.txt").read_text()


def _warm_started_twice(tmp_path: Path) -> tuple[Any, dict[str, Any]]:
    """``--quick``'s settings and experiment B's seed 0 warm-started in two output folders, ``whole`` and ``cut``
    (a run never cut, and one to cut)."""
    from benchmarks.learning_rl import seed as seed_module

    args = cli.parser().parse_args(["--quick"])
    for key, value in cli.QUICK.items():
        setattr(args, key, value)
    seeds = {}
    for name in ("whole", "cut"):
        seeds[name] = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path / name)
        seeds[name].warm_start()
    return args, seeds


def test_a_grpo_run_cut_after_a_checkpoint_goes_on_from_it_to_the_uncut_runs_weights(tmp_path, capsys):
    """A session that ends during GRPO loses only the steps since its last checkpoint: the next run, on a clone that
    has the records and the checkpoint ``--in-progress`` lists, goes on from it, says so, ends with the weights a run
    never cut ends with (envkit train's resume on CPU), adds the cut run's time to its own, and removes the
    checkpoints."""
    from transformers import TrainerCallback

    from benchmarks.learning_rl import arms
    from benchmarks.learning_rl import seed as seed_module

    args, seeds = _warm_started_twice(tmp_path)
    whole = arms.grpo(seeds["whole"], 1e-4)

    class CutAfterTheFirstCheckpoint(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            raise Cut

    with pytest.raises(Cut):
        arms.grpo(seeds["cut"], 1e-4, callbacks=[CutAfterTheFirstCheckpoint()])
    assert _carry(tmp_path / "cut", tmp_path / "clone", capsys) == ["B/seed-0/grpo-lr0.0001/checkpoint-1"]
    clone = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path / "clone")
    out = clone.dir / "grpo-lr0.0001"
    spent_before = json.loads((out / "checkpoint-1" / arms.ELAPSED_FILE).read_text())
    resumed = arms.grpo(clone, 1e-4)

    assert "grpo-lr0.0001: going on from checkpoint-1" in (clone.dir / "log.txt").read_text()
    kept = training.load(out)[0].state_dict()
    assert same_weights(kept, training.load(seeds["whole"].dir / "grpo-lr0.0001")[0].state_dict())
    assert [step for step, _ in resumed["curve"]] == [step for step, _ in whole["curve"]]
    assert resumed["cpu_seconds"] > spent_before["cpu_seconds"] > 0
    assert not list(out.glob("checkpoint-*"))


def test_an_rft_run_cut_after_a_round_goes_on_from_it_on_a_clone(tmp_path, monkeypatch, capsys):
    """A session that ends during RFT loses only the round it was in: ``--in-progress`` lists the run's checkpoint,
    and a clone with it and the records goes on after the last finished round, says so, and ends with the rounds of
    a run never cut."""
    from benchmarks.learning_rl import arms
    from benchmarks.learning_rl import seed as seed_module

    args, seeds = _warm_started_twice(tmp_path)
    whole = arms.rft(seeds["whole"], 1e-4, 8)

    log = seed_module.Seed.log

    def cut_after_round_1(self, text):
        log(self, text)
        if text.startswith("rft-lr0.0001: rft round 1/"):
            raise Cut

    monkeypatch.setattr(seed_module.Seed, "log", cut_after_round_1)
    with pytest.raises(Cut):
        arms.rft(seeds["cut"], 1e-4, 8)
    monkeypatch.setattr(seed_module.Seed, "log", log)
    assert _carry(tmp_path / "cut", tmp_path / "clone", capsys) == ["B/seed-0/rft-lr0.0001/rft-checkpoint"]
    clone = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path / "clone")
    resumed = arms.rft(clone, 1e-4, 8)

    assert "rft-lr0.0001: rft: going on from" in (clone.dir / "log.txt").read_text()
    assert [r["round"] for r in resumed["rounds"]] == [r["round"] for r in whole["rounds"]] == [1, 2]
    assert resumed["env_episodes"] == whole["env_episodes"]
    assert not (clone.dir / "rft-lr0.0001" / "rft-checkpoint").exists()


def test_in_progress_lists_nothing_of_a_finished_rft_run_whose_checkpoint_removal_was_cut(tmp_path):
    from benchmarks.learning_rl import carry
    from envkit.adapters.trl.rft import CHECKPOINT_FOLDER, ROUNDS_FILE

    run = tmp_path / "B" / "seed-0" / "rft-lr0.0001"
    (run / CHECKPOINT_FOLDER).mkdir(parents=True)  # its state.json already removed
    (run / ROUNDS_FILE).write_text("[]")
    assert carry.in_progress(tmp_path) == []


def test_a_warm_start_cut_mid_attempt_goes_on_from_its_last_probe(tmp_path, monkeypatch, capsys):
    """A session that ends during a warm-start attempt loses only the steps since its last probe: the next run, on a
    clone that has the records and the checkpoint ``--in-progress`` lists, goes on from that probe's checkpoint, says
    so, and keeps the weights a run never cut keeps; once the attempt is saved its checkpoints are removed."""

    from benchmarks.learning_rl import seed as seed_module

    args = cli.parser().parse_args(["--quick"])
    for key, value in cli.QUICK.items():
        setattr(args, key, value)
    args.warm_chunk, args.warm_max_steps, args.probe_threshold, args.warm_attempts = 1, 3, 2.0, 1  # to the cap
    whole = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path / "whole").warm_start()

    log = seed_module.Seed.log

    def cut_at_the_second_probe(self, text):
        if text.startswith("warm start: 2 SFT steps"):
            raise Cut
        log(self, text)

    monkeypatch.setattr(seed_module.Seed, "log", cut_at_the_second_probe)
    with pytest.raises(Cut):
        seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path / "cut").warm_start()
    monkeypatch.setattr(seed_module.Seed, "log", log)
    listed = _carry(tmp_path / "cut", tmp_path / "clone", capsys)
    assert listed == [f"B/seed-0/warm-attempt-1/{training.RESUME_FOLDER}/checkpoint-1"]
    resumed = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path / "clone").warm_start()

    folder = tmp_path / "clone" / "B" / "seed-0"
    assert "warm start (attempt 1): going on from its checkpoint after 1 SFT steps" in (folder / "log.txt").read_text()
    assert (resumed["steps"], resumed["probes"]) == (whole["steps"], whole["probes"]) and resumed["steps"] == 3
    kept, expected = (
        training.load(folder / "warm")[0].state_dict(),
        training.load(tmp_path / "whole" / "B" / "seed-0" / "warm")[0].state_dict(),
    )
    assert same_weights(kept, expected)
    assert not (folder / "warm-attempt-1" / training.RESUME_FOLDER).exists()


def test_a_warm_start_that_fails_the_pilot_gate_is_replaced_by_a_fresh_initialisation(tmp_path):
    """An initialisation that passes its probe but solves too little of the hard condition would give GRPO and RFT
    no signal: the gate is part of each warm-start attempt, and decides it — a failed one makes way for a fresh
    initialisation, a passed one is kept even below its probe."""
    from benchmarks.learning_rl import seed as seed_module

    args = cli.parser().parse_args(["--quick"])
    for key, value in cli.QUICK.items():
        setattr(args, key, value)
    args.probe_threshold, args.gate, args.warm_attempts = 0.0, 2.0, 2  # every probe passes, no gate can
    first = seed_module.Seed(experiments.EXPERIMENTS["A"], 0, args, tmp_path).warm_start()
    assert [a["init_seed"] for a in first["attempts"]] == [0, 1000]
    assert first["passed"] and not first["gate"]["passed"] and first["gate"] == first["attempts"][0]["gate"]
    log = (tmp_path / "A" / "seed-0" / "log.txt").read_text()
    assert "warm start (attempt 1) failed the pilot gate; a fresh initialisation" in log

    args.ignore_gate = True  # the gate no longer decides whether the arms run: the probe alone accepts
    ignoring = seed_module.Seed(experiments.EXPERIMENTS["A"], 0, args, tmp_path / "ignoring").warm_start()
    assert [a["init_seed"] for a in ignoring["attempts"]] == [0]

    # The gate decides, not the probe: a warm start that reaches the cap below its probe but passes the gate is kept.
    args.ignore_gate, args.probe_threshold, args.gate = False, 2.0, 0.0
    below_probe = seed_module.Seed(experiments.EXPERIMENTS["A"], 0, args, tmp_path / "below_probe").warm_start()
    assert [a["init_seed"] for a in below_probe["attempts"]] == [0]
    assert not below_probe["passed"] and below_probe["gate"]["passed"]


def _keep_only_attempt_records(folder: Path) -> None:
    """Remove everything in a seed's ``folder`` but its warm-start attempts' records and its log."""
    for path in sorted(folder.rglob("*"), reverse=True):
        if path.is_file() and path.name not in ("attempt.json", "log.txt"):
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def test_a_clone_with_only_the_attempt_records_trains_only_the_kept_attempt_again(tmp_path, monkeypatch):
    """The runs' records are kept with the repository and their weights are not: on a fresh clone a seed's warm start
    reads the attempts that failed from their records, trains again only the attempt it keeps (training is
    deterministic, and the quick runs' evaluations reproduce, so it gets the recorded probes and gate back) and goes
    on from there."""
    from benchmarks.learning_rl import seed as seed_module

    args = cli.parser().parse_args(["--quick"])
    for key, value in cli.QUICK.items():
        setattr(args, key, value)
    args.probe_threshold, args.gate, args.warm_attempts = 2.0, 2.0, 2  # none passes: the best probe is kept
    first = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path).warm_start()
    folder = tmp_path / "B" / "seed-0"
    _keep_only_attempt_records(folder)  # what a clone has: the attempts' records and the log
    assert sorted(p.name for p in folder.rglob("*") if p.is_file()) == ["attempt.json", "attempt.json", "log.txt"]

    trained = []
    warm_attempt = seed_module.Seed._warm_attempt

    def counted(self: seed_module.Seed, attempt: int, *rest: object) -> object:
        trained.append(attempt)
        return warm_attempt(self, attempt, *rest)

    monkeypatch.setattr(seed_module.Seed, "_warm_attempt", counted)
    again = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path).warm_start()
    assert trained == [first["kept_attempt"] - 1]
    assert {k: v for k, v in again.items() if k != "attempts"} == {k: v for k, v in first.items() if k != "attempts"}
    log = (folder / "log.txt").read_text()
    assert "its weights are not here; training it again" in log and "differs from its record" not in log


def test_a_kept_attempt_trained_again_is_judged_again_and_makes_way_if_it_now_fails(tmp_path, monkeypatch):
    """Training is not reproducible across machines, so the attempt a clone trains again (its record passed, its
    weights were not kept) is another model: its new gate decides, and one that now fails makes way for a fresh
    initialisation, as it would have the first time."""
    from benchmarks.learning_rl import seed as seed_module

    args = cli.parser().parse_args(["--quick"])
    for key, value in cli.QUICK.items():
        setattr(args, key, value)
    args.probe_threshold, args.gate, args.warm_attempts = 0.0, 0.0, 2  # every attempt passes: the first is kept
    first = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path).warm_start()
    assert first["kept_attempt"] == 1 and [a["init_seed"] for a in first["attempts"]] == [0]
    folder = tmp_path / "B" / "seed-0"
    _keep_only_attempt_records(folder)  # what a clone had before git kept the warm start's weights

    gate = seed_module.Seed._gate
    gates = iter([{"needed": 0.0, "mean_score": 0.0, "solved": 0.0, "passed": False}])  # this machine's model fails

    def gated(self: seed_module.Seed, *rest: object) -> object:
        return next(gates, None) or gate(self, *rest)

    monkeypatch.setattr(seed_module.Seed, "_gate", gated)
    again = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path).warm_start()
    assert [a["init_seed"] for a in again["attempts"]] == [0, 1000] and again["kept_attempt"] == 2
    assert not again["attempts"][0]["gate"]["passed"] and again["gate"]["passed"]
    assert not json.loads((folder / "warm-attempt-1" / "attempt.json").read_text())["gate"]["passed"]  # replaced
    log = (folder / "log.txt").read_text()
    assert "warm start (attempt 1): its weights are not here; training it again" in log
    assert "warm start (attempt 1) trained again: its gate" in log
    assert "warm start (attempt 1) failed the pilot gate; a fresh initialisation" in log


def test_arms_runs_only_those_arms_and_a_later_run_finishes_the_seed(tmp_path, capsys):
    """``--arms`` runs a pilot of some arms: their phases are saved, the seed's JSON waits for the rest, and a later
    run without it runs only the arms still missing. RFT and the compute-matched SFT are matched to GRPO's run, so
    asking for them without GRPO stops at once with one line."""
    out = tmp_path / "out"
    pilot = ["--quick", "--experiments", "B", "--gate", "1.0", "--ignore-gate", "--out", str(out)]
    pilot += ["--learning-rates", "1e-4"]  # one rate: the search is not what this test is about
    cli.main([*pilot, "--arms", "privileged"])
    folder = out / "B" / "seed-0"
    assert (folder / "privileged-lr0.0001.json").exists() and (folder / "eval-privileged-lr0.0001.json").exists()
    assert not (folder / "grpo-lr0.0001.json").exists() and not (out / "B" / "seed-0.json").exists()
    assert "--arms privileged done; seed-0.json waits for the rest" in capsys.readouterr().out
    results = (out / "results.md").read_text()  # not an empty report: B's section says why
    assert "## Experiment B: " in results and "No seed has finished yet (a seed's JSON is written once every" in results
    privileged = (folder / "privileged-lr0.0001.json").read_text()
    cli.main(pilot)
    result = json.loads((out / "B" / "seed-0.json").read_text())
    assert set(result["eval"]) == set(experiments.MODELS) and "partial" not in result
    assert (folder / "privileged-lr0.0001.json").read_text() == privileged  # not trained again
    with pytest.raises(SystemExit, match="matched to GRPO's run: add grpo to --arms"):
        cli.main([*pilot, "--arms", "rft"])


def test_a_fresh_clone_goes_on_from_the_finished_phases_and_trains_only_an_arm_not_yet_evaluated(
    tmp_path, monkeypatch, capsys
):
    """Git keeps each finished phase of a seed and its warm start's weights, not an arm's weights, and an arm is
    evaluated as soon as it is kept: a clone of a seed cut part-way goes on without training its warm start or an
    evaluated arm again; an arm trained but not yet evaluated when the run was cut is trained again, and says so."""
    from benchmarks.learning_rl import arms as arms_module
    from benchmarks.learning_rl import seed as seed_module

    out, clone = tmp_path / "out", tmp_path / "clone"
    run = ["--quick", "--experiments", "B", "--gate", "1.0", "--ignore-gate", "--seed-offset", "1"]
    chosen = {arm: 1e-4 for arm in experiments.ARMS}
    record = {"seed": 0, "learning_rates": [1e-4, 5e-4], "rule": search.RULE, "validation": {}, "chosen": chosen}
    (out / "B").mkdir(parents=True)
    (out / "B" / "search.json").write_text(json.dumps(record))
    cli.main([*run, "--out", str(out), "--arms", "grpo", "rft"])
    _copy(_kept_by_git(out), out, clone)  # what a clone of the repository holds
    folder = clone / "B" / "seed-1"
    assert (folder / "warm" / "model.safetensors").exists() and (folder / "rft-lr0.0001.json").exists()
    assert not (folder / "grpo-lr0.0001").exists() and not (folder / "rft-lr0.0001").exists()
    (folder / "eval-rft-lr0.0001.json").unlink()  # the run was cut after RFT trained, before it was evaluated

    def no_warm_start(*_: object, **__: object) -> None:
        raise AssertionError("the warm start was trained again")

    trained: list[float] = []
    rft = arms_module.rft
    monkeypatch.setattr(seed_module.Seed, "_warm_attempt", no_warm_start)
    monkeypatch.setattr(arms_module, "grpo", lambda *_: no_warm_start())
    monkeypatch.setattr(
        arms_module, "rft", lambda seed, rate, episodes: trained.append(rate) or rft(seed, rate, episodes)
    )
    capsys.readouterr()
    cli.main([*run, "--out", str(clone), "--arms", "grpo", "rft"])
    assert trained == [1e-4] and (folder / "eval-rft-lr0.0001.json").exists()
    assert "rft-lr0.0001: its weights are not here for eval-rft-lr0.0001; training it again" in capsys.readouterr().out
    cli.main([*run, "--out", str(clone), "--arms", "grpo", "rft"])  # both evaluated: nothing to train
    assert trained == [1e-4]


def test_the_best_validation_score_chooses_the_rate_and_a_tie_goes_to_the_smaller_rate():
    assert search.best_rate({1e-4: 0.2, 5e-4: 0.5}) == 5e-4
    assert search.best_rate({5e-4: 0.0, 1e-4: 0.0, 3e-4: 0.0}) == 1e-4  # two collapsed runs: the smaller step
    assert search.run_name("sft_compute", 1e-4) == "sft_compute-lr0.0001"


def test_other_seeds_run_each_arm_at_the_rate_the_search_kept_and_wait_for_it(tmp_path):
    """A seed that is not the search seed runs each arm once, at the rate ``search.json`` records (here one the quick
    runs would not choose by themselves), with no validation runs; before the search seed has chosen every arm it runs,
    its arms stop with one line naming the seed to run first (its warm start, which needs no rate, is kept), and a
    ``search.json`` of another seed than ``--search-seed`` stops it too."""
    out = tmp_path / "out"
    run = ["--quick", "--experiments", "B", "--gate", "1.0", "--ignore-gate", "--out", str(out), "--seed-offset", "1"]
    with pytest.raises(SystemExit, match=r"has not chosen for grpo, rft, .*: run seed 0 first") as stopped:
        cli.main(run)
    assert "\n" not in str(stopped.value) and not list((out / "B" / "seed-1").glob("*-lr*"))  # no arm ran
    assert (out / "B" / "seed-1" / "warm_start.json").exists()  # the warm start needs no rate: it is saved for later
    chosen = {"grpo": 5e-4, "rft": 1e-4}
    record = {"seed": 0, "learning_rates": [1e-4, 5e-4], "rule": search.RULE, "validation": {}, "chosen": chosen}
    (out / "B" / "search.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit, match=r"has not chosen for sft_plateau, sft_compute, privileged: run seed 0"):
        cli.main(run)  # an arm still unchosen stops it too
    cli.main([*run, "--arms", "grpo"])  # a pilot of the arm the search has chosen for
    folder = out / "B" / "seed-1"
    assert {p.name for p in folder.iterdir() if p.is_dir() and "-lr" in p.name} == {"grpo-lr0.0005"}
    assert (folder / "eval-grpo-lr0.0005.json").exists() and not list(folder.glob("validation-*"))
    (out / "B" / "search.json").write_text(json.dumps({**record, "seed": 3}))
    with pytest.raises(SystemExit, match=r"holds the search of seed 3, not of --search-seed 0: run with --search"):
        cli.main([*run[:-1], "2"])


def test_a_compute_matched_run_saved_against_another_grpo_run_stops_the_seed(tmp_path):
    """The compute-matched SFT's budget is the CPU time of the seed's kept GRPO run: a record matched to another one
    (saved before the search chose) is not reused silently; the seed stops with one line naming the file."""
    from benchmarks.learning_rl import seed as seed_module

    args = cli.parser().parse_args(["--quick"])
    seed = seed_module.Seed(experiments.EXPERIMENTS["B"], 0, args, tmp_path)
    seed._check_matched({1e-4: {"matched_to": "grpo-lr0.0001"}}, "grpo-lr0.0001")  # matched to the kept run
    with pytest.raises(SystemExit, match=r"sft_compute-lr0\.0005\.json was matched to grpo-lr0\.0005's CPU time"):
        seed._check_matched({5e-4: {"matched_to": "grpo-lr0.0005"}}, "grpo-lr0.0001")


def test_the_report_says_which_sft_arm_stopped_at_its_cap_still_improving():
    """An SFT-to-plateau arm whose best validation is its last checkpoint at the cap is not at a plateau: the report
    names it; one that stopped after its patience is not named, and one that never beat its start is named as having
    kept the warm start."""
    capped = {"best_step": 1200, "steps": 1200, "learning_rate": 1e-4}
    run = {"sft_plateau": capped, "privileged": {"best_step": 750, "steps": 1050, "learning_rate": 5e-4}}
    assert report._capped(run) == ["sft_plateau"]
    assert report._capped({"privileged": {"best_step": 0, "steps": 300}}) == []
    # One that never beat its start kept the warm start: named too, as such.
    assert report._kept_start({"privileged": {"best_step": 0, "steps": 300}, "sft_plateau": capped}) == ["privileged"]
    assert report._rates(run) == "; learning rates: sft_plateau 0.0001, privileged 0.0005"
    assert report._rates({"grpo": {"curve": []}}) == ""  # a seed run before the search
