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
  ``truncated``. A call on which the env itself failed (it raised, or timed out) is OpenEnv's tool ``error``, with
  ``done`` true and no ``reward``: the episode has failed, and a client stepping on would count zeros.
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
  otherwise hand any agent the answer; turn it on to validate the served env through OpenEnv; ``oracle_error`` when
  the env's ``oracle()`` raised); with it, also
  ``canaries``, the env's ``canaries()`` read at the latest reset (a canary shows the answer as the oracle does), and
  ``canaries_error`` when that raised. ``envkit`` says what is withheld without it (``oracle_withheld``,
  ``canaries_withheld``) and ``client_warnings``: tools with an argument OpenEnv's ``MCPToolClient.call_tool(name,
  **kwargs)`` cannot pass (``name``), which clients send as ``CallToolAction(tool_name=..., arguments={...})``.

``score`` is the env's ``score()`` as it returned it (a finite number, unclipped). When ``score()`` raises, or returns
something that is not a finite number, ``score`` is ``null`` and ``score_error`` says what happened
(``"ValueError: …"``): ``envkit.make("openenv:ws://…")`` raises it from its own ``score()``, so the episode fails as it
would in-process rather than scoring 0. A step reward that is not a finite number is an error of the step.

Where the envs run: each session's env lives in a worker process, never in the server's own, every call on it has a
deadline (``step_timeout_s``, ``--step-timeout``; past it the session fails and its worker is retired), and the
workers run under kernel limits (``RLIMIT_CPU``, ``RLIMIT_AS``): :mod:`envkit.serving.hosted`. So a call stuck in C
holding the GIL fails its own session while the others, new handshakes and ``/health`` go on. ``state`` reports the
env as of its latest call (it is read on the server's event loop, which never waits for a worker).

Limits: ``session_timeout_s`` closes a WebSocket whose client has sent nothing for that long (so half-open sockets
cannot hold a session slot; OpenEnv's own idle reaper gets the same timeout for its HTTP MCP sessions), and
``max_message_bytes`` bounds every incoming WebSocket message (closed with code 1009) and HTTP body (413).
"""

from __future__ import annotations

import functools
import threading
import uuid
from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import (
    RESERVED_TOOL_NAMES,
    CallToolAction,
    CallToolObservation,
)
from openenv.core.env_server.types import Action, ConcurrencyConfig, Observation, State

from envkit.adapters.openenv.protocol import (
    END_ACTION,
    MESSAGE_ACTION,
    RESPOND_TOOL,
    EnvkitEndAction,
    EnvkitMessageAction,
    EnvkitObservation,
    EnvkitToolObservation,
    NotResetError,
    call_tool_clashes,
    envkit_tool,
)
from envkit.registry import EnvSpecError
from envkit.serving import hosted
from envkit.serving.asgi import DEFAULT_MAX_MESSAGE_BYTES, Limits, RunningServer, listen, start_server
from envkit.serving.hosted import (
    DEFAULT_CPU_LIMIT_S,
    DEFAULT_MEMORY_LIMIT_BYTES,
    DEFAULT_STEP_TIMEOUT_S,
    EnvState,
    ServedEnvs,
    SessionFailed,
    jsonable,
)
from envkit.util.children import ResourceLimits
from envkit.util.install import version as installed_version

__all__ = [
    "DEFAULT_CPU_LIMIT_S",
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MEMORY_LIMIT_BYTES",
    "DEFAULT_SESSION_TIMEOUT_S",
    "DEFAULT_STEP_TIMEOUT_S",
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
    "ServedEnvs",
    "SessionFailed",
    "call_tool_clashes",
    "create_envkit_app",
    "jsonable",
    "listen",
    "start_server",
]

DEFAULT_MAX_SESSIONS = 64
DEFAULT_SESSION_TIMEOUT_S = 300.0
DEFAULT_LIMITS = ResourceLimits(cpu_s=DEFAULT_CPU_LIMIT_S, memory_bytes=DEFAULT_MEMORY_LIMIT_BYTES)
"""The kernel limits on each worker process of a served env by default (``RLIMIT_CPU``, ``RLIMIT_AS``)."""


class EnvkitEnvironment(MCPEnvironment):
    """An envkit env as an OpenEnv MCP environment (one instance per session), the env itself in a worker process
    (:mod:`envkit.serving.hosted`). See the module docstring.

    Args:
        spec: Anything :func:`envkit.make` accepts.
        config: Constructor arguments of the envkit env.
        expose_oracle: Put the env's ``oracle()`` into ``state`` (what ``openenv:ws://…`` forwards as its oracle).
            Off by default: any client could read the answer.
        envs: The worker processes to build the env on (:class:`~envkit.serving.hosted.ServedEnvs`; default: a
            pool of its own, for one-off use).
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(
        self,
        spec: str,
        config: dict[str, Any] | None = None,
        *,
        expose_oracle: bool = False,
        envs: ServedEnvs | None = None,
    ) -> None:
        envs = envs or ServedEnvs(spec, config, sessions=1)
        self.hosted = envs.open()
        try:
            described = self.hosted.call(hosted.describe, expose_oracle, what="construction")
            tools = described["tools"]
            names = [t.get("function", {}).get("name") for t in tools]
            clash = sorted(set(names) & (RESERVED_TOOL_NAMES | {RESPOND_TOOL}))
            if clash:
                raise EnvSpecError(
                    f"{spec}: tool name(s) {', '.join(clash)} are reserved by OpenEnv/envkit serve-env "
                    f"({', '.join(sorted(RESERVED_TOOL_NAMES | {RESPOND_TOOL}))}); rename the tool"
                )
        except BaseException:
            self.hosted.close()
            raise
        server = FastMCP(name=f"envkit:{spec}")
        for schema in tools:
            function = schema.get("function", {})
            parameters = function.get("parameters") or {"type": "object", "properties": {}}
            server.add_tool(envkit_tool(function["name"], function.get("description", ""), parameters, self._run_tool))
        server.add_tool(
            envkit_tool(
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
        self.spec = spec
        self.expose_oracle = expose_oracle
        self.episode_id: str | None = None
        self.env_state: EnvState = described["state"]
        """The env's state as of its latest call (what ``state`` reports without asking the worker)."""
        self._lock = threading.RLock()
        self._last: tuple[list[Any], float, bool, bool, dict[str, Any]] | None = None
        self.info = {
            "version": installed_version(),
            "spec": spec,
            "class": described["class"],
            "max_turns": described["max_turns"],
            "tools": tools,
            "respond_tool": RESPOND_TOOL,
            "message_action": MESSAGE_ACTION,
            "end_action": END_ACTION,
            "requires_proper_ending": described["requires_proper_ending"],
            "has_oracle": described["has_oracle"],
            "oracle_withheld": described["oracle_withheld"],
            "has_canaries": bool(expose_oracle and described["defines_canaries"]),
            "canaries_withheld": bool(not expose_oracle and described["defines_canaries"]),
            "client_warnings": call_tool_clashes(tools),
        }
        self.canaries: tuple[Any, str | None] | None = None
        """The canaries of the current task and why ``canaries()`` failed, read at reset (only with the oracle
        exposed: a canary shows the answer as the oracle does)."""
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
            messages, info, self.env_state = self.hosted.call(
                hosted.reset, seed, options, self.expose_oracle, what="reset()"
            )
            self.episode_id = episode_id or uuid.uuid4().hex
            self._last = None
            self.canaries = None
            if self.info["has_canaries"]:
                self.canaries = self.hosted.call(hosted.canaries, what="canaries()")
            return EnvkitObservation(
                messages=messages,
                info=info,
                score=self.env_state.score,
                score_error=self.env_state.score_error,
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
        return EnvkitObservation(
            messages=observation,
            reward=reward,
            done=terminated or truncated,
            truncated=truncated,
            score=self.env_state.score,
            score_error=self.env_state.score_error,
            info=info,
        )

    @property
    def state(self) -> State:
        """Episode id, turns, score, done, the env's description (``envkit``) and its ``oracle()``, as of the env's
        latest call (read on the server's event loop: it never waits for the worker)."""
        known = self.env_state
        return State(
            episode_id=self.episode_id,
            step_count=known.turns,
            turns=known.turns,
            score=known.score,
            score_error=known.score_error,
            done=known.done,
            envkit=self.info,
            oracle=known.oracle,
            oracle_error=known.oracle_error,
            canaries=None if self.canaries is None else self.canaries[0],
            canaries_error=None if self.canaries is None else self.canaries[1],
        )

    def close(self) -> None:
        """Close the envkit env (in its worker, without waiting) and OpenEnv's MCP client."""
        try:
            self.hosted.close()
        finally:
            super().close()

    # ---- envkit turns ----------------------------------------------------------------------------------------------
    def _end(self, ending: str) -> EnvkitObservation:
        """Tell the env how its episode ended (``env.end``) and send back the score it gives then."""
        with self._lock:
            if self.episode_id is None:
                raise NotResetError("reset the env before ending its episode")
            told, proper, self.env_state = self.hosted.call(hosted.end, ending, self.expose_oracle, what="end()")
            self._last = None
            return EnvkitObservation(
                messages=[],
                reward=None,
                done=True,
                truncated=not proper,
                score=self.env_state.score,
                score_error=self.env_state.score_error,
                info={"ending": told if told is not None else ending},
            )

    def _turn(self, message: dict[str, Any] | str) -> tuple[list[Any], float, bool, bool, dict[str, Any]]:
        with self._lock:
            if self.episode_id is None:
                raise NotResetError("reset the env before stepping it")
            *outcome, self.env_state = self.hosted.call(hosted.turn, message, self.expose_oracle, what="step()")
            self._last = (outcome[0], outcome[1], outcome[2], outcome[3], outcome[4])
            return self._last

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
        messages, reward, terminated, truncated, info = self._last or ([], 0.0, self.env_state.done, False, {})
        if self._last is None and observation.error is not None:
            # The turn raised in the env (not the agent's mistake, which is a tool result): the episode has failed. A
            # client stepping with CallToolAction must not read it as a turn worth 0 and go on.
            reward, terminated = None, True
        return EnvkitToolObservation(
            tool_name=observation.tool_name,
            result=observation.result,
            error=observation.error,
            messages=messages,
            reward=reward,
            done=bool(terminated or truncated),
            truncated=truncated,
            score=self.env_state.score,
            score_error=self.env_state.score_error,
            info=info,
        )


def create_envkit_app(
    spec: str,
    config: dict[str, Any] | None = None,
    *,
    max_sessions: int = DEFAULT_MAX_SESSIONS,
    session_timeout_s: float | None = DEFAULT_SESSION_TIMEOUT_S,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    expose_oracle: bool = False,
    step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
    env_processes: int | None = None,
    limits: ResourceLimits | None = DEFAULT_LIMITS,
) -> Any:
    """The ASGI app serving ``spec`` over OpenEnv: OpenEnv's ``create_app`` inside :class:`Limits`, each session's env
    in a worker process (:class:`~envkit.serving.hosted.ServedEnvs`; the app's ``envs``, closed when the server shuts
    down).

    One env is built first, so a bad spec or config fails here (:class:`envkit.EnvSpecError`), not per session.

    Args:
        spec: Anything :func:`envkit.make` accepts.
        config: Constructor arguments of the env.
        max_sessions: Sessions at once (one env each).
        session_timeout_s: Close a WebSocket whose client sent nothing for this long (None: never).
        max_message_bytes: The largest WebSocket message or HTTP body.
        expose_oracle: Put the env's ``oracle()`` in ``state`` (for validating the served env only).
        step_timeout_s: Seconds one env call may take; past it the session fails and its worker is retired.
        env_processes: Worker processes at most (default: ``min(max_sessions, max(4, 2 × cores))``).
        limits: Kernel limits on each worker process (None: none).

    Returns:
        The ASGI app (a :class:`Limits`); its ``warnings`` are what OpenEnv clients of the env should know
        (:func:`call_tool_clashes`), for the server to print at start.
    """
    if max_sessions < 1:
        raise ValueError("max_sessions must be at least 1")
    if session_timeout_s is not None and not session_timeout_s > 0:
        raise ValueError("the session timeout must be a positive number of seconds")
    if max_message_bytes < 1024:
        raise ValueError("the message size limit must be at least 1024 bytes")
    config = dict(config or {})
    envs = ServedEnvs(
        spec, config, sessions=max_sessions, step_timeout_s=step_timeout_s, processes=env_processes, limits=limits
    )
    try:
        probe = EnvkitEnvironment(spec, config, expose_oracle=expose_oracle, envs=envs)
        warnings = list(probe.info["client_warnings"])
        probe.close()
    except EnvSpecError:
        envs.close()
        raise
    except Exception as error:
        envs.close()
        raise EnvSpecError(f"cannot serve {spec}: {type(error).__name__}: {error}") from error
    factory = functools.partial(EnvkitEnvironment, spec, config, expose_oracle=expose_oracle, envs=envs)
    app = create_app(
        factory,
        EnvkitMessageAction,
        EnvkitObservation,
        env_name=spec,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=max_sessions, session_timeout=session_timeout_s),
    )
    limited = Limits(app, max_bytes=max_message_bytes, idle_timeout_s=session_timeout_s, on_shutdown=envs.close)
    limited.envs = envs
    limited.warnings = warnings
    return limited
