"""BFCL's stateful APIs for one conversation, and how a call is run on them: as BFCL's executor runs it, without its
``eval``.

BFCL's ``execute_multi_turn_func_call`` builds a string such as ``"cd(folder='document')"``, prefixes the method
names of the involved instances and ``eval``s it. envkit never evaluates text: a call is a method name looked up
among the public methods of the conversation's instances (:class:`Apis`) and arguments decoded from JSON into plain
values (:func:`plain_arguments`), passed as keywords. The result text is BFCL's (a ``str`` as it is, a ``dict`` as
JSON, anything else through ``str``; an exception as ``Error during execution: …``), so the model reads what BFCL's
inference shows it and the checks compare what BFCL's checker compares.
"""

from __future__ import annotations

import ast
import copy
import functools
import importlib
import inspect
import json
import keyword
import math
import threading
from typing import Any

from envkit.envs.bfcl.data import Task

_LOCK = threading.RLock()
"""Held while any BFCL method runs: ``MathAPI`` sets process-wide ``mpmath.mp.dps`` before it computes, so two
threads' calls must not interleave (each call takes microseconds)."""

MAX_RESULT_BITS = 1_000_000
"""An integer power whose result would pass this many bits is refused (BFCL computes it, holding the GIL for
minutes to hours; see :func:`refusal`)."""

MAX_PRECISION = 10_000
"""``MathAPI.logarithm`` / ``square_root`` precisions (digits) and ``round_number`` places beyond this are refused."""


class NotPlain(ValueError):
    """Arguments that are not plain JSON values (a non-finite float, an object a JSON parser cannot produce)."""


def plain_arguments(arguments: Any) -> dict[str, Any]:
    """A call's arguments as plain JSON values: a JSON object's text, or a ``dict`` that round-trips through JSON
    unchanged in kind (no ``NaN``/``Infinity``, no tuples or objects of other types).

    Args:
        arguments: What the tool call carries (text or an already-decoded ``dict``).

    Returns:
        A fresh ``dict`` whose values are ``dict``/``list``/``str``/``int``/``float``/``bool``/``None``.

    Raises:
        NotPlain: Not JSON, not an object, or holding values JSON cannot carry.
    """
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            raise NotPlain(f"not valid JSON ({error.msg})") from None
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise NotPlain(f"must be a JSON object, got {type(arguments).__name__}")
    try:
        return json.loads(json.dumps(arguments, allow_nan=False))
    except (TypeError, ValueError) as error:
        raise NotPlain(f"must be plain JSON values ({error})") from None


def is_literal(value: Any) -> bool:
    """Whether ``value`` is a plain JSON value all the way down, so its ``repr`` is a Python literal of it."""
    if value is None or isinstance(value, (bool, int, str)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(is_literal(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str) and is_literal(item) for key, item in value.items())
    return False


def call_string(name: str, arguments: dict[str, Any]) -> str:
    """The call as BFCL's function-calling handlers write it for its checker (``convert_to_function_call``:
    ``name(k=repr(v),…)``), built only from an identifier and ``repr`` of plain literals, so ``eval`` of it can do
    nothing but call ``name``.

    Args:
        name: The function name: an identifier.
        arguments: Keyword arguments: identifier keys, plain JSON values.

    Raises:
        ValueError: ``name`` or a key is not an identifier, or a value is not a plain literal.
    """
    if not (name.isidentifier() and not keyword.iskeyword(name)):
        raise ValueError(f"{name!r} is not a function name")
    for key, value in arguments.items():
        if not (isinstance(key, str) and key.isidentifier() and not keyword.iskeyword(key)):
            raise ValueError(f"{key!r} is not an argument name")
        if not is_literal(value):
            raise ValueError(f"argument {key!r} is not a plain literal: {value!r:.80}")
    return f"{name}({','.join(f'{k}={v!r}' for k, v in arguments.items())})"


@functools.cache
def api_class(class_name: str) -> type:
    """BFCL's class of that name (``GorillaFileSystem``, ``MathAPI``, …), from its installed module."""
    from bfcl_eval.constants.executable_backend_config import CLASS_FILE_PATH_MAPPING

    return getattr(importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name]), class_name)


_METHODS: dict[str, tuple[str, ...]] = {}


def public_methods(class_name: str, instance: Any) -> tuple[str, ...]:
    """The method names BFCL's executor maps for an instance of a class: its public bound methods (no leading
    ``_``), found once per class."""
    names = _METHODS.get(class_name)
    if names is None:
        members = inspect.getmembers(instance, inspect.ismethod)
        names = _METHODS[class_name] = tuple(name for name, _ in members if not name.startswith("_"))
    return names


class Apis:
    """The instances of one conversation: each involved class built and loaded from the task's ``initial_config``
    as BFCL's executor does (a deep copy of the class's config, ``long_context`` for that category).

    Args:
        task: The task.
    """

    def __init__(self, task: Task) -> None:
        from bfcl_eval.constants.executable_backend_config import STATELESS_CLASSES

        self.instances: dict[str, Any] = {}
        self.owner: dict[str, str] = {}
        """Method name → the class whose instance answers it (a later class wins a shared name, as in BFCL)."""
        with _LOCK:
            for class_name in task.involved_classes:
                instance = api_class(class_name)()
                if class_name not in STATELESS_CLASSES:
                    config = copy.deepcopy(task.initial_config.get(class_name, {}))
                    instance._load_scenario(config, long_context=task.long_context)
                self.instances[class_name] = instance
                for name in public_methods(class_name, instance):
                    self.owner[name] = class_name

    def run(self, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """Run one call and return its result as BFCL's executor writes it, and whether it failed.

        Args:
            name: The function name the model gave.
            arguments: Plain JSON values (:func:`plain_arguments`), passed as keywords.

        Returns:
            ``(text, failed)``: ``failed`` when the call raised (``Error during execution: …``, BFCL's text) or
            was refused; an API's own ``{"error": …}`` answer is a result, as in BFCL.
        """
        class_name = self.owner.get(name)
        if class_name is None:
            # BFCL evaluates an unmapped name as a bare Python name: NameError.
            return f"Error during execution: name {name!r} is not defined", True
        bad = [key for key in arguments if not (key.isidentifier() and not keyword.iskeyword(key))]
        if bad:
            return f"Error during execution: {name}() got an invalid argument name {bad[0]!r}", True
        refused = refusal(class_name, name, arguments)
        if refused is not None:
            return refused, True
        method = getattr(self.instances[class_name], name)
        with _LOCK:
            precision = _mpmath_precision() if class_name == "MathAPI" else None
            try:
                return _result_text(method(**arguments)), False
            except Exception as error:
                return f"Error during execution: {error}", True
            finally:  # MathAPI.logarithm leaves mpmath's process-wide precision where the model set it
                if precision is not None:
                    _mpmath_precision(precision)

    def gold_call(self, text: str) -> tuple[str, dict[str, Any]]:
        """One of BFCL's ground-truth call strings as a structured call: its name and keyword arguments.

        Parsed with :mod:`ast` (literals only, never evaluated as code); positional arguments are named by the
        method's signature.

        Raises:
            ValueError: Not a call of a known method with literal arguments.
        """
        node = ast.parse(text, mode="eval").body
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.func.id not in self.owner:
            raise ValueError(f"not a call of a known method: {text!r}")
        name = node.func.id
        args = [ast.literal_eval(arg) for arg in node.args]
        kwargs = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg is not None}
        method = getattr(api_class(self.owner[name]), name)
        bound = inspect.signature(method).bind(None, *args, **kwargs)
        bound.arguments.pop(next(iter(inspect.signature(method).parameters)))  # self
        return name, dict(bound.arguments)


def _result_text(result: Any) -> str:
    """A method's result as BFCL's executor writes it (read before the caller restores mpmath's precision, which
    an ``mpf`` in a logarithm's result is printed with)."""
    if type(result) is str:
        return result
    if type(result) is dict:
        try:
            return json.dumps(result)
        except Exception:
            return str(result)
    return str(result)


def _mpmath_precision(dps: int | None = None) -> int:
    """mpmath's process-wide decimal precision (``mpmath.mp.dps``), set to ``dps`` first when given."""
    import mpmath

    if dps is not None:
        mpmath.mp.dps = dps
    return int(mpmath.mp.dps)


def refusal(class_name: str, name: str, arguments: dict[str, Any]) -> str | None:
    """Why envkit will not run a call that BFCL would run for minutes (``None``: it runs).

    BFCL's ``MathAPI`` computes ``base ** exponent``, ``mpmath`` logarithms, ``Decimal`` square roots and ``round``
    at any size the model asks for: ``power(base=9, exponent=999999999)`` holds the GIL for hours. envkit answers
    those few calls with an error instead; every other call runs as BFCL runs it.
    """
    if class_name != "MathAPI":
        return None
    if name == "power":
        base, exponent = arguments.get("base"), arguments.get("exponent")
        huge = _is_int(base) and _is_int(exponent) and exponent > 0 and abs(base) > 1
        if huge and exponent * abs(base).bit_length() > MAX_RESULT_BITS:
            return f"Error during execution: the result would pass {MAX_RESULT_BITS} bits (refused by envkit)"
    places = {"logarithm": "precision", "square_root": "precision", "round_number": "decimal_places"}
    if name in places:
        value = arguments.get(places[name])
        if _is_int(value) and abs(value) > MAX_PRECISION:
            return f"Error during execution: {places[name]} beyond {MAX_PRECISION} digits (refused by envkit)"
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
