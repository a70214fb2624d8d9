"""A small MCP server for envkit's MCP adapter tests, written against the official ``mcp`` SDK only (FastMCP).

``python calc_server.py`` serves over stdio; ``python calc_server.py http PORT`` serves streamable HTTP on
``http://127.0.0.1:PORT/mcp``. Tools: ``add`` and ``divide`` (which raises on a zero divisor), and a per-server
key-value store (``remember`` / ``recall`` / ``forget``) that task classes use for setup and scoring, and tools that
return an object (``divide_whole``) and a list (``digits``). Over stdio only, ``crash``
ends the server process mid-call (a transport failure, not a tool error; over HTTP the SDK's client would only notice
at its read timeout, and ``envkit validate`` calls every tool).
"""

from __future__ import annotations

import os
import sys

from mcp.server.fastmcp import FastMCP

port = int(sys.argv[2]) if len(sys.argv) > 2 else 8000
server = FastMCP("calc", host="127.0.0.1", port=port, log_level="WARNING")
memory: dict[str, str] = {}


@server.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@server.tool()
def divide(a: float, b: float) -> float:
    """Divide a by b."""
    if b == 0:
        raise ZeroDivisionError("division by zero")
    return a / b


@server.tool()
def remember(key: str, value: str) -> str:
    """Store a value under a key."""
    memory[key] = value
    return f"stored {key}"


@server.tool()
def recall(key: str) -> str:
    """Read the value stored under a key."""
    if key not in memory:
        raise KeyError(f"nothing stored under {key!r}")
    return memory[key]


@server.tool()
def forget(key: str) -> None:
    """Remove what is stored under a key (a tool that returns nothing)."""
    memory.pop(key, None)


@server.tool()
def divide_whole(a: int, b: int) -> dict[str, int]:
    """The quotient and remainder of a divided by b (a tool that returns an object)."""
    return {"quotient": a // b, "remainder": a % b}


@server.tool()
def digits(n: int) -> list[int]:
    """The decimal digits of n (a tool that returns a list)."""
    return [int(c) for c in str(abs(n))]


def crash() -> str:
    """End the server process without answering."""
    os._exit(1)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run(transport="streamable-http")
    else:
        server.tool()(crash)
        server.run(transport="stdio")
