"""The two benchmark envs of ``benchmarks/learning_rl`` (benchmark-only: not registered, not in ``envs/``).

- :class:`FlakyArithmeticEnv` — experiment A: the built-in ``arithmetic`` env whose ``calculator`` fails with
  probability ``fail_p`` (an error that repeats the expression and says to call it again). Its oracle retries
  after a failure.
- :class:`ChainEnv` — experiment B: a start value and ``k`` operations; the calculator takes one binary operation at
  a time (so a chain of ``k`` operations takes ``k`` calls), then ``submit_answer``. Task seeds pick ``k`` from
  ``depths`` and the operations so that no two adjacent operations form an ``excluded_pairs`` pair (training), or so
  that at least one does (``require_pair``: held-out tasks with operation pairs never adjacent in training).

Both load by path, as any env class does: ``envkit train --env benchmarks/learning_rl/envs.py:ChainEnv``.
"""

from __future__ import annotations

import ast
import hashlib
import itertools
import random
from collections.abc import Sequence
from typing import Any, ClassVar

from envkit.core.messages import Message
from envkit.core.tools import ToolEnv, ToolError, tool
from envkit.envs.arithmetic import ArithmeticEnv, _format, safe_eval

FAILURE_MARKER = "calculator temporarily unavailable"
"""The start of what a failed calculator call answers (as ``Error: ...``); :func:`failure_message` is all of it."""


def failure_message(expression: str) -> str:
    """What a failed calculator call answers: the failure, the expression it was given, and to call again. The echo
    keeps the numbers a retry needs next to it, as many real tools' errors do: a 2-layer model cannot copy them from
    the problem past the failed call (an earlier version without it: even SFT on demonstrations of retries retried
    with wrong numbers)."""
    return f"{FAILURE_MARKER} for {expression}, please call it again"


class FlakyArithmeticEnv(ArithmeticEnv):
    """``arithmetic`` with a calculator that fails with probability ``fail_p`` per call.

    Whether the n-th calculator call of a task fails is a function of the task seed, n and ``failure_seed``: the
    failures are independent of the problem and across calls, and a replay of the same episode (the oracle's
    replicas, a rerun) meets the same failures. Every episode of one task therefore meets the same failure pattern:
    samples of a task differ in what the model does about it.
    """

    max_turns: ClassVar[int] = 6

    def __init__(
        self, kinds: Sequence[str] | None = ("containers",), fail_p: float = 0.0, failure_seed: int = 0
    ) -> None:
        """Args:
        kinds: The arithmetic problem kinds (see :class:`~envkit.envs.arithmetic.ArithmeticEnv`).
        fail_p: Probability that one calculator call fails.
        failure_seed: Seed of the failure pattern (another seed, other failures on the same tasks).
        """
        super().__init__(kinds=list(kinds) if kinds is not None else None)
        if not 0.0 <= fail_p < 1.0:
            raise ValueError(f"fail_p must be in [0, 1), got {fail_p}")
        self.fail_p, self.failure_seed = fail_p, failure_seed
        self.task_key: int = 0
        self.calls = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """A new word problem from ``seed`` (and its failure pattern)."""
        self.task_key = seed if seed is not None else random.getrandbits(62)
        self.calls = 0
        return super().reset(seed=seed, options=options)

    def fails(self) -> bool:
        """Whether the next calculator call fails (counts the call)."""
        self.calls += 1
        digest = hashlib.blake2b(repr((self.failure_seed, self.task_key, self.calls)).encode(), digest_size=8)
        return int.from_bytes(digest.digest(), "big") / 2**64 < self.fail_p

    @tool
    def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression.

        Args:
            expression: Numbers with + - * / // % ** and parentheses, e.g. "12 * (3 + 4)".
        """
        if self.fails():
            raise ToolError(failure_message(expression))
        return _format(safe_eval(expression))

    def oracle(self) -> Message | None:
        """Call the calculator until it answers, then submit the result."""
        answered = [m for m in self.messages if m["role"] == "tool" and m.get("name") == "calculator"]
        if not answered or str(answered[-1].get("content", "")).startswith("Error"):
            return _call("calculator", {"expression": self.expression})
        return _call("submit_answer", {"answer": round(self.answer, 6)})


OPERATIONS = {"add": ("add", "+"), "subtract": ("subtract", "-"), "multiply": ("multiply by", "*")}
"""Operation name → (its words in the question, its operator)."""

HELD_OUT_PAIRS: tuple[tuple[str, str], ...] = (("multiply", "subtract"), ("subtract", "multiply"))
"""Ordered operation pairs never adjacent in training chains (the held-out split's unseen compositions)."""


class ChainEnv(ToolEnv):
    """A chain of ``k`` arithmetic operations on a start value, one calculator call each, then the answer."""

    max_turns: ClassVar[int] = 9

    def __init__(
        self,
        depths: Sequence[int] = (1, 2),
        excluded_pairs: Sequence[Sequence[str]] = HELD_OUT_PAIRS,
        require_pair: bool = False,
        depth_weights: Sequence[float] | None = None,
        numbered: bool = False,
        announce_next: bool = False,
    ) -> None:
        """Args:
        depths: The chain lengths ``k`` a task seed draws from (1 to 7).
        excluded_pairs: Ordered operation pairs that may not be adjacent (with ``require_pair``: one of them must).
        require_pair: Build chains containing at least one ``excluded_pairs`` pair (needs depth 2 or more).
        depth_weights: How often each of ``depths`` is drawn (normalised); ``None``: equally often.
        numbered: Number the steps in the question (``Step 2: multiply by 3.``) and have the calculator say which
            step its answer completes (``Step 2 done: 66``, counting answered calls): the next operation is then found
            by its number instead of by counting the calls made so far.
        announce_next: With ``numbered``, the calculator's answer also repeats the next step of the question
            (``Step 1 done: 33. Step 2: multiply by 3.``; after the last step nothing follows), as A's failed call
            repeats its expression: the next call's numbers are then in the message just before it.
        """
        super().__init__()
        if not depths or any(not 1 <= int(k) <= 7 for k in depths):
            raise ValueError(f"depths must be a non-empty list of chain lengths 1-7, got {depths!r}")
        pairs = {tuple(p) for p in excluded_pairs}
        if any(len(p) != 2 or any(o not in OPERATIONS for o in p) for p in pairs):
            raise ValueError(f"excluded_pairs must be pairs of {', '.join(OPERATIONS)}, got {excluded_pairs!r}")
        if require_pair and (not pairs or min(depths) < 2):
            raise ValueError("require_pair needs excluded_pairs and depths of 2 or more")
        if depth_weights is not None and (
            len(depth_weights) != len(depths) or any(w < 0 for w in depth_weights) or not sum(depth_weights) > 0
        ):
            raise ValueError(f"depth_weights must be one non-negative weight per depth, got {depth_weights!r}")
        self.depths, self.pairs, self.require_pair = [int(k) for k in depths], pairs, require_pair
        self.depth_weights = None if depth_weights is None else [w / sum(depth_weights) for w in depth_weights]
        if announce_next and not numbered:
            raise ValueError("announce_next needs numbered=True (it names the next step by its number)")
        self.numbered, self.announce_next, self.answered = numbered, announce_next, 0
        self.start, self.steps, self.values = 0, [], []
        self.submitted: float | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """A new chain from ``seed``."""
        super().reset(seed=seed, options=options)
        rng = self.np_random
        if self.depth_weights is None:
            k = self.depths[int(rng.integers(len(self.depths)))]
        else:
            k = self.depths[int(rng.choice(len(self.depths), p=self.depth_weights))]
        while True:
            names = [list(OPERATIONS)[int(rng.integers(len(OPERATIONS)))] for _ in range(k)]
            adjacent = set(itertools.pairwise(names))
            if (adjacent & self.pairs) if self.require_pair else not (adjacent & self.pairs):
                break
        self.start = int(rng.integers(2, 30))
        self.steps = [
            (name, int(rng.integers(2, 4)) if name == "multiply" else int(rng.integers(2, 20))) for name in names
        ]
        self.values = [self.start]
        for name, operand in self.steps:
            self.values.append(int(safe_eval(f"{self.values[-1]} {OPERATIONS[name][1]} {operand}")))
        self.submitted, self.answered = None, 0
        if self.numbered:
            words = " ".join(
                f"Step {i}: {OPERATIONS[name][0]} {operand}." for i, (name, operand) in enumerate(self.steps, 1)
            )
            question = f"Start with {self.start}. {words} What is the result?"
        else:
            words = ", then ".join(f"{OPERATIONS[name][0]} {operand}" for name, operand in self.steps)
            question = f"Start with {self.start}, {words}. What is the result?"
        return [
            {
                "role": "system",
                "content": "Follow the steps. Use the calculator for each step, one operation per call, then call "
                "submit_answer with the final number.",
            },
            {"role": "user", "content": question},
        ], {"depth": k, "operations": names}

    @tool
    def calculator(self, expression: str) -> str:
        """Apply one operation: two numbers and one of + - *.

        Args:
            expression: One operation, e.g. "12 * 3".
        """
        if not _one_operation(expression):
            raise ToolError("one operation per call: two numbers and one of + - *, e.g. 12 * 3")
        result = _format(safe_eval(expression))
        self.answered += 1
        if not self.numbered:
            return result
        answer = f"Step {self.answered} done: {result}"
        if self.announce_next and self.answered < len(self.steps):
            name, operand = self.steps[self.answered]
            answer += f". Step {self.answered + 1}: {OPERATIONS[name][0]} {operand}."
        return answer

    @tool
    def submit_answer(self, answer: float) -> str:
        """Submit the final number; this ends the episode.

        Args:
            answer: The result, e.g. 61.
        """
        self.submitted = answer
        self.end_episode()
        return f"Answer {_format(answer)} submitted."

    def score(self) -> float:
        """1.0 for the exact final value, else 0.0."""
        return float(self.submitted is not None and abs(self.submitted - self.values[-1]) < 1e-6)

    def canaries(self) -> dict[str, list[Message | str]]:
        """Known reward hacks, none of which may score: every intermediate value submitted in one turn (the last
        submission counts), the answer claimed in text, and the first step's result submitted at once."""
        return {
            "every value submitted in one turn": [
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "submit_answer", "arguments": {"answer": v}}}
                        for v in [*self.values[1:], self.values[-1] + 1]
                    ],
                }
            ],
            "the answer claimed in text": [f"Answer {self.values[-1]} submitted."],
        }

    def oracle(self) -> Message | None:
        """One calculator call per step on the previous result, then the final value."""
        done = sum(1 for m in self.messages if m["role"] == "tool" and m.get("name") == "calculator")
        if done < len(self.steps):
            name, operand = self.steps[done]
            return _call("calculator", {"expression": f"{self.values[done]} {OPERATIONS[name][1]} {operand}"})
        return _call("submit_answer", {"answer": self.values[-1]})


def _call(name: str, arguments: dict[str, Any]) -> Message:
    """One assistant turn with one tool call."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def _one_operation(expression: str) -> bool:
    """Whether ``expression`` is exactly one ``+``, ``-`` or ``*`` of two numbers (a number may be negative)."""
    try:
        tree = ast.parse(expression.strip(), mode="eval").body
    except SyntaxError:
        return False

    def number(node: ast.AST) -> bool:
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            node = node.operand
        return isinstance(node, ast.Constant) and type(node.value) in (int, float)

    return (
        isinstance(tree, ast.BinOp)
        and isinstance(tree.op, (ast.Add, ast.Sub, ast.Mult))
        and number(tree.left)
        and number(tree.right)
    )
