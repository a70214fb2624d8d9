"""Serve any envkit env over the OpenEnv protocol (``envkit serve-env``), built on OpenEnv's own server (``openenv``
0.10).

Each WebSocket session (OpenEnv's ``/ws``) gets its own envkit env inside an :class:`EnvkitEnvironment`, an OpenEnv
``MCPEnvironment``: OpenEnv's ``HTTPEnvServer`` (``create_app``) does the protocol, the sessions and the capacity limit.

What a client can send (OpenEnv's ``{"type": "reset" | "step" | "state" | "close"}`` messages):

* ``reset`` with ``{"seed": int, "options": {...}}`` → an :class:`EnvkitObservation` whose ``messages`` are the env's
  opening messages (and ``info``, ``score``).
* ``step`` with an MCP action, as OpenEnv's ``MCPToolClient`` sends them: ``{"type": "list_tools"}`` lists the env's
  ``@tool`` methods with their JSON schemas; ``{"type": "call_tool", "tool_name": N, "arguments": {...}}`` is one
  envkit assistant turn with that one tool call, stepped through ``env.step`` (the tool message's text is the MCP
  result, an error included: envkit tool errors are results starting ``Error:``, as the model sees them, so OpenEnv's
  clients return them rather than raise). ``reward`` is envkit's step reward (the change in score), ``done`` is
  terminated or truncated; the :class:`EnvkitToolObservation` also carries the new ``messages``, ``score`` and
  ``truncated``.
* Text turns (a turn without tool calls: ``on_text``, e.g. hotel-booking's simulated guest) two ways: the MCP tool
  ``respond(message)`` (listed with the env's tools, so any MCP agent can talk; its result is the reply's text), or
  the action ``{"type": "message", "message": <assistant message or text>}`` — one whole envkit assistant turn,
  content and any number of tool calls, exactly as envkit's own envs take it. ``envkit.make("openenv:ws://…")``
  uses the latter, so an env consumed back through OpenEnv sees the very turns the model produced.
* ``step`` with ``{"type": "end", "ending": <an envkit Ending value>}``: how the episode ended, as the client's rollout
  engine tells it (``"max_turns"``, ``"max_episode_tokens"``, ``"done"``, …): the env's ``end()`` runs, and the
  observation carries the score it gives then (``done``, ``truncated`` unless the ending is ``done``).
  ``envkit.make("openenv:ws://…")`` sends it before its ``score()`` is read, so a served env learns that the engine
  cut its episode exactly as an env in the engine's own process does.
* ``state`` → ``episode_id``, ``step_count``, ``score`` (the final score once ``done``), ``done``, ``turns``, ``envkit``
  (the spec, ``max_turns``, the tool schemas verbatim) and ``oracle``: the env's ``oracle()`` for the current state
  (``None`` unless served with ``expose_oracle=True`` / ``--expose-oracle``: off by default, since a served env would
  otherwise hand any agent the answer; turn it on to validate the served env through OpenEnv).

``score`` is the env's ``score()`` as it returned it (a finite number, unclipped). When ``score()`` raises, or returns
something that is not a finite number, ``score`` is ``null`` and ``score_error`` says what happened
(``"ValueError: …"``): ``envkit.make("openenv:ws://…")`` raises it from its own ``score()``, so the episode fails as it
would in-process rather than scoring 0. A step reward that is not a finite number is an error of the step.

Limits: ``session_timeout_s`` closes a WebSocket whose client has sent nothing for that long (so half-open sockets
cannot hold a session slot; OpenEnv's own idle reaper gets the same timeout for its HTTP MCP sessions), and
``max_message_bytes`` bounds every incoming WebSocket message (closed with code 1009) and HTTP body (413).
"""

from __future__ import annotations

import asyncio
import functools
import importlib.metadata
import json
import math
import numbers
import threading
import uuid
from collections.abc import Callable
from typing import Any, Literal

from fastmcp import FastMCP
from fastmcp.tools import Tool, ToolResult
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import (
    RESERVED_TOOL_NAMES,
    CallToolAction,
    CallToolObservation,
    ListToolsAction,
)
from openenv.core.env_server.types import Action, ConcurrencyConfig, Observation, State
from pydantic import Field, PrivateAttr

from envkit.core.env import Env
from envkit.registry import EnvSpecError, make
from envkit.serving.asgi import DEFAULT_MAX_MESSAGE_BYTES, Limits, RunningServer, listen, start_server

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_SESSION_TIMEOUT_S",
    "END_ACTION",
    "MESSAGE_ACTION",
    "RESPOND_TOOL",
    "EnvkitEndAction",
    "EnvkitEnvironment",
    "EnvkitMessageAction",
    "EnvkitObservation",
    "EnvkitToolObservation",
    "Limits",
    "NotResetError",
    "RunningServer",
    "create_envkit_app",
    "jsonable",
    "listen",
    "start_server",
]

RESPOND_TOOL = "respond"
"""The MCP tool that is a text turn: ``respond(message)`` steps the env with a plain assistant message."""

MESSAGE_ACTION = "message"
"""The ``type`` of the action that is one whole envkit assistant turn."""

END_ACTION = "end"
"""The ``type`` of the action that tells the env how its episode ended (:meth:`envkit.Env.end`)."""

DEFAULT_MAX_SESSIONS = 64
DEFAULT_SESSION_TIMEOUT_S = 300.0

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


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data (what crosses the wire), unknown objects as strings."""
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


class _EnvTool(Tool):
    """An envkit tool as a FastMCP tool: the schema is the env's own, a call is one envkit turn."""

    _envkit_call: Callable[[str, dict[str, Any]], str] | None = PrivateAttr(default=None)

    async def run(self, arguments: dict[str, Any]) -> ToolResult:
        assert self._envkit_call is not None
        text = await asyncio.to_thread(self._envkit_call, self.name, dict(arguments or {}))
        return ToolResult(content=text or "(empty)", structured_content={"result": text})


def _tool(name: str, description: str, parameters: dict[str, Any], run: Callable[[str, dict[str, Any]], str]) -> Tool:
    tool = _EnvTool(name=name, description=description, parameters=parameters, output_schema=_RESULT_SCHEMA)
    tool._envkit_call = run
    return tool


class EnvkitEnvironment(MCPEnvironment):
    """An envkit env as an OpenEnv MCP environment (one instance per session). See the module docstring.

    Args:
        spec: Anything :func:`envkit.make` accepts.
        config: Constructor arguments of the envkit env.
        expose_oracle: Put the env's ``oracle()`` into ``state`` (what ``openenv:ws://…`` forwards as its oracle).
            Off by default: any client could read the answer.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, spec: str, config: dict[str, Any] | None = None, *, expose_oracle: bool = False) -> None:
        env = make(spec, **dict(config or {}))
        tools = jsonable(list(getattr(env, "tools", None) or []))
        names = [t.get("function", {}).get("name") for t in tools]
        clash = sorted(set(names) & (RESERVED_TOOL_NAMES | {RESPOND_TOOL}))
        if clash:
            raise EnvSpecError(
                f"{spec}: tool name(s) {', '.join(clash)} are reserved by OpenEnv/envkit serve-env "
                f"({', '.join(sorted(RESERVED_TOOL_NAMES | {RESPOND_TOOL}))}); rename the tool"
            )
        server = FastMCP(name=f"envkit:{spec}")
        for schema in tools:
            function = schema.get("function", {})
            parameters = function.get("parameters") or {"type": "object", "properties": {}}
            server.add_tool(_tool(function["name"], function.get("description", ""), parameters, self._run_tool))
        server.add_tool(
            _tool(
                RESPOND_TOOL,
                "Say something to the user: a plain assistant turn without tool calls. Returns the user's reply; "
                "'(the conversation has ended)' when there is none and the episode is over.",
                {
                    "type": "object",
                    "properties": {"message": {"type": "string", "description": "What to say."}},
                    "required": ["message"],
                },
                self._run_tool,
            )
        )
        self.env = env
        self.spec = spec
        self.expose_oracle = expose_oracle
        self.episode_id: str | None = None
        self._lock = threading.RLock()
        self._last: tuple[list[Any], float, bool, bool, dict[str, Any]] | None = None
        self.info = {
            "version": importlib.metadata.version("envkit"),
            "spec": spec,
            "class": type(env).__name__,
            "max_turns": int(getattr(env, "max_turns", 10)),
            "tools": tools,
            "respond_tool": RESPOND_TOOL,
            "message_action": MESSAGE_ACTION,
            "end_action": END_ACTION,
            "requires_proper_ending": bool(getattr(env, "requires_proper_ending", False)),
            "has_oracle": bool(expose_oracle and type(env).oracle is not Env.oracle),
        }
        super().__init__(server)

    # ---- OpenEnv's Environment interface ---------------------------------------------------------------------------
    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> EnvkitObservation:
        """Reset the envkit env; the observation's ``messages`` are its opening messages."""
        with self._lock:
            messages, info = self.env.reset(seed=seed, options=options)
            self.episode_id = episode_id or uuid.uuid4().hex
            self._last = None
            score, score_error = self._score()
            return EnvkitObservation(
                messages=jsonable(messages),
                info=jsonable(info),
                score=score,
                score_error=score_error,
                reward=None,
                done=False,
            )

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """OpenEnv's synchronous step (HTTP ``/step``, in-process use)."""
        if isinstance(action, CallToolAction):
            self._last = None
            return self._with_step(super().step(action, timeout_s=timeout_s, **kwargs))
        return super().step(action, timeout_s=timeout_s, **kwargs)

    async def step_async(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """The step of OpenEnv's WebSocket sessions: MCP calls go through FastMCP, as OpenEnv routes them."""
        if isinstance(action, CallToolAction):
            self._last = None
            return self._with_step(await super().step_async(action, timeout_s=timeout_s, **kwargs))
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    def _step_impl(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        """The ``message`` action (one whole envkit assistant turn) and the ``end`` action (how the episode ended)."""
        if isinstance(action, EnvkitEndAction):
            return self._end(action.ending)
        if not isinstance(action, EnvkitMessageAction):
            raise ValueError(
                f"unsupported action {type(action).__name__}: send list_tools, call_tool or "
                f"{{'type': 'message', 'message': ...}}"
            )
        message = action.message
        if not isinstance(message, (dict, str)):
            message = "" if message is None else str(message)
        observation, reward, terminated, truncated, info = self._turn(message)
        score, score_error = self._score()
        return EnvkitObservation(
            messages=jsonable(observation),
            reward=reward,
            done=terminated or truncated,
            truncated=truncated,
            score=score,
            score_error=score_error,
            info=jsonable(info),
        )

    @property
    def state(self) -> State:
        """Episode id, turns, score, done, the env's description (``envkit``) and its ``oracle()``."""
        with self._lock:
            env = self.env
            oracle = None
            if self.info["has_oracle"] and env.messages and not env.done:
                try:
                    oracle = jsonable(env.oracle())
                except Exception:
                    oracle = None
            score, score_error = self._score()
            return State(
                episode_id=self.episode_id,
                step_count=env.turns,
                turns=env.turns,
                score=score,
                score_error=score_error,
                done=env.done,
                envkit=self.info,
                oracle=oracle,
            )

    def close(self) -> None:
        """Close the envkit env and OpenEnv's MCP client."""
        try:
            self.env.close()
        finally:
            super().close()

    # ---- envkit turns ----------------------------------------------------------------------------------------------
    def _end(self, ending: str) -> EnvkitObservation:
        """Tell the env how its episode ended (``env.end``) and send back the score it gives then."""
        with self._lock:
            if self.episode_id is None:
                raise NotResetError("reset the env before ending its episode")
            self.env.end(ending)  # an unknown ending raises ValueError naming the known ones
            self._last = None
            score, score_error = self._score()
            told = self.env.ending
            return EnvkitObservation(
                messages=[],
                reward=None,
                done=True,
                truncated=told is None or not told.proper,
                score=score,
                score_error=score_error,
                info={"ending": told.value if told is not None else ending},
            )

    def _turn(self, message: dict[str, Any] | str) -> tuple[list[Any], float, bool, bool, dict[str, Any]]:
        with self._lock:
            if self.episode_id is None:
                raise NotResetError("reset the env before stepping it")
            outcome = self.env.step(message)
            reward = outcome[1]
            if isinstance(reward, bool) or not isinstance(reward, numbers.Real) or not math.isfinite(reward):
                raise ValueError(f"step() returned the reward {reward!r}: a step reward must be a finite number")
            self._last = outcome
            return outcome

    def _run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        """One MCP tool call as one envkit turn; the tool message's text (``respond``: the reply's)."""
        if name == RESPOND_TOOL:
            text = arguments.get("message", "")
            message: dict[str, Any] = {"role": "assistant", "content": text if isinstance(text, str) else str(text)}
        else:
            call = {"type": "function", "function": {"name": name, "arguments": arguments}}
            message = {"role": "assistant", "content": "", "tool_calls": [call]}
        try:
            observation, _, terminated, truncated, _ = self._turn(message)
        except NotResetError as error:  # only this one is the caller's to read; an env failure stays a failure
            return f"Error: {error}"
        text = "\n\n".join(str(m.get("content") or "") for m in observation if isinstance(m, dict))
        if not text and (terminated or truncated):
            return "(the conversation has ended)"
        return text

    def _with_step(self, observation: Observation) -> Observation:
        """OpenEnv's tool observation plus the envkit step the call was (reward, done, messages, score)."""
        if not isinstance(observation, CallToolObservation):
            return observation
        messages: list[Any]
        messages, reward, terminated, truncated, info = self._last or ([], 0.0, self.env.done, False, {})
        score, score_error = self._score()
        return EnvkitToolObservation(
            tool_name=observation.tool_name,
            result=observation.result,
            error=observation.error,
            messages=jsonable(messages),
            reward=reward,
            done=bool(terminated or truncated),
            truncated=truncated,
            score=score,
            score_error=score_error,
            info=jsonable(info),
        )

    def _score(self) -> tuple[float | None, str | None]:
        """``(score, None)``, or ``(None, why)`` when ``score()`` raised or gave no finite number (never a stand-in)."""
        try:
            value = self.env.score()
        except Exception as error:
            return None, f"{type(error).__name__}: {error}"
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            return None, f"score() returned {value!r}: a score must be a finite number in [0, 1]"
        return float(value), None


def create_envkit_app(
    spec: str,
    config: dict[str, Any] | None = None,
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    session_timeout_s: float | None = DEFAULT_SESSION_TIMEOUT_S,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    expose_oracle: bool = False,
) -> Any:
    """The ASGI app serving ``spec`` over OpenEnv: OpenEnv's ``create_app`` inside :class:`Limits`.

    One env is built first, so a bad spec or config fails here (:class:`envkit.EnvSpecError`), not per session.
    """
    if max_sessions < 1:
        raise ValueError("max_sessions must be at least 1")
    if session_timeout_s is not None and not session_timeout_s > 0:
        raise ValueError("the session timeout must be a positive number of seconds")
    if max_message_bytes < 1024:
        raise ValueError("the message size limit must be at least 1024 bytes")
    config = dict(config or {})
    try:
        EnvkitEnvironment(spec, config, expose_oracle=expose_oracle).close()
    except EnvSpecError:
        raise
    except Exception as error:
        raise EnvSpecError(f"cannot serve {spec}: {type(error).__name__}: {error}") from error
    factory = functools.partial(EnvkitEnvironment, spec, config, expose_oracle=expose_oracle)
    app = create_app(
        factory,
        EnvkitMessageAction,
        EnvkitObservation,
        env_name=spec,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=session_timeout_s),
    )
    return Limits(app, max_bytes=max_message_bytes, idle_timeout_s=session_timeout_s)
