"""The scripted policies that play the env: its oracle, no-op answers, a random tool caller, one that never stops."""

from __future__ import annotations

from typing import Any

import numpy as np

from envkit.core.env import Env
from envkit.core.messages import Message
from envkit.validate.driver import Policy, Run

REFUSAL = "I'm sorry, but I can't help with that."
"""What the refusal policy says."""
CHATTER = "Let me think about that a little longer."
"""What the never-stopping policy keeps saying in an env without tools."""


def oracle_policy(env: Env, run: Run) -> Any:
    """The env's own oracle."""
    return env.oracle()


def empty_policy(env: Env, run: Run) -> Any:
    """Says nothing."""
    return {"role": "assistant", "content": ""}


def refusal_policy(env: Env, run: Run) -> Any:
    """Politely refuses."""
    return REFUSAL


def tool_schemas(env: Env) -> list[dict[str, Any]]:
    """The env's well-formed tool schemas, for the scripted policies (the schema check reports malformed ones)."""
    try:
        tools = getattr(env, "tools", None)
    except Exception:
        return []
    usable = []
    for tool in tools if isinstance(tools, list) else []:
        function = tool.get("function") if isinstance(tool, dict) else None
        parameters = function.get("parameters", {}) if isinstance(function, dict) else None
        if (
            isinstance(parameters, dict)
            and isinstance(function.get("name"), str)
            and isinstance(parameters.get("properties", {}), dict)
            and all(isinstance(v, dict) for v in parameters.get("properties", {}).values())
        ):
            usable.append(tool)
    return usable


def random_value(schema: dict[str, Any], rng: np.random.Generator, depth: int = 0) -> Any:
    """A random value of roughly the type a JSON schema describes."""
    if schema.get("enum"):
        return schema["enum"][int(rng.integers(len(schema["enum"])))]
    options = schema.get("anyOf") or schema.get("oneOf")
    if options:
        return random_value(options[int(rng.integers(len(options)))], rng, depth)
    kind = schema.get("type", "string")
    if isinstance(kind, list):
        kind = kind[int(rng.integers(len(kind)))]
    if kind == "integer":
        return int(rng.integers(-3, 60))
    if kind == "number":
        return round(float(rng.uniform(-10, 500)), 2)
    if kind == "boolean":
        return bool(rng.integers(2))
    if kind == "null":
        return None
    if kind == "array":
        return [random_value(schema.get("items", {}), rng, depth + 1) for _ in range(int(rng.integers(0, 3)))]
    if kind == "object":
        if depth > 2:
            return {}
        props = schema.get("properties", {})
        return {k: random_value(v, rng, depth + 1) for k, v in props.items()}
    words = ["", "abc", "Lisbon", "H-104", "G-1234", "BK-000000", "2026-07-01", "double", "12 * 3", "yes"]
    return words[int(rng.integers(len(words)))]


def call_message(name: str, arguments: Any) -> Message:
    """An assistant message with one tool call."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def random_policy(env: Env, run: Run) -> Any:
    """Random tool calls (from the env's schemas) and random short texts, seeded by the episode seed."""
    rng = np.random.default_rng([run.seed, run.steps])
    tools = tool_schemas(env)
    if tools and rng.random() < 0.75:
        function = tools[int(rng.integers(len(tools)))].get("function", {})
        return call_message(function.get("name", "?"), random_value(function.get("parameters", {}), rng))
    texts = ["ok", "42", "I think the answer is 7.", "Could you tell me more?", "Done.", str(int(rng.integers(1000)))]
    return texts[int(rng.integers(len(texts)))]


def chatter_policy(env: Env, run: Run) -> Any:
    """Never stops: keeps calling a tool (tool envs) or keeps talking (text envs)."""
    tools = tool_schemas(env)
    if tools:
        function = tools[run.steps % len(tools)].get("function", {})
        rng = np.random.default_rng([run.seed, run.steps])
        return call_message(function.get("name", "?"), random_value(function.get("parameters", {}), rng))
    return CHATTER


SCRIPTED_POLICIES: tuple[tuple[str, Policy], ...] = (
    ("oracle", oracle_policy),
    ("empty", empty_policy),
    ("refusal", refusal_policy),
    ("random", random_policy),
)
"""The policies every env check can draw on: each plays one episode per seed before the checks that need episodes."""
NOOP_POLICIES = ("empty", "refusal")
"""The scripted policies that do nothing: their scores are the env's floor."""
