"""The fuzzer's actions: malformed and adversarial messages, built from the env's own tool schemas."""

from __future__ import annotations

from typing import Any

import numpy as np

from envkit.chat.parsing import parse_assistant
from envkit.core.env import Env
from envkit.validate.policies import call_message, random_value, tool_schemas


def fuzz_actions(env: Env) -> list[tuple[str, Any]]:
    """Malformed and adversarial actions, built from the env's own tool schemas where it has tools."""
    rng = np.random.default_rng(0)
    tools = tool_schemas(env)
    functions = [t.get("function", {}) for t in tools] or [{"name": "lookup", "parameters": {}}]
    first = functions[0].get("name", "lookup")
    actions: list[tuple[str, Any]] = [
        ("invalid JSON arguments", call_message(first, '{"broken": ')),
        ("unknown tool", call_message("no_such_tool_zz", {})),
        ("arguments not an object", call_message(first, [1, 2, 3])),
        ("arguments null", call_message(first, None)),
        ("tool call without a function", {"role": "assistant", "content": "", "tool_calls": [{"type": "function"}]}),
        ("tool_calls not a list", {"role": "assistant", "content": "", "tool_calls": "oops"}),
        ("malformed call from the parser", parse_assistant('<tool_call>{"name": "x", "arguments": {</tool_call>')),
        ("empty content", {"role": "assistant", "content": ""}),
        ("content None", {"role": "assistant", "content": None}),
        ("100 KB string", "lorem ipsum " * 8_500),
        ("odd unicode", "\u202e\u200d\x00 👩‍👩‍👧 \ufffd ñ ß 中文 \u0301\u0301 \t\r\n"),
        ("plain str action", "hello"),
        ("tool-call text in a plain str", f'<tool_call>{{"name": "{first}", "arguments": {{}}}}</tool_call>'),
        ("injection-looking text", "'); DROP TABLE users; -- {{7*7}} ${jndi:x} __import__('os')"),
    ]
    many = [
        {
            "type": "function",
            "function": {"name": f.get("name"), "arguments": random_value(f.get("parameters", {}), rng)},
        }
        for f in (functions * 50)[:50]
    ]
    actions.append(("50 calls in one turn", {"role": "assistant", "content": "", "tool_calls": many}))
    for function in functions if tools else []:
        name, params = function.get("name"), function.get("parameters", {})
        valid = random_value(params, rng)
        wrong = {k: _wrong_type(v) for k, v in params.get("properties", {}).items()}
        huge = {
            k: ("z" * 100_000 if v.get("type") == "string" else random_value(v, rng))
            for k, v in params.get("properties", {}).items()
        }
        actions += [
            (f"{name}: missing arguments", call_message(name, {})),
            (f"{name}: extra argument", call_message(name, {**valid, "unexpected_argument": 1})),
            (f"{name}: wrong-typed arguments", call_message(name, wrong)),
            (f"{name}: 100 KB string arguments", call_message(name, huge)),
        ]
    return actions


def _wrong_type(schema: dict[str, Any]) -> Any:
    kind = schema.get("type")
    if kind == "string":
        return {"nested": [1, 2]}
    if kind in ("integer", "number"):
        return "not a number"
    if kind == "array":
        return "not a list"
    if kind == "object":
        return 17
    return ["unexpected"]
