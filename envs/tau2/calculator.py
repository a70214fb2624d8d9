"""The ``calculate`` tool both domains share: upstream's answers, without upstream's ``eval``.

Upstream tau2-bench (``tau2/domains/*/tools.py``, MIT, Sierra Research) checks the expression's characters against
``0123456789+-*/(). `` and ``eval``\\ s it. That admits ``**``: ``calculate("9**9**9")`` computes an integer of a
billion bits, holding the GIL for hours, which no thread deadline can interrupt. Here the expression is parsed with
:mod:`ast` and evaluated node by node with Python's own operators, so every answer and every error text is the one
``eval`` gives, except that an integer operation whose result would pass :data:`MAX_INT_BITS` is refused at once
(with :data:`TOO_LARGE`) instead of computed.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

ALLOWED = "0123456789+-*/(). "
"""Upstream's character whitelist."""

MAX_INT_BITS = 100_000
"""The largest integer (in bits; about 30,000 decimal digits) an operation may produce. Floats end at 1,024 bits, so
only an intermediate value that a later division brings back needs more. One operation at this size takes
milliseconds: 220 of the costliest (a 100,000-bit floor division), a 4,000-character expression, took 6 s on two
loaded cores, where upstream's ``eval`` of ``9**9**9`` does not finish for hours."""

TOO_LARGE = f"Expression too large to calculate (an intermediate integer over {MAX_INT_BITS:,} bits)"
"""The error text for a refused operation (upstream has none: it does not finish)."""

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """Upstream's ``calculate``: the value of ``expression`` rounded to 2 decimals, as text.

    Args:
        expression: Numbers, ``+ - * /``, parentheses and spaces (upstream's whitelist, so ``//`` and ``**`` too).

    Returns:
        ``str(round(float(value), 2))``, as upstream.

    Raises:
        ValueError: ``Invalid characters in expression`` (upstream's text), or :data:`TOO_LARGE`.
        Exception: Whatever upstream's ``eval`` raises for the same expression (``SyntaxError``,
            ``ZeroDivisionError``, ``TypeError``, ``OverflowError``), with the same text.
    """
    if not all(char in ALLOWED for char in expression):
        raise ValueError("Invalid characters in expression")
    source = expression.lstrip(" \t")  # what eval() compiles: it strips leading spaces and tabs
    compile(source, "<string>", "eval")  # eval's own syntax errors, same text; compiling runs nothing
    # An expression nested some 2,900 levels deep (a limit that depends on the caller's stack) is past ast's own
    # recursion limit but not the compiler's: it raises RecursionError here where eval would answer.
    tree = ast.parse(source, "<string>", "eval")
    return str(round(float(_evaluate(tree.body)), 2))


def _evaluate(root: ast.expr) -> Any:
    """The value of an expression tree, evaluated without recursion (a long sum is a deep tree) in eval's order."""
    values: list[Any] = []
    stack: list[tuple[ast.expr, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        children = _children(node)
        if not ready and children:
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(children))
            continue
        operands = values[len(values) - len(children) :] if children else []
        del values[len(values) - len(children) :]
        values.append(_apply(node, operands))
    return values[0]


def _children(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp):
        return [node.left, node.right]
    if isinstance(node, ast.UnaryOp):
        return [node.operand]
    if isinstance(node, ast.Tuple):
        return list(node.elts)
    if isinstance(node, ast.Starred):
        return [node.value]
    if isinstance(node, ast.Call):
        return [node.func, *node.args, *(keyword.value for keyword in node.keywords)]
    return []


def _apply(node: ast.expr, operands: list[Any]) -> Any:
    """One node's value from its children's values (in :func:`_children`'s order)."""
    if isinstance(node, ast.Constant):
        return node.value  # an int, a float or ``...``: nothing else can be written with the whitelist
    if isinstance(node, ast.BinOp):
        left, right = operands
        _check_size(node.op, left, right)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        return _UNARY[type(node.op)](operands[0])
    if isinstance(node, ast.Tuple):
        return tuple(operands)  # only ``()``: a longer tuple needs a comma
    if isinstance(node, ast.Starred):
        return operands[0]
    if isinstance(node, ast.Call):
        return _call(node, operands)
    raise ValueError(f"Unsupported expression: {type(node).__name__}")  # unreachable with the whitelist


def _check_size(op: ast.operator, left: Any, right: Any) -> None:
    """Refuse an integer product or power whose result would pass :data:`MAX_INT_BITS` (before computing it)."""
    if type(left) is not int or type(right) is not int:
        return  # a float operation is fast (it overflows or is inexact instead); ``()`` * n is ``()``
    if isinstance(op, ast.Mult):
        bits = left.bit_length() + right.bit_length()
    elif isinstance(op, ast.Pow) and right > 0 and abs(left) > 1:
        bits = right * math.log2(abs(left)) if right.bit_length() < 64 else math.inf
    else:
        return
    if bits > MAX_INT_BITS:
        raise ValueError(TOO_LARGE)


def _call(node: ast.Call, operands: list[Any]) -> Any:
    """``f(...)`` on values already computed: nothing the whitelist can write is callable, so this raises the
    ``TypeError`` eval raises, built by Python itself from a call of the same shape over those values."""
    names = [f"v{index}" for index in range(len(operands))]
    arguments: list[ast.expr] = []
    position = 1
    for argument in node.args:
        name: ast.expr = ast.Name(names[position], ast.Load())
        arguments.append(ast.Starred(name, ast.Load()) if isinstance(argument, ast.Starred) else name)
        position += 1
    keywords = []
    for keyword in node.keywords:  # only ``**x``: a named keyword needs ``=``
        keywords.append(ast.keyword(keyword.arg, ast.Name(names[position], ast.Load())))
        position += 1
    shape = ast.fix_missing_locations(ast.Expression(ast.Call(ast.Name(names[0], ast.Load()), arguments, keywords)))
    scope = {"__builtins__": None, **dict(zip(names, operands, strict=True))}
    return eval(compile(shape, "<string>", "eval"), scope)  # its names are bound to numbers and ``()`` only
