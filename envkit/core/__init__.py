"""The env API: :class:`Env` (a ``gymnasium.Env`` over chat messages), :class:`ToolEnv` with :func:`tool`, and the
message types. Everything else in envkit builds on this package; it imports nothing else of envkit."""

from envkit.core.env import TASK_ID_KEY, Ending, Env, step_ending, task_id_of, task_identity
from envkit.core.messages import Message, MessageSpace, as_assistant_message, format_transcript, message_problems
from envkit.core.tools import ToolDefinitionError, ToolEnv, ToolError, ToolSpec, build_tool_spec, decode_tool_call, tool

__all__ = [
    "TASK_ID_KEY",
    "Ending",
    "Env",
    "Message",
    "MessageSpace",
    "ToolDefinitionError",
    "ToolEnv",
    "ToolError",
    "ToolSpec",
    "as_assistant_message",
    "build_tool_spec",
    "decode_tool_call",
    "format_transcript",
    "message_problems",
    "step_ending",
    "task_id_of",
    "task_identity",
    "tool",
]
