"""MCP tool servers as envkit envs: ``envkit.make("mcp:stdio:COMMAND ARGS...", task=...)`` and
``envkit.make("mcp:http://HOST:PORT/mcp", task=...)``, through the official ``mcp`` Python SDK's client.

The spec names the server: ``mcp:stdio:COMMAND ARGS...`` (or ``mcp:COMMAND ARGS...``; the command line is split as
a shell would, with its environment inherited) starts it as a subprocess and talks MCP over its stdin/stdout;
``mcp:http://…`` / ``mcp:https://…`` connects to a running server over streamable HTTP. Each env instance holds one
MCP session (for stdio: its own server process), opened when the env is built and ended by ``close()`` (or when the
env is garbage-collected).

The env is a :class:`envkit.ToolEnv` whose tools are the server's (``list_tools``; each tool's ``inputSchema`` is the
function's ``parameters``). Each tool call of a turn is one ``call_tool``: the result's text items, joined by newlines,
are the tool message; a result with ``isError`` is an ``Error: …`` tool message and counts as a tool error; unknown
tools and bad JSON are answered locally. ToolEnv's caps apply (``max_tool_calls_per_turn``, ``max_tool_output_chars``).
A failure of the protocol or the transport (the server died, a JSON-RPC error, no reply within ``timeout_s``) is no
tool result: it raises, and the episode fails (over streamable HTTP the SDK's client notices a server that died
mid-call only at the ``timeout_s`` read timeout). A turn without tool calls ends the episode.

An MCP server has tools but no task, so the task comes from the config, in one of two forms:

* ``task="package.module:Class"`` (or ``"path/file.py:Class"``, or the class itself): one instance per env, with
  ``reset(env, seed) -> messages`` (a list of chat messages, or a string: one user message), which may set up the
  server through ``env.run_tool(name, **arguments)``; ``score(env) -> float`` (it may read the server the same way,
  and ``env.messages`` is the transcript); and optionally ``oracle(env) -> message | None``, ``system_prompt`` (a
  string prepended as a system message) and ``max_turns``.
* ``tasks=[{...}, ...]``: task seed ``s`` is ``tasks[s % len(tasks)]``, a dict with ``prompt`` (a string) or
  ``messages`` (chat messages), and ``expect={"tool": NAME, "result": VALUE}``: the score is 1.0 when a call of NAME
  in the episode returned VALUE, else 0.0: a string is compared with the result's text (both stripped), any other JSON
  value with the value the tool returned (its structured content, or its text read as JSON: an object, a list, a
  number, ``None`` for a tool that returns nothing). With ``expect["arguments"]`` as well, the oracle calls NAME with
  them, then answers with the result. A NAME the server does not have, or another key in ``expect``, is refused when
  the env is built.

Other keywords: ``timeout_s`` (seconds per server reply, default 60), ``max_turns`` (default 10),
``system_prompt``, and ``reward_range=[lo, hi]`` (with ``task=`` only: the task's score is mapped from it onto
[0, 1]; default [0, 1]; a score outside it fails the episode instead of being clipped). Copies and pickles are rebuilt
by spec (a new session, reset with the episode's seed, its turns replayed), so process workers work; a server whose
state outlives a session (an HTTP server shared by envs) must be reset per episode by the task class for replays to
agree.
"""

from __future__ import annotations

from envkit.adapters.mcp.client import (
    MCPConnectionError,
    MCPProtocolError,
    MCPSession,
    MCPToolError,
    parse_target,
    result_text,
    to_function_schema,
)
from envkit.adapters.mcp.env import DEFAULT_MAX_TURNS, MCPEnv, env_class

__all__ = [
    "DEFAULT_MAX_TURNS",
    "MCPConnectionError",
    "MCPEnv",
    "MCPProtocolError",
    "MCPSession",
    "MCPToolError",
    "env_class",
    "parse_target",
    "result_text",
    "to_function_schema",
]
