"""Smoke test of benchmarks/peers.py (envkit vs verifiers vs TRL on one server): the shared task, each arm's env in
its own library's idiom, the fidelity check and the results table. The timed arms need a vLLM server and minutes;
they run from the benchmark itself. The verifiers env is checked in ``.venv-verifiers`` when it exists
(``bash scripts/setup_verifiers.sh``), else that test skips and says so."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "benchmarks" / "peers"
sys.path.insert(0, str(PEERS))

import peers_common as common  # noqa: E402


def load_driver():
    spec = importlib.util.spec_from_file_location("benchmark_peers", ROOT / "benchmarks" / "peers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_tasks_are_the_same_for_every_arm_and_faults_are_injected():
    assert common.make_task(3) == common.make_task(3)
    task = common.make_task(5)
    assert common.calculate_value(task["expression"]) == task["answer"]
    assert common.calculate_value("12 * (3 + 4) - -2") == 86
    with pytest.raises(ValueError, match="unsupported"):
        common.calculate_value("__import__('os')")
    faulty = [common.make_task(seed, faults=True)["fault"] for seed in range(16)]
    assert faulty.count("raise") == 2 and faulty.count("hang") == 2
    with pytest.raises(RuntimeError, match="injected"):
        common.run_calculator({"fault": "raise"}, "1 + 1")
    assert common.run_calculator({"fault": "none"}, "2 * 3") == "6"


def test_envkit_env_oracle_solves_every_task(local_tokenizer):
    from envkit_env import CalculatorEnv

    from envkit.demos import oracle_episodes

    episodes = oracle_episodes(CalculatorEnv, local_tokenizer, list(range(4)))
    assert len(episodes) == 4  # every oracle episode scored 1.0
    assert all(e.turns == 3 and e.num_tool_calls == 2 for e in episodes)
    assert episodes[0].messages[-1] == {"role": "assistant", "content": "Done."}


def test_trl_env_shows_the_model_the_same_tool_schemas_as_envkit():
    from envkit_env import CalculatorEnv
    from transformers.utils import get_json_schema
    from trl_env import CalculatorEnvironment

    environment = CalculatorEnvironment()
    trl_tools = [get_json_schema(environment.calculator), get_json_schema(environment.submit_answer)]
    assert trl_tools == CalculatorEnv().tools  # the same prompt tokens in both arms
    task = common.make_task(7)
    environment.reset(prompt=[], **task)
    assert environment.calculator(task["expression"]) == str(task["answer"])
    assert environment.get_reward() == 0.0
    environment.submit_answer(task["answer"])
    assert environment.get_reward() == 1.0


def test_fidelity_counts_turns_the_server_did_not_generate():
    driver = load_driver()
    generated = {(1, 2, 3), (4, 5)}
    result = {"model_turns": [[[1, 2, 3], [4, 5]], [[1, 2, 3], [4, 6]]]}
    assert driver.fidelity(result, generated) == {"exact_fraction": 0.5, "differing_turns": 1, "model_turns": 4}
    result["rerender_bad_steps"] = [1, 0]  # verifiers: the first episode's next prompt re-tokenized a turn
    assert driver.fidelity(result, generated)["exact_fraction"] == 0.0


def test_summary_reports_median_and_spread_per_arm():
    driver = load_driver()
    row = {"arm": "envkit OpenAIBackend", "arm_key": "envkit", "episodes": 8, "generated_tokens": 80, "turns": 16}
    data = {
        "throughput": [{**row, "wall_s": w, "cpu_s": 0.16, "mean_score": 0.5} for w in (1.0, 2.0, 4.0)]
        + [{"arm": "trl", "arm_key": "trl", "failed": "Traceback ...\nRuntimeError: boom"}],
        "fidelity": [
            {**row, "arm_key": "envkit", "fidelity": {"exact_fraction": 1.0, "differing_turns": 0, "model_turns": 16}}
        ],
    }
    table = driver.summarize(data)
    assert "| envkit OpenAIBackend | 4.00 (2.00–8.00) | 40 (20–80) | 10.0 (10.0–10.0) |" in table
    assert "100% (0/16 turns differ)" in table
    assert "failed: trl: RuntimeError: boom" in table


def test_missing_peer_venv_names_its_setup_script(monkeypatch, tmp_path):
    driver = load_driver()
    monkeypatch.setenv("ENVKIT_VERIFIERS_VENV", str(tmp_path / "absent"))
    assert "bash scripts/setup_verifiers.sh" in driver.missing_arm("verifiers")


def test_verifiers_env_in_its_own_venv():
    driver = load_driver()
    why = driver.missing_arm("verifiers")
    if why:
        pytest.skip(f"verifiers arm not checked: {why}")
    script = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); import peers_common as common; "
        "from verifiers_env import CalculatorToolEnv; "
        "env = CalculatorToolEnv([common.make_task(0)], max_turns=4); "
        "print(json.dumps(sorted(t.name for t in env.tool_defs)))"
    )
    done = subprocess.run(
        [str(driver.arm_python("verifiers")), "-c", script, str(PEERS)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["calculator", "submit_answer"]
