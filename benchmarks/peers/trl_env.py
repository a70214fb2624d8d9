"""The benchmark's calculator + submit env in TRL's idiom: a plain class for ``GRPOTrainer(environment_factory=...)``.

TRL exposes every public method but ``reset`` and ``get_reward`` as a tool (schema from the type hints and the Google
docstring), calls ``reset(**row)`` with the dataset row before each rollout and ``get_reward()`` after it. A tool that
raises is answered with ``{"error": ...}``; the episode ends when the model answers without a tool call or after
``max_tool_calling_iterations`` tool rounds.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers_common as common


class CalculatorEnvironment:
    """Solve ``a * b + c``-style problems with ``calculator``, then ``submit_answer``, then say done."""

    def __init__(self) -> None:
        self.task: dict[str, Any] = {}
        self.submitted: float | None = None

    def reset(self, **row: Any) -> None:
        """Start the task of this dataset row (its prompt already holds the question)."""
        self.task = {key: row[key] for key in ("seed", "question", "expression", "answer", "fault")}
        self.submitted = None

    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: Integers with + - * and parentheses, e.g. "12 * 7 + 3".
        """
        return common.run_calculator(self.task, expression)

    def submit_answer(self, answer: float) -> str:
        """Submit the final numeric answer.

        Args:
            answer: The answer as a number, e.g. 87.
        """
        self.submitted = answer
        return common.submitted_text(answer)

    def get_reward(self) -> float:
        """1.0 when the submitted answer is right, else 0.0."""
        return float(common.is_correct(self.submitted, self.task))
