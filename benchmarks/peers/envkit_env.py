"""The benchmark's calculator + submit env in envkit's idiom: a :class:`envkit.ToolEnv` with ``@envkit.tool`` methods.

``envkit sft benchmarks/peers/envkit_env.py:CalculatorEnv`` warm-starts the benchmark's model on its oracle, so every
arm's model has learned this conversation shape (see :mod:`peers_common`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers_common as common

import envkit


class CalculatorEnv(envkit.ToolEnv):
    """Solve ``a * b + c``-style problems with ``calculator``, then ``submit_answer``, then say done."""

    max_turns: ClassVar[int] = 4
    faults: ClassVar[bool] = False
    """Inject :mod:`peers_common`'s tool faults (the fault run uses :class:`FaultyCalculatorEnv`)."""

    def __init__(self) -> None:
        super().__init__()
        self.task: dict[str, Any] = {}
        self.submitted: float | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[envkit.Message], dict[str, Any]]:
        """The problem of task ``seed``."""
        super().reset(seed=seed, options=options)
        self.task = common.make_task(int(seed or 0), faults=self.faults)
        self.submitted = None
        return [
            {"role": "system", "content": common.SYSTEM_PROMPT},
            {"role": "user", "content": self.task["question"]},
        ], {}

    @envkit.tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: Integers with + - * and parentheses, e.g. "12 * 7 + 3".
        """
        try:
            return common.run_calculator(self.task, expression)
        except ValueError as error:
            raise envkit.ToolError(str(error)) from None

    @envkit.tool
    def submit_answer(self, answer: float) -> str:
        """Submit the final numeric answer.

        Args:
            answer: The answer as a number, e.g. 87.
        """
        self.submitted = answer
        return common.submitted_text(answer)

    def score(self) -> float:
        """1.0 when the submitted answer is right, else 0.0."""
        return float(common.is_correct(self.submitted, self.task))

    def oracle(self) -> envkit.Message | None:
        """Calculate, submit, then say done."""
        used = {m.get("name") for m in self.messages if m["role"] == "tool"}
        if "calculator" not in used:
            name, arguments = "calculator", {"expression": self.task["expression"]}
        elif "submit_answer" not in used:
            name, arguments = "submit_answer", {"answer": self.task["answer"]}
        else:
            return {"role": "assistant", "content": "Done."}
        call = {"type": "function", "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "content": "", "tool_calls": [call]}


class FaultyCalculatorEnv(CalculatorEnv):
    """:class:`CalculatorEnv` with :mod:`peers_common`'s injected faults (raising and hung calculator calls)."""

    faults: ClassVar[bool] = True
