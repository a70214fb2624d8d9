"""OpenEnv observations and tools in envkit's terms: tool schemas, the opening messages of a reset observation, a
tool result's text, and the one ``step`` tool of a non-MCP env."""

from __future__ import annotations

import json
from typing import Any

from envkit.adapters.openenv.sessions import (
    LocalSession,
    OpenEnvActionError,
    OpenEnvConnectionError,
    RemoteSession,
    reason,
)
from envkit.core.messages import Message

TEXT_KEYS = ("prompt", "text", "message", "content", "question", "instruction", "task")
"""Reset-observation fields that can be a task's text (first one that is a non-empty string wins)."""


STEP_TOOL = "step"
"""The one tool of a non-MCP OpenEnv env: a call is one OpenEnv step, its arguments the action's fields."""


# ---- the wire format -> envkit ---------------------------------------------------------------------------------------
def to_function_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """An MCP tool (``name``, ``description``, ``input_schema``) as an OpenAI function schema (envkit's ``tools``)."""
    parameters = tool.get("input_schema") or tool.get("inputSchema") or {"type": "object", "properties": {}}
    return {
        "type": "function",
        "function": {
            "name": tool.get("name", ""),
            "description": tool.get("description") or "",
            "parameters": parameters,
        },
    }


def describe(session: RemoteSession | LocalSession) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """``(served, tools)``: the ``envkit`` entry of the state of an ``envkit serve-env`` session (else ``None``) and the
    env's tools as OpenAI function schemas (a non-MCP env's: its one :data:`STEP_TOOL`)."""
    served, tools, _ = describe_with_action(session)
    return served, tools


def describe_with_action(
    session: RemoteSession | LocalSession,
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], dict[str, Any] | None]:
    """:func:`describe` plus the action schema of a non-MCP env (``None`` for MCP and served envkit envs)."""
    try:
        state = session.state()
    except OpenEnvConnectionError:
        raise
    except Exception:
        state = {}
    served = state.get("envkit") if isinstance(state, dict) else None
    if isinstance(served, dict) and isinstance(served.get("tools"), list):
        return served, [dict(t) for t in served["tools"]], None
    action = session.action_schema() if isinstance(session, LocalSession) else None
    if action is None:
        try:
            payload = session.step({"type": "list_tools"})
        except OpenEnvConnectionError:
            raise
        except Exception as error:
            # A server that cannot read list_tools as its typed action (VALIDATION_ERROR), or an in-process class
            # whose step() fails on it: not an MCP env. Any other server error is the server's own.
            if isinstance(session, RemoteSession) and not isinstance(error, OpenEnvActionError):
                raise
            action = session.action_schema() if isinstance(session, RemoteSession) else None
            if action is None:
                raise RuntimeError(
                    f"it is not an MCP env (list_tools failed: {reason(error)}) and publishes no action schema (a "
                    "server's /schema, or an in-process class's typed step(action) annotation); envkit consumes MCP "
                    "envs, envkit serve-env envs and non-MCP envs with an action schema"
                ) from None
        else:
            observation = payload.get("observation") or {}
            tools = observation.get("tools")
            error = (observation.get("metadata") or {}).get("error")
            if error and not tools:
                raise RuntimeError(f"listing its MCP tools failed: {error}")
            if not isinstance(tools, list):
                raise RuntimeError(f"list_tools gave no tool list (it answered {reason(ValueError(observation))})")
            return None, [to_function_schema(t) for t in tools if isinstance(t, dict) and t.get("name")], None
    return None, [step_tool(action)], action


def step_tool(action: dict[str, Any]) -> dict[str, Any]:
    """The one tool of a non-MCP OpenEnv env: its action's JSON schema (less OpenEnv's ``metadata``) as the
    parameters of :data:`STEP_TOOL`."""
    properties = {k: v for k, v in (action.get("properties") or {}).items() if k != "metadata"}
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    required = [name for name in action.get("required") or [] if name in properties]
    if required:
        parameters["required"] = required
    if isinstance(action.get("$defs"), dict):
        parameters["$defs"] = action["$defs"]
    title = action.get("title") or "action"
    about = f": {action['description']}" if isinstance(action.get("description"), str) else ""
    return {
        "type": "function",
        "function": {
            "name": STEP_TOOL,
            "description": f"Take one step of the env with a {title}{about}. Returns the observation as JSON.",
            "parameters": parameters,
        },
    }


def observation_text(observation: dict[str, Any]) -> str:
    """A non-MCP env's observation as the tool message's text: its fields as JSON (``metadata`` when not empty)."""
    fields = {k: v for k, v in observation.items() if k not in ("reward", "done") and (k != "metadata" or v)}
    return _text(fields)


def opening_messages(observation: dict[str, Any], system_prompt: str | None = None) -> list[Message]:
    """The opening messages of a reset observation from an OpenEnv env (see the module docstring)."""
    messages = observation.get("messages")
    if (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)
        and all(m.get("role") in ("system", "user") for m in messages)
    ):
        opening: list[Message] = [{"role": m["role"], "content": m["content"]} for m in messages]
    else:
        metadata = observation.get("metadata") if isinstance(observation.get("metadata"), dict) else {}
        text = next(
            (
                where[k]
                for where in (observation, metadata)
                for k in TEXT_KEYS
                if isinstance(where.get(k), str) and where[k].strip()
            ),
            None,
        )
        if text is None:
            text = json.dumps(observation, ensure_ascii=False, default=str) if observation else "Start."
        opening = [{"role": "user", "content": text}]
    if system_prompt:
        opening.insert(0, {"role": "system", "content": system_prompt})
    return opening


def tool_result_text(observation: dict[str, Any]) -> tuple[str, bool]:
    """The text of an OpenEnv ``call_tool`` observation (an MCP ``CallToolResult``) and whether it is an error."""
    error = observation.get("error")
    if error:
        message = error.get("message", error) if isinstance(error, dict) else error
        return f"Error: {message}", True
    result = observation.get("result")
    if isinstance(result, dict):
        failed = bool(result.get("is_error") or result.get("isError"))
        content = result.get("content")
        if isinstance(content, list):
            texts = [c["text"] for c in content if isinstance(c, dict) and isinstance(c.get("text"), str)]
            if texts:
                return "\n".join(texts), failed
        for key in ("data", "structured_content", "structuredContent"):
            if result.get(key) is not None:
                return _text(result[key]), failed
        return _text(result), failed
    return _text(result), False


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
