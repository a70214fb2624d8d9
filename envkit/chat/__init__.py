"""Chat rendering and parsing through the model's own chat template: messages to token ids (:class:`ChatRenderer`,
token-exact and incremental) and a model's reply back to a message (:func:`parse_assistant`)."""

from envkit.chat.parsing import ToolCallFormat, generation_prompt, parse_assistant, tool_call_format
from envkit.chat.render import ChatRenderer, TemplateError, bundled_template

__all__ = [
    "ChatRenderer",
    "TemplateError",
    "ToolCallFormat",
    "bundled_template",
    "generation_prompt",
    "parse_assistant",
    "tool_call_format",
]
