"""What envkit's OpenEnv server speaks (:mod:`envkit.adapters.openenv.server`): its actions and observations on top of
OpenEnv's MCP ones, its tools as FastMCP tools, and which tool arguments OpenEnv's own ``MCPToolClient.call_tool``
cannot send (:func:`call_tool_clashes`)."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, Literal

from fastmcp.tools import Tool, ToolResult
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation, ListToolsAction
from openenv.core.env_server.types import Action, Observation
from openenv.core.mcp_client import MCPToolClient
from pydantic import Field, PrivateAttr

__all__ = [
    "END_ACTION",
    "MESSAGE_ACTION",
    "RESPOND_TOOL",
    "EnvkitEndAction",
    "EnvkitMessageAction",
    "EnvkitObservation",
    "EnvkitToolObservation",
    "NotResetError",
    "call_tool_clashes",
    "envkit_tool",
]

RESPOND_TOOL = "respond"
"""The MCP tool that is a text turn: ``respond(message)`` steps the env with a plain assistant message."""

MESSAGE_ACTION = "message"
"""The ``type`` of the action that is one whole envkit assistant turn."""

END_ACTION = "end"
"""The ``type`` of the action that tells the env how its episode ended (:meth:`envkit.Env.end`)."""

_RESULT_SCHEMA = {
    "type": "object",
    "properties": {"result": {"type": "string"}},
    "required": ["result"],
    "x-fastmcp-wrap-result": True,  # FastMCP's client unwraps it: CallToolResult.data is the text
}


class NotResetError(RuntimeError):
    """A session was stepped before its first reset."""


class EnvkitMessageAction(Action):
    """One whole envkit assistant turn: ``message`` is an assistant message (``content``, ``tool_calls``) or its text.

    As the server's ``action_cls`` it also accepts OpenEnv's MCP actions (``list_tools``, ``call_tool``).
    """

    type: Literal["message"] = Field(default="message", description="Action type discriminator")
    message: Any = Field(description="An assistant message {'role', 'content', 'tool_calls'} or a plain text")

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind == END_ACTION:
            return EnvkitEndAction.model_validate(obj, *args, **kwargs)
        if kind == "call_tool":
            return CallToolAction.model_validate(obj, *args, **kwargs)
        if kind == "list_tools":
            return ListToolsAction.model_validate(obj, *args, **kwargs)
        return super().model_validate(obj, *args, **kwargs)


class EnvkitEndAction(Action):
    """How the episode ended (an :class:`envkit.Ending` value), for the env's :meth:`envkit.Env.end`."""

    type: Literal["end"] = Field(default="end", description="Action type discriminator")
    ending: str = Field(description="An envkit Ending value: done, max_turns, max_episode_tokens, ...")


class EnvkitObservation(Observation):
    """The env's new messages after a reset or a whole turn, with envkit's score."""

    messages: list[dict[str, Any]] = Field(default_factory=list, description="The env's new chat messages")
    score: float | None = Field(default=0.0, description="envkit's score() after this step; null when it failed")
    score_error: str | None = Field(default=None, description="Why score() failed (it raised or was not finite)")
    truncated: bool = Field(default=False, description="Whether the episode was cut off (max_turns)")
    info: dict[str, Any] = Field(default_factory=dict, description="envkit's info dict (tool_calls, tool_errors, ...)")


class EnvkitToolObservation(CallToolObservation):
    """OpenEnv's MCP tool result, with the envkit step it was: new messages, score, truncated, info."""

    messages: list[dict[str, Any]] = Field(default_factory=list)
    score: float | None = 0.0
    score_error: str | None = None
    truncated: bool = False
    info: dict[str, Any] = Field(default_factory=dict)


class _EnvTool(Tool):
    """An envkit tool as a FastMCP tool: the schema is the env's own, a call is one envkit turn."""

    _envkit_call: Callable[[str, dict[str, Any]], str] | None = PrivateAttr(default=None)

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        assert self._envkit_call is not None
        text = await asyncio.to_thread(self._envkit_call, self.name, dict(arguments or {}))
        return ToolResult(content=text or "(empty)", structured_content={"result": text})


def envkit_tool(
    name: str, description: str, parameters: dict[str, Any], run: Callable[[str, dict[str, Any]], str]
) -> Tool:
    """An envkit tool as a FastMCP tool: ``run(name, arguments)`` is its call (one envkit turn), its result text.

    Args:
        name: The tool's name.
        description: The tool's description.
        parameters: Its arguments' JSON schema (the env's own, verbatim).
        run: Runs one call: the tool's name and arguments in, the result's text out.

    Returns:
        The FastMCP tool.
    """
    tool = _EnvTool(name=name, description=description, parameters=parameters, output_schema=_RESULT_SCHEMA)
    tool._envkit_call = run
    return tool


def call_tool_clashes(tools: list[dict[str, Any]]) -> list[str]:
    """One warning line per tool with an argument that OpenEnv's ``MCPToolClient.call_tool(name, **kwargs)`` cannot
    pass, because the method has a parameter of that name itself (``name``; read from its signature): such a call
    raises ``TypeError: got multiple values for argument``. ``CallToolAction`` passes any argument.

    Args:
        tools: The env's tools as OpenAI function schemas.

    Returns:
        The warnings, each naming the tool, the argument and the call that works (empty when none clashes).
    """
    own = [
        p.name
        for p in inspect.signature(MCPToolClient.call_tool).parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]
    warnings = []
    for schema in tools:
        function = schema.get("function", {})
        arguments = list((function.get("parameters") or {}).get("properties") or {})
        for argument in (a for a in arguments if a in own):
            tool = function.get("name")
            signature = f"MCPToolClient.call_tool({', '.join(own)}, **kwargs)"
            warnings.append(
                f"tool {tool!r} has an argument {argument!r}, which OpenEnv's {signature} cannot pass "
                f"(TypeError: got multiple values for argument {argument!r}); OpenEnv clients "
                f"call it as env.step(CallToolAction(tool_name={tool!r}, arguments={{{argument!r}: ...}}))"
            )
    return warnings
