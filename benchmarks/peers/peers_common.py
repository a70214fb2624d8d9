"""The task every arm of ``benchmarks/peers.py`` plays, in plain Python (no envkit, TRL or verifiers import).

Each arm (envkit, verifiers, TRL) writes its calculator + submit env in its own library's idiom around these pieces,
so the work is the same: the same problems, the same calculator, the same answer check and the same injected faults.
Every arm's process imports this file, whichever virtual environment it runs in.

An episode the model is warm-started to play (three assistant turns)::

    [system] SYSTEM_PROMPT
    [user] What is 12 * 7 + 3?
    [assistant] <tool_call>{"name": "calculator", "arguments": {"expression": "12 * 7 + 3"}}</tool_call>
    [tool] 87
    [assistant] <tool_call>{"name": "submit_answer", "arguments": {"answer": 87}}</tool_call>
    [tool] Answer 87 submitted.
    [assistant] Done.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import time
from pathlib import Path
from typing import Any

SYSTEM_PROMPT = (
    "Solve the problem. Use the calculator for arithmetic, call submit_answer with the number, then say done."
)
"""The system message of every arm."""

FAULTS = ("none", "raise", "hang")
"""Injected tool faults: ``raise`` makes the calculator raise, ``hang`` makes it sleep :data:`HANG_S` seconds."""

GROUP = 2
"""Episodes per task in every arm (TRL's ``num_generations``, which GRPO needs to be at least 2)."""

HANG_S = 20.0
"""How long a "hung" calculator call sleeps: longer than envkit's step timeout in the fault run (5 s)."""

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def make_task(seed: int, *, faults: bool = False) -> dict[str, Any]:
    """The problem of task ``seed``: ``{"seed", "question", "expression", "answer", "fault"}``.

    Args:
        seed: Task seed (the same seed gives the same problem in every arm).
        faults: Give every eighth task from seed 1 a raising calculator and every eighth from seed 2 a hung one
            (the fault run); otherwise no faults.
    """
    rng = random.Random(seed)
    a, b, c = rng.randint(2, 40), rng.randint(2, 12), rng.randint(1, 60)
    shape = rng.randrange(3)
    expression = [f"{a} * {b} + {c}", f"{a} + {b} * {c}", f"{a} * {b} - {c}"][shape]
    fault = "none"
    if faults:
        fault = {1: "raise", 2: "hang"}.get(seed % 8, "none")
    return {
        "seed": seed,
        "question": f"What is {expression}?",
        "expression": expression,
        "answer": calculate_value(expression),
        "fault": fault,
    }


def calculate_value(expression: str) -> int:
    """Evaluate ``+ - *`` over integers with :mod:`ast` (never ``eval``); raise ``ValueError`` for anything else."""
    if len(expression) > 200:
        raise ValueError("expression too long (200 characters at most)")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression[:60]!r}") from None

    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError(f"unsupported element {type(node).__name__}: only integers, + - * and parentheses")

    return walk(tree.body)


def run_calculator(task: dict[str, Any], expression: str) -> str:
    """The calculator every arm's tool calls: the task's injected fault first, then the value as text."""
    if task.get("fault") == "raise":
        raise RuntimeError("calculator backend unavailable (injected fault)")
    if task.get("fault") == "hang":
        time.sleep(HANG_S)
    return str(calculate_value(expression))


def submitted_text(answer: float) -> str:
    """What ``submit_answer`` returns to the model."""
    return f"Answer {format_number(answer)} submitted."


def format_number(value: float) -> str:
    """An integer-valued number without ``.0``."""
    return str(int(value)) if float(value).is_integer() else str(value)


def is_correct(submitted: float | None, task: dict[str, Any]) -> bool:
    """Whether the submitted answer equals the task's answer."""
    try:
        return submitted is not None and abs(float(submitted) - task["answer"]) < 1e-6
    except (TypeError, ValueError):
        return False


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    """The tasks a driver wrote with :func:`write_tasks`."""
    return json.loads(Path(path).read_text())


def write_tasks(path: str | Path, seeds: list[int], *, faults: bool = False) -> list[dict[str, Any]]:
    """Write the tasks of ``seeds`` to ``path`` (JSON) for the arms' processes; return them."""
    tasks = [make_task(seed, faults=faults) for seed in seeds]
    Path(path).write_text(json.dumps(tasks))
    return tasks


# ---- what every arm's runner shares: its command line, its report ------------------------------------------------
def arm_parser(description: str) -> Any:
    """The command line every arm runner takes (``benchmarks/peers.py`` passes the same values to each)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", help="the OpenAI-compatible server, e.g. http://127.0.0.1:8000")
    parser.add_argument("--model", required=True, help="the model folder (tokenizer; the server's model name)")
    parser.add_argument("--tasks", required=True, help="tasks JSON written by write_tasks")
    parser.add_argument("--warmup-tasks", required=True, help="tasks JSON of the discarded warm-up batch")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0: off")
    parser.add_argument("--per-turn", type=int, default=64, help="token budget of one assistant turn")
    parser.add_argument("--total", type=int, default=256, help="completion token budget of one episode")
    parser.add_argument("--max-turns", type=int, default=4, help="assistant turns per episode")
    parser.add_argument("--concurrency", type=int, default=16, help="episodes in flight at once")
    parser.add_argument("--tool-timeout", type=float, default=None, help="per tool call, where the library has one")
    parser.add_argument("--out", required=True, help="result JSON")
    return parser


def model_runs(ids: list[int], mask: list[int]) -> list[list[int]]:
    """The model turns of a trajectory: each run of tokens whose mask is 1 (model tokens), in order."""
    runs: list[list[int]] = []
    current: list[int] = []
    for token, bit in zip(ids, mask, strict=True):
        if bit:
            current.append(token)
        elif current:
            runs.append(current)
            current = []
    return [*runs, current] if current else runs


class CpuClock:
    """Wall time and this process's CPU time (all its threads) over a ``with`` block."""

    def __enter__(self) -> CpuClock:
        self._wall, self._cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall_s = time.perf_counter() - self._wall
        self.cpu_s = time.process_time() - self._cpu


def write_result(path: str | Path, result: dict[str, Any]) -> None:
    """Write one arm run's result JSON."""
    Path(path).write_text(json.dumps(result))
