"""Chat messages: the Hugging Face chat-dict format envkit speaks, a Gymnasium space for it, and helpers."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import numpy as np
from gymnasium import spaces

Message = dict[str, Any]
"""A Hugging Face chat message: ``{"role": ..., "content": ...}``.

Assistant tool calls are ``"tool_calls": [{"type": "function", "function": {"name": str, "arguments": dict}}]``;
tool results are ``{"role": "tool", "name": str, "content": str}``.
"""

ROLES = ("system", "user", "assistant", "tool")


def as_assistant_message(action: Message | str) -> Message:
    """Normalise an action: a ``str`` becomes ``{"role": "assistant", "content": str}``; a dict is copied.

    A dict without ``role`` is taken as an assistant message; ``content=None`` becomes ``""``.
    """
    if isinstance(action, str):
        return {"role": "assistant", "content": action}
    if not isinstance(action, dict):
        return {"role": "assistant", "content": "" if action is None else str(action)}
    message = dict(action)
    message.setdefault("role", "assistant")
    if message.get("content") is None:
        message["content"] = ""
    return message


def message_problems(message: Any, roles: Iterable[str] = ROLES) -> list[str]:
    """Everything wrong with one message, as readable strings (empty when it is well-formed)."""
    if not isinstance(message, dict):
        return [f"message is a {type(message).__name__}, not a dict"]
    problems = []
    role = message.get("role")
    if role not in tuple(roles):
        problems.append(f"role {role!r} is not one of {tuple(roles)}")
    content = message.get("content")
    if not isinstance(content, str) and not (content is None and message.get("tool_calls")):
        problems.append(f"{role} message content is {type(content).__name__}, not str")
    if role == "tool" and not isinstance(message.get("name"), str):
        problems.append("tool message has no 'name'")
    for call in message.get("tool_calls") or []:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            problems.append(f"tool call {call!r} has no function name")
    return problems


class MessageSpace(spaces.Space[list[Message]]):
    """The Gymnasium space of chat-message lists (observations) or single assistant messages (actions).

    ``contains`` checks the structure of the messages (role, string content, tool-call shape); ``sample`` draws a
    short random text message, which is all an untrained policy can be expected to emit.
    """

    def __init__(self, roles: tuple[str, ...] = ROLES, max_messages: int | None = None, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)
        self.roles = roles
        self.max_messages = max_messages

    @property
    def is_np_flattenable(self) -> bool:
        """Messages are text: they cannot be flattened into a numpy array."""
        return False

    def contains(self, x: Any) -> bool:
        """Whether ``x`` is a well-formed message list (or, for an action space, one message or a string)."""
        if self.max_messages == 1 and isinstance(x, (dict, str)):
            return isinstance(x, str) or not message_problems(x, self.roles)
        if not isinstance(x, list) or (self.max_messages is not None and len(x) > self.max_messages):
            return False
        return all(not message_problems(m, self.roles) for m in x)

    def sample(self, mask: Any = None, probability: Any = None) -> Any:
        """A random short text message with the first allowed role."""
        length = int(self.np_random.integers(1, 20))
        text = "".join(chr(c) for c in self.np_random.integers(32, 127, size=length, dtype=np.int64))
        message = {"role": self.roles[0], "content": text}
        return message if self.max_messages == 1 else [message]

    def __repr__(self) -> str:
        return f"MessageSpace(roles={self.roles}, max_messages={self.max_messages})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MessageSpace) and (other.roles, other.max_messages) == (self.roles, self.max_messages)


def format_transcript(messages: list[Message], max_chars: int | None = None) -> str:
    """A human-readable transcript: one block per message, tool calls shown as ``name(arguments)``."""
    lines = []
    for message in messages:
        role = message.get("role", "?")
        header = f"[{role}{':' + message['name'] if role == 'tool' and message.get('name') else ''}]"
        body = str(message.get("content") or "")
        if max_chars is not None and len(body) > max_chars:
            body = body[:max_chars] + f"… ({len(body) - max_chars} more chars)"
        calls = [
            f"→ {c['function'].get('name')}({json.dumps(c['function'].get('arguments'), ensure_ascii=False)})"
            for c in message.get("tool_calls") or []
            if isinstance(c, dict) and isinstance(c.get("function"), dict)
        ]
        lines.append("\n".join([header + (" " + body if body else ""), *calls]))
    return "\n".join(lines)
