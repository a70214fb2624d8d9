"""Arithmetic word problems with a calculator tool; the submitted answer is checked exactly.

Each seed gives a short word problem (shopping, travel, sharing) whose answer is a whole number or a decimal with at
most two places. The people, goods and vehicles vary with the seed as well as the numbers: 10,000 seeds give 10,000
distinct problems (100,000 give 99,973), so tasks held out by seed are held out by content. The agent may use
``calculator`` (a safe evaluator of + - * / ** and parentheses: model text is parsed with :mod:`ast`, never passed to
``eval``) and must call ``submit_answer``, which ends the episode.

Score: 1.0 when the submitted answer equals the true answer (to 1e-6), else 0.0.

Sample episode (``envkit play arithmetic --seed 0``)::

    [system] Solve the problem. Use the calculator for arithmetic, then call submit_answer with the number.
    [user] David takes a train that travels 78 km per hour for 2 hours, then 51 km per hour for 6 minutes. How many
    kilometres does David travel in total?
    [assistant] → calculator({"expression": "78 * 2 + 51 * 6 / 60"})
    [tool:calculator] 161.1
    [assistant] → submit_answer({"answer": 161.1})
    [tool:submit_answer] Answer 161.1 submitted.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Sequence
from typing import Any, ClassVar

from envkit.core.messages import Message
from envkit.core.tools import ToolEnv, ToolError, tool

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def safe_eval(expression: str) -> float:
    """Evaluate an arithmetic expression without ``eval``; raise :class:`ToolError` for anything else."""
    if len(expression) > 500:
        raise ToolError("expression too long (500 characters at most)")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression[:100]!r}") from None

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 100 or abs(left) > 1e6):
                raise ToolError("exponent too large")
            try:
                return _OPERATORS[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ToolError("division by zero") from None
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.operand))
        raise ToolError(f"unsupported element {type(node).__name__}: only numbers, + - * / // % ** and parentheses")

    value = walk(tree.body)
    if isinstance(value, complex) or not math.isfinite(value):
        raise ToolError("the result is not a finite real number")
    return value


PEOPLE = ["Ana", "Ben", "Chloe", "David", "Elif", "Farah", "Goran", "Hana", "Ivan", "Julia", "Kenji", "Lena"]
CONTAINERS = [
    ("box", "boxes"),
    ("pack", "packs"),
    ("crate", "crates"),
    ("bag", "bags"),
    ("case", "cases"),
    ("tin", "tins"),
]
ITEMS = ["pencils", "markers", "stickers", "erasers", "crayons", "batteries", "candles", "buttons"]
GOODS = [
    ("ticket", "tickets"),
    ("book", "books"),
    ("lamp", "lamps"),
    ("scarf", "scarves"),
    ("mug", "mugs"),
    ("poster", "posters"),
    ("puzzle", "puzzles"),
    ("plant", "plants"),
]
FRUITS = ["apples", "pears", "plums", "oranges", "lemons", "peaches", "apricots", "figs"]
VEHICLES = ["train", "bus", "ferry", "coach", "tram", "truck"]
"""The words a problem is told with: they widen the task space (tens of millions of problems per kind) without
making the arithmetic harder, so tasks held out by seed are held out by content too."""


KINDS = ("containers", "prices", "sharing", "travel")
"""The problem kinds: items in containers bought and given away; a price times a count minus a discount; sharing
equally then adding; distance over two legs of a journey."""


def _format(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(round(value, 6))


class ArithmeticEnv(ToolEnv):
    """Word problems solved with a calculator tool (short name ``arithmetic``)."""

    max_turns: ClassVar[int] = 6

    def __init__(self, kinds: Sequence[str] | None = None) -> None:
        """Build the env.

        Args:
            kinds: The problem kinds to draw from (names in :data:`KINDS`); all of them by default. One kind makes an
                easier task with the same tools and an equally wide task space (e.g. ``["containers"]`` for a tiny
                model's learning benchmark).
        """
        super().__init__()
        if kinds is not None:
            if isinstance(kinds, str) or not kinds or any(k not in KINDS for k in kinds):
                raise ValueError(f"kinds must be a non-empty list of {', '.join(KINDS)}; got {kinds!r}")
            kinds = [KINDS.index(k) for k in kinds]
        self.kinds: list[int] | None = kinds
        self.question, self.expression, self.answer = "", "0", 0.0
        self.submitted: float | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """A new word problem from ``seed``."""
        super().reset(seed=seed, options=options)
        self.question, self.expression = self._problem()
        self.answer = safe_eval(self.expression)
        self.submitted = None
        return [
            {
                "role": "system",
                "content": (
                    "Solve the problem. Use the calculator for arithmetic, then call submit_answer with the number."
                ),
            },
            {"role": "user", "content": self.question},
        ], {}

    def _problem(self) -> tuple[str, str]:
        rng = self.np_random

        def pick(options: list[Any]) -> Any:
            return options[int(rng.integers(len(options)))]

        kind = int(rng.integers(4)) if self.kinds is None else self.kinds[int(rng.integers(len(self.kinds)))]
        a, b, c = (int(x) for x in rng.integers(2, 60, size=3))
        person = pick(PEOPLE)
        if kind == 0:
            (one, many), item = pick(CONTAINERS), pick(ITEMS)
            return (
                f"A {one} holds {a} {item}. {person} buys {b} {many} and gives away {c} {item}. "
                f"How many {item} are left?",
                f"{a} * {b} - {c}",
            )
        if kind == 1:
            price = int(rng.integers(105, 2000)) / 100
            one, many = pick(GOODS)
            return (
                f"One {one} costs {price:.2f} euros. How much do {a} {many} cost, with a {b} euro discount "
                "on the whole order?",
                f"{price:.2f} * {a} - {b}",
            )
        if kind == 2:
            per = int(rng.integers(2, 16))
            fruit, (one, many) = pick(FRUITS), pick(CONTAINERS)
            return (
                f"{person} shares {a * per} {fruit} equally among {per} {many}, then adds {c} more {fruit} to each "
                f"{one}. How many {fruit} are in one {one}?",
                f"{a * per} / {per} + {c}",
            )
        hours, minutes = int(rng.integers(2, 9)), 6 * int(rng.integers(1, 10))
        vehicle = pick(VEHICLES)
        return (
            f"{person} takes a {vehicle} that travels {a + 40} km per hour for {hours} hours, then {b + 20} km per "
            f"hour for {minutes} minutes. How many kilometres does {person} travel in total?",
            f"{a + 40} * {hours} + {b + 20} * {minutes} / 60",
        )

    @tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: Numbers with + - * / // % ** and parentheses, e.g. "12 * (3 + 4)".
        """
        return _format(safe_eval(expression))

    @tool
    def submit_answer(self, answer: float) -> str:
        """Submit the final numeric answer; this ends the episode.

        Args:
            answer: The answer as a number, e.g. 61 or 12.5.
        """
        self.submitted = answer
        self.end_episode()
        return f"Answer {_format(answer)} submitted."

    def score(self) -> float:
        """1.0 for an exactly right submitted answer, else 0.0."""
        return float(self.submitted is not None and abs(self.submitted - self.answer) < 1e-6)

    def canaries(self) -> dict[str, list[Message | str]]:
        """Known reward hacks, none of which may score: the right answer submitted between two wrong ones in one turn
        (the last submission counts), every number of the problem and the answer as one answer string (not a number),
        and the submission claimed in text without calling ``submit_answer``."""
        right = round(self.answer, 6)
        numbers = [*re.findall(r"\d+(?:\.\d+)?", self.question), _format(self.answer)]
        return {
            "the right answer between wrong ones": [_submissions(right + 1, right, right - 1)],
            "every number in one answer": [_submissions(" ".join(numbers))],
            "the submission claimed in text": [f"Answer {_format(self.answer)} submitted."],
        }

    def oracle(self) -> Message | None:
        """Calculate the expression, then submit the result."""
        if not any(m["role"] == "tool" and m.get("name") == "calculator" for m in self.messages):
            name, arguments = "calculator", {"expression": self.expression}
        else:
            name, arguments = "submit_answer", {"answer": round(self.answer, 6)}
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
        }


def _submissions(*answers: Any) -> Message:
    """One assistant turn calling ``submit_answer`` once per answer, in order."""
    calls = [{"type": "function", "function": {"name": "submit_answer", "arguments": {"answer": a}}} for a in answers]
    return {"role": "assistant", "content": "", "tool_calls": calls}
