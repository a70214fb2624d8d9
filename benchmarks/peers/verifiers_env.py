"""The benchmark's calculator + submit env in verifiers' idiom: a ``vf.StatefulToolEnv`` with plain Python functions
as tools, a dataset of ``question`` / ``answer`` / ``info`` rows and a ``vf.Rubric``.

``StatefulToolEnv`` is verifiers' way to give tools per-rollout state: the hidden arguments (``task``, ``state``) are
left out of the schemas the model sees and filled in by :meth:`CalculatorToolEnv.update_tool_args`. The tools are
synchronous, as in verifiers' examples; verifiers calls them on its event loop.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers_common as common
import verifiers as vf


def calculator(expression: str, task: dict) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: Integers with + - * and parentheses, e.g. "12 * 7 + 3".
    """
    return common.run_calculator(task, expression)


def submit_answer(answer: float, state: dict) -> str:
    """Submit the final numeric answer.

    Args:
        answer: The answer as a number, e.g. 87.
    """
    state["submitted"] = answer
    return common.submitted_text(answer)


async def correct_answer(state: vf.State, info: dict, **kwargs: Any) -> float:
    """1.0 when the submitted answer is right, else 0.0."""
    return float(common.is_correct(state.get("submitted"), info))


class CalculatorToolEnv(vf.StatefulToolEnv):
    """Solve ``a * b + c``-style problems with ``calculator``, then ``submit_answer``, then say done."""

    def __init__(self, tasks: list[dict[str, Any]], max_turns: int, timeout_s: float | None = None) -> None:
        from datasets import Dataset

        dataset = Dataset.from_list([{"question": t["question"], "answer": str(t["answer"]), "info": t} for t in tasks])
        super().__init__(
            dataset=dataset,
            system_prompt=common.SYSTEM_PROMPT,
            rubric=vf.Rubric(funcs=[correct_answer]),
            max_turns=max_turns,
            timeout_seconds=timeout_s,
        )
        self.add_tool(calculator, args_to_skip=["task"])
        self.add_tool(submit_answer, args_to_skip=["state"])

    def update_tool_args(
        self, tool_name: str, tool_args: dict, messages: vf.Messages, state: vf.State, **kwargs: Any
    ) -> dict:
        """Hand ``calculator`` its task and ``submit_answer`` the rollout state."""
        if tool_name == "calculator":
            tool_args["task"] = state["info"]
        elif tool_name == "submit_answer":
            tool_args["state"] = state
        return tool_args
