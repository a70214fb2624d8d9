"""OpenEnv envs as envkit envs: ``envkit.make("openenv:ws://HOST:PORT")`` and ``"openenv:package.module:EnvClass"``.

``openenv:ws://HOST:PORT`` (also ``wss://``, ``http(s)://``) talks to a running OpenEnv server through OpenEnv's own
client (``openenv`` 0.10's ``GenericEnvClient``, used asynchronously: one WebSocket session per env instance, opened on
the first ``reset``).
``openenv:package.module:EnvClass`` (or ``path/to/file.py:EnvClass``) runs an OpenEnv ``Environment`` class in this
process — no network — driven the way OpenEnv's server drives it (its MCP session held open, ``step_async`` where
the class has one).

Two kinds of server:

* **An envkit env served by** ``envkit serve-env`` (recognised by the ``envkit`` entry of its state). The consumed env
  is the served one, turn for turn: each assistant turn goes over as one ``{"type": "message"}`` action (content and
  every tool call), the observation is the env's own new messages, reward/terminated/truncated/info are the served
  env's, ``score()`` is its score as it returned it (when the served ``score()`` failed, ``score()`` here raises
  :class:`OpenEnvScoreError` with its error: the episode fails as it would in-process), ``tools`` its schemas verbatim,
  ``max_turns`` its own, and ``oracle()`` is its oracle, read from the session's state when the server exposes it
  (``envkit serve-env --expose-oracle``). So ``envkit validate openenv:ws://…`` checks the served env.
* **Any other OpenEnv MCP env.** ``tools`` are its MCP tools (``list_tools``) as OpenAI function schemas; each tool
  call of a turn is one ``call_tool`` step (its text result, or ``Error: …``, is the tool message; at most
  ``max_tool_calls_per_turn`` per turn, unknown tools and bad JSON answered locally, as in :class:`envkit.ToolEnv`).
  A turn without tool calls ends the episode (such envs have no way to answer text). The opening messages come from
  the reset observation: its ``messages`` when it has chat messages, else one user message with its ``prompt`` /
  ``text`` / ``message`` / ``content`` / ``question`` / ``instruction`` / ``task`` string (looked up in the
  observation, then in its ``metadata``, where OpenEnv 0.10's envs put it), else the observation as JSON
  (``system_prompt=`` prepends a system message). ``score()`` is the sum of the rewards so far, mapped linearly from
  ``reward_range=[lo, hi]`` (default [0, 1]) onto [0, 1] — never clipped: a sum outside the range fails the episode; an
  episode ends when a step says ``done``; ``max_turns`` defaults to 10. There is no oracle.
* **A non-MCP OpenEnv env** (one typed action, e.g. the echo env of ``openenv init``): one tool, ``step``, whose
  parameters are the action's JSON schema (the server's ``/schema``, or the class's ``step`` annotation in process);
  each call is one OpenEnv step with those fields as the action, its result the observation's fields as JSON (an
  invalid action is an ``Error: …`` result, as a bad tool call is). Everything else is as for MCP envs. An env whose
  action schema cannot be found is refused in one line.

Constructor arguments: ``timeout_s`` (seconds per server reply, default 60), ``max_turns`` and ``system_prompt``
(other OpenEnv envs); for ``package.module:EnvClass`` any other keyword goes to ``EnvClass(...)``. ``close()`` ends
the session (it also ends when the env is garbage-collected). A session the server closed (its idle timeout, a restart)
is reopened by the next ``reset``, and mid-episode, for a served envkit env, restored: a new session is reset with the
episode's seed and its turns are replayed (envkit envs are deterministic given both; ``envkit validate`` checks it).
Instances copy and pickle by spec the same way: a copy opens its own session and replays the episode's actions.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import json
import math
import re
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

from envkit.core.env import Env
from envkit.core.messages import Message
from envkit.core.tools import ToolEnv, decode_tool_call
from envkit.integrations._adapted import reward_range_config, scaled_score
from envkit.registry import EnvSpecError, make
from envkit.util.background import BackgroundLoop

_URL = re.compile(r"^(wss?|https?)://[^/\s]+", re.IGNORECASE)

TEXT_KEYS = ("prompt", "text", "message", "content", "question", "instruction", "task")
"""Reset-observation fields that can be a task's text (first one that is a non-empty string wins)."""

DEFAULT_MAX_TURNS = 10

STEP_TOOL = "step"
"""The one tool of a non-MCP OpenEnv env: a call is one OpenEnv step, its arguments the action's fields."""


class OpenEnvConnectionError(ConnectionError):
    """The OpenEnv server cannot be reached, or the session's connection broke; the message names the URL."""


class OpenEnvScoreError(RuntimeError):
    """A served envkit env's ``score()`` failed on the server (it raised, or returned no finite number)."""


class OpenEnvActionError(ValueError):
    """A non-MCP OpenEnv env refused an action as invalid (its fields do not match the action's schema)."""


# ---- one event loop for every remote session of this process ---------------------------------------------------------
_LOOP = BackgroundLoop("envkit-openenv-loop")
"""The loop every OpenEnv client of this process lives on."""


# ---- sessions: the OpenEnv wire format (observation dicts) over a server or an in-process Environment ----------------
class _RemoteSession:
    """One OpenEnv WebSocket session through OpenEnv's ``GenericEnvClient``, driven with its async API on the shared
    loop. The client reconnects by itself when the server has closed the socket — onto a new, un-reset server session —
    so a call whose socket is no longer the one this session opened fails with :class:`OpenEnvConnectionError`
    instead (the env then reopens or restores the episode itself)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        from openenv.core.generic_client import GenericEnvClient

        self.url = url
        self.timeout_s = timeout_s
        self.client = GenericEnvClient(
            base_url=url, connect_timeout_s=min(timeout_s, 10.0), message_timeout_s=timeout_s
        )
        self._socket: Any = None

    def _run(self, call: Callable[[], Awaitable[Any]]) -> Any:
        async def guarded() -> Any:
            from websockets.protocol import State

            socket = getattr(self.client, "_ws", None)
            if socket is None or socket is not self._socket or socket.state is not State.OPEN:
                raise OpenEnvConnectionError(
                    f"OpenEnv server {self.url} closed the session (or it broke); it may have timed out idle"
                )
            return await call()

        try:
            return _LOOP.run(guarded(), self.timeout_s + 5.0)
        except OpenEnvConnectionError:
            raise
        except RuntimeError as error:  # OpenEnv's client: "Server error: … (code: …)"
            if "(code: VALIDATION_ERROR)" in str(error):
                raise OpenEnvActionError(f"OpenEnv server {self.url}: {error}") from None
            raise RuntimeError(f"OpenEnv server {self.url}: {error}") from None
        except (ConnectionError, OSError, TimeoutError) as error:
            raise OpenEnvConnectionError(f"OpenEnv server {self.url}: {_reason(error)}") from None
        except Exception as error:
            if type(error).__module__.startswith("websockets"):  # ConnectionClosed and friends
                raise OpenEnvConnectionError(
                    f"OpenEnv server {self.url} closed the session ({_reason(error)}); it may have timed out idle"
                ) from None
            raise

    def open(self) -> None:
        async def connect() -> None:
            await self.client.connect()
            self._socket = getattr(self.client, "_ws", None)
            # OpenEnv accepts every socket, then refuses a session over its limit with an error frame and a close:
            # one state request here turns that into its own error instead of a "closed" one at the first reset.
            await self.client.state()

        try:
            _LOOP.run(connect(), self.timeout_s + 5.0)
        except RuntimeError as error:  # OpenEnv's "Server error: … (code: CAPACITY_REACHED)" and the like
            raise OpenEnvConnectionError(
                f"the OpenEnv server at {self.url} refused a session ({_reason(error)})"
            ) from None
        except (ConnectionError, OSError, TimeoutError) as error:
            raise OpenEnvConnectionError(
                f"cannot reach the OpenEnv server at {self.url} ({_reason(error)}); start it "
                "(e.g. `envkit serve-env ENV --port PORT`) or check the URL"
            ) from None
        except Exception as error:  # the server answered, or the client broke: say what failed, not "unreachable"
            raise OpenEnvConnectionError(
                f"opening a session with the OpenEnv server at {self.url} failed: {type(error).__name__}: "
                f"{_reason(error)}"
            ) from None

    def reset(self, **kwargs: Any) -> dict[str, Any]:
        async def call() -> Any:
            return await self.client.reset(**kwargs)

        return _payload(self._run(call))

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        async def call() -> Any:
            return await self.client.step(action)

        return _payload(self._run(call))

    def state(self) -> dict[str, Any]:
        async def call() -> Any:
            return await self.client.state()

        return dict(self._run(call) or {})

    def action_schema(self) -> dict[str, Any] | None:
        """The action's JSON schema from the server's ``/schema`` (``None`` when it has none)."""
        import httpx

        base = re.sub(r"^ws", "http", self.url, flags=re.IGNORECASE)
        try:
            response = httpx.get(f"{base}/schema", timeout=min(self.timeout_s, 30.0))
            response.raise_for_status()
            schema = response.json().get("action")
        except Exception:
            return None
        return schema if isinstance(schema, dict) else None

    async def _close(self) -> None:
        await self.client.close()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            _LOOP.run(self._close(), 10.0)

    def close_soon(self) -> None:
        _LOOP.submit(_quietly(self._close()))


def _payload(result: Any) -> dict[str, Any]:
    return {"observation": result.observation, "reward": result.reward, "done": result.done}


class _LocalSession:
    """An OpenEnv ``Environment`` instance in this process, driven as OpenEnv's server drives a session's env."""

    def __init__(self, cls: type, config: dict[str, Any], timeout_s: float) -> None:
        self.env = cls(**config)
        self.timeout_s = timeout_s
        self.stack: contextlib.AsyncExitStack | None = None
        self.action_cls = _action_class(cls)

    def open(self) -> None:
        factory = getattr(self.env, "mcp_session", None)
        if callable(factory):  # OpenEnv's server holds the env's MCP session open for the session's lifetime

            async def enter() -> contextlib.AsyncExitStack:
                stack = contextlib.AsyncExitStack()
                await stack.enter_async_context(factory())
                return stack

            self.stack = _LOOP.run(enter(), self.timeout_s)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.serialization import serialize_observation

        asynchronous = getattr(type(self.env), f"{name}_async", None)
        if asynchronous is not None and asynchronous is not getattr(Environment, f"{name}_async"):
            function = getattr(self.env, f"{name}_async")
            observation = _LOOP.run(function(*args, **_accepted(function, kwargs)), self.timeout_s)
        else:
            function = getattr(self.env, name)
            observation = function(*args, **_accepted(function, kwargs))
        return serialize_observation(observation)

    def reset(self, **kwargs: Any) -> dict[str, Any]:
        return self._call("reset", **kwargs)

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        from openenv.core.env_server.serialization import deserialize_action
        from openenv.core.env_server.types import Action
        from pydantic import ValidationError

        try:
            typed = deserialize_action(action, self.action_cls or Action)
        except ValidationError as error:
            raise OpenEnvActionError(_reason(error)) from None
        return self._call("step", typed)

    def action_schema(self) -> dict[str, Any] | None:
        """The JSON schema of the env's own action class (``None`` for MCP envs and unannotated ones)."""
        return self.action_cls.model_json_schema() if self.action_cls is not None else None

    def state(self) -> dict[str, Any]:
        state = self.env.state
        return state.model_dump() if hasattr(state, "model_dump") else dict(state or {})

    def close(self) -> None:
        stack, self.stack = self.stack, None
        if stack is not None:
            with contextlib.suppress(Exception):
                _LOOP.run(stack.aclose(), 10.0)
        with contextlib.suppress(Exception):
            self.env.close()

    def close_soon(self) -> None:
        stack, self.stack = self.stack, None
        if stack is not None:
            _LOOP.submit(_quietly(stack.aclose()))
        with contextlib.suppress(Exception):
            self.env.close()


def _action_class(cls: type) -> type | None:
    """The typed action of a non-MCP OpenEnv Environment class (its ``step`` annotation), else ``None``."""
    import typing

    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.types import Action

    if issubclass(cls, MCPEnvironment):
        return None
    step = getattr(cls, "step", None)
    if step is None or step is Environment.step:
        return None
    try:
        hints = typing.get_type_hints(step)
    except Exception:
        hints = dict(getattr(step, "__annotations__", {}))
    action = hints.get("action")
    if isinstance(action, type) and issubclass(action, Action) and action is not Action:
        from openenv.core.env_server.mcp_types import CallToolAction, ListToolsAction

        return None if issubclass(action, (CallToolAction, ListToolsAction)) else action
    return None


async def _quietly(awaitable: Any) -> None:
    with contextlib.suppress(BaseException):
        await awaitable


def _accepted(function: Callable[..., Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments ``function`` accepts (OpenEnv's server filters reset/step arguments the same way)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return kwargs
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in parameters}


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."


# ---- the envkit env --------------------------------------------------------------------------------------------------
class OpenEnvEnv(ToolEnv):
    """An OpenEnv env as an envkit :class:`~envkit.ToolEnv` (see the module docstring). ``env_class`` makes one
    subclass per spec; its instances each hold one OpenEnv session."""

    envkit_spec: ClassVar[str] = ""
    """The spec the class was built from, e.g. ``"openenv:ws://127.0.0.1:8000"``."""
    url: ClassVar[str | None] = None
    openenv_class: ClassVar[type | None] = None
    served: ClassVar[dict[str, Any] | None] = None
    """The ``envkit`` entry of the server's state when it is ``envkit serve-env`` (else ``None``)."""
    openenv_tools: ClassVar[list[dict[str, Any]] | None] = None
    openenv_action: ClassVar[dict[str, Any] | None] = None
    """A non-MCP server env's action schema (its one tool is :data:`STEP_TOOL`); ``None`` for MCP envs."""
    max_turns: ClassVar[int] = DEFAULT_MAX_TURNS

    def __init__(
        self,
        *,
        timeout_s: float = 60.0,
        max_turns: int | None = None,
        system_prompt: str | None = None,
        reward_range: Any = None,
        **env_config: Any,
    ) -> None:
        super().__init__()
        if env_config and self.openenv_class is None:
            raise TypeError(
                f"unexpected argument(s) {', '.join(sorted(env_config))}: an OpenEnv server env takes timeout_s, "
                "max_turns, system_prompt and reward_range"
            )
        self.reward_range = reward_range_config(reward_range, self.envkit_spec)
        if not timeout_s > 0:
            raise ValueError("timeout_s must be a positive number of seconds")
        if max_turns is not None:
            if int(max_turns) < 1:
                raise ValueError("max_turns must be at least 1")
            self.max_turns = int(max_turns)  # type: ignore[misc]
        self._init_kwargs = {
            "timeout_s": timeout_s,
            "max_turns": max_turns,
            "system_prompt": system_prompt,
            "reward_range": reward_range,
        }
        self._init_kwargs.update(env_config)
        self._env_config = env_config
        self.timeout_s = float(timeout_s)
        self.system_prompt = system_prompt
        self._session: _RemoteSession | _LocalSession | None = None
        self._finalizer: weakref.finalize | None = None
        self._instance_served: dict[str, Any] | None = None
        self._instance_tools: list[dict[str, Any]] | None = None
        self._instance_action: dict[str, Any] | None = None
        self._score: float = 0.0
        self._score_error: str | None = None
        self._rewards = 0.0
        self._ended = False
        self._task_seed: int | None = None
        self._options: Any = None
        if self.openenv_class is not None:  # what the class is (MCP, typed, served) is known before the first reset
            try:
                self._describe()
            except (OpenEnvConnectionError, EnvSpecError):
                raise
            except RuntimeError as error:
                self._drop_session()
                raise EnvSpecError(f"{self.envkit_spec}: {error}") from None

    # ---- what the env is ---------------------------------------------------------------------------------------------
    @property
    def envkit_served(self) -> dict[str, Any] | None:
        """The served envkit env's description when the OpenEnv env is ``envkit serve-env`` (else ``None``)."""
        if self.openenv_class is not None and self._instance_tools is None:
            self._describe()
        return self._instance_served if self.openenv_class is not None else self.served

    @property
    def tools(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The OpenEnv env's tools as OpenAI function schemas (a served envkit env's: its own, verbatim)."""
        if self.openenv_class is not None:
            if self._instance_tools is None:
                self._describe()
            return [dict(t) for t in self._instance_tools or []]
        return [dict(t) for t in self.openenv_tools or []]

    def _describe(self) -> None:
        served, tools, action = _describe(self._open())
        self._instance_served, self._instance_tools, self._instance_action = served, tools, action
        if served is not None and self.__dict__.get("max_turns") is None:
            self.max_turns = int(served.get("max_turns", DEFAULT_MAX_TURNS))  # type: ignore[misc]

    # ---- the session -------------------------------------------------------------------------------------------------
    def _open(self) -> _RemoteSession | _LocalSession:
        if self._session is None:
            if self.openenv_class is not None:
                session: _RemoteSession | _LocalSession = _LocalSession(
                    self.openenv_class, self._env_config, self.timeout_s
                )
            else:
                assert self.url is not None
                session = _RemoteSession(self.url, self.timeout_s)
            session.open()
            self._session = session
            self._finalizer = weakref.finalize(self, session.close_soon)
        return self._session

    def _request(self, call: Callable[[Any], Any], *, reopen: bool = False, restore: int | None = None) -> Any:
        """``call(session)``. When the connection is gone (the server timed the session out, or restarted):
        ``reopen`` retries on a new session; ``restore=N`` (a served envkit env mid-episode) first resets the new
        session with the episode's seed and replays its first N assistant turns, then retries."""
        try:
            return call(self._open())
        except OpenEnvConnectionError:
            if not reopen and (restore is None or self._task_seed is None or self.envkit_served is None):
                raise
            self._drop_session()
            session = self._open()
            if restore is not None:
                kwargs = (
                    {"seed": self._task_seed}
                    if self._options is None
                    else {"seed": self._task_seed, "options": self._options}
                )
                session.reset(**kwargs)
                turns = [m for m in self.messages if m.get("role") == "assistant"][:restore]
                for turn in turns:
                    session.step({"type": "message", "message": _jsonable(turn)})
            return call(session)

    def _drop_session(self) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        session, self._session = self._session, None
        if session is not None:
            session.close()

    def close(self) -> None:
        """End the OpenEnv session (a later ``reset`` opens a new one)."""
        self._drop_session()
        super().close()

    # ---- the episode -------------------------------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Reset the OpenEnv env with the seed (drawn from ``np_random`` when ``None``): its opening messages."""
        super().reset(seed=seed, options=options)
        task_seed = int(seed) if seed is not None else int(self.np_random.integers(2**31 - 1))
        kwargs: dict[str, Any] = {"seed": task_seed}
        if options is not None:
            kwargs["options"] = options
        payload = self._request(lambda s: s.reset(**kwargs), reopen=True)
        self._task_seed, self._options = task_seed, options
        self._score, self._score_error, self._rewards, self._ended = 0.0, None, 0.0, False
        observation = payload.get("observation") or {}
        if self.envkit_served is not None:
            self._served_score(observation)
            messages = list(observation.get("messages") or [])
            return messages, dict(observation.get("info") or {})
        self._rewards = _reward(payload.get("reward"))
        return opening_messages(observation, self.system_prompt), {}

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """One assistant turn: a served envkit env takes it whole; other OpenEnv envs get one MCP call per tool call."""
        if self.envkit_served is None:
            return super().step(action)
        message = _jsonable(action)
        payload = self._request(lambda s: s.step({"type": "message", "message": message}), restore=self.turns - 1)
        observation = payload.get("observation") or {}
        self._served_score(observation)
        truncated = bool(observation.get("truncated"))
        terminated = bool(payload.get("done")) and not truncated
        messages = list(observation.get("messages") or [])
        return messages, _reward(payload.get("reward")), terminated, truncated, dict(observation.get("info") or {})

    def _served_score(self, observation: dict[str, Any]) -> None:
        """The served env's score as it sent it; its error when ``score()`` failed there (raised by :meth:`score`)."""
        error = observation.get("score_error")
        score = observation.get("score")
        if error is None and (isinstance(score, bool) or not isinstance(score, (int, float))):
            error = f"the server sent the score {score!r}, not a number"
        self._score, self._score_error = (0.0, str(error)) if error is not None else (float(score), None)

    def call_tool(self, call: Any) -> tuple[str, str, bool]:
        """One tool call as one OpenEnv ``call_tool`` step (a non-MCP env: one typed step); ``(name, text, failed)``."""
        known = [t["function"]["name"] for t in self.tools]
        name, arguments, error = decode_tool_call(call, known, null_arguments=True)
        if error is not None:
            return name, error, True
        if self._ended:
            return name, "Error: the episode has ended; this call was not run", True
        typed = self._action_schema() is not None
        try:
            if typed:
                payload = self._request(lambda s: s.step(dict(arguments)))
            else:
                action = {"type": "call_tool", "tool_name": name, "arguments": arguments}
                payload = self._request(lambda s: s.step(action))
        except OpenEnvActionError as error:
            if not typed:
                raise
            return name, f"Error: the env refused the action as invalid ({error})", True
        self._rewards += _reward(payload.get("reward"))
        if payload.get("done"):
            self._ended = True
            self.end_episode()
        observation = payload.get("observation") or {}
        if typed:
            return name, observation_text(observation), False
        text, failed = tool_result_text(observation)
        return name, text, failed

    def _action_schema(self) -> dict[str, Any] | None:
        if self.openenv_class is not None:
            if self._instance_tools is None:
                self._describe()
            return self._instance_action
        return self.openenv_action

    def score(self) -> float:
        """The served env's score as its ``score()`` returned it (:class:`OpenEnvScoreError` when that failed on the
        server); for other OpenEnv envs the rewards so far, mapped from ``reward_range`` (default [0, 1]) onto
        [0, 1] — a sum outside the range raises, naming ``reward_range``, rather than being clipped."""
        if self.envkit_served is None:
            return scaled_score(self._rewards, self.reward_range, self.envkit_spec, "sum of rewards")
        if self._score_error is not None:
            raise OpenEnvScoreError(f"the served env's score() failed on the server: {self._score_error}")
        return self._score

    def oracle(self) -> Message | None:
        """A served envkit env's oracle (read from the session's state); ``None`` for other OpenEnv envs."""
        served = self.envkit_served
        if served is None or not served.get("has_oracle") or self._session is None or self.done:
            return None
        return self._request(lambda s: s.state(), restore=self.turns).get("oracle")

    # ---- copies and pickles: by spec ---------------------------------------------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        actions = [m for m in getattr(self, "messages", []) if m.get("role") == "assistant"]
        return _rebuild, (self.envkit_spec, self._init_kwargs, self._task_seed, self._options, actions)


def _rebuild(spec: str, kwargs: dict[str, Any], seed: int | None, options: Any, actions: list[Any]) -> Env:
    """Unpickle an OpenEnv env: a new instance (its own session), reset with the recorded seed, the actions replayed."""
    env = make(spec, **{k: v for k, v in kwargs.items() if v is not None})
    if seed is not None:
        env.reset(seed=seed, options=options)
        for action in actions:
            env.step(action)
    return env


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, ensure_ascii=False, default=str))


def _reward(value: Any) -> float:
    """An OpenEnv step reward: ``None`` (no reward this step) is 0; anything else must be a finite number."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"the OpenEnv env returned the step reward {value!r}: a step reward must be a finite number")
    return float(value)


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


def describe(session: _RemoteSession | _LocalSession) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """``(served, tools)``: the ``envkit`` entry of the state of an ``envkit serve-env`` session (else ``None``) and the
    env's tools as OpenAI function schemas (a non-MCP env's: its one :data:`STEP_TOOL`)."""
    served, tools, _ = _describe(session)
    return served, tools


def _describe(
    session: _RemoteSession | _LocalSession,
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
    action = session.action_schema() if isinstance(session, _LocalSession) else None
    if action is None:
        try:
            payload = session.step({"type": "list_tools"})
        except OpenEnvConnectionError:
            raise
        except Exception as error:
            # A server that cannot read list_tools as its typed action (VALIDATION_ERROR), or an in-process class
            # whose step() fails on it: not an MCP env. Any other server error is the server's own.
            if isinstance(session, _RemoteSession) and not isinstance(error, OpenEnvActionError):
                raise
            action = session.action_schema() if isinstance(session, _RemoteSession) else None
            if action is None:
                raise RuntimeError(
                    f"it is not an MCP env (list_tools failed: {_reason(error)}) and publishes no action schema (a "
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
                raise RuntimeError(f"list_tools gave no tool list (it answered {_reason(ValueError(observation))})")
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


# ---- the adapter entry point -----------------------------------------------------------------------------------------
def env_class(rest: str) -> type[Env]:
    """The envkit env class of ``openenv:REST``: REST is a server URL or ``package.module:EnvClass``."""
    target = rest.strip()
    spec = f"openenv:{rest}"
    if _URL.match(target):
        url = _server_url(target)
        session = _RemoteSession(url, 30.0)
        try:
            session.open()
        except OpenEnvConnectionError as error:
            raise EnvSpecError(f"{spec}: {error}") from None
        try:
            served, tools, action = _describe(session)
        except OpenEnvConnectionError as error:
            raise EnvSpecError(f"{spec}: {error}") from None
        except Exception as error:
            raise EnvSpecError(
                f"{spec}: the OpenEnv server at {url} did not describe its env ({_reason(error)})"
            ) from None
        finally:
            session.close()
        attributes: dict[str, Any] = {"url": url, "served": served, "openenv_tools": tools, "openenv_action": action}
        if served is not None:
            attributes["max_turns"] = int(served.get("max_turns", DEFAULT_MAX_TURNS))
        name = re.sub(r"[^0-9A-Za-z]+", "_", url.split("://", 1)[1]).strip("_")
    else:
        attributes = {"openenv_class": _openenv_class(spec, target)}
        name = attributes["openenv_class"].__name__
    attributes.update(envkit_spec=spec, __module__=__name__, __doc__=f"The OpenEnv env {target} as an envkit env.")
    return type(f"OpenEnv_{name}", (OpenEnvEnv,), attributes)


def _server_url(target: str) -> str:
    url = target.rstrip("/")
    for suffix in ("/ws", "/mcp"):
        if url.endswith(suffix):
            url = url[: -len(suffix)]
    return url


def _openenv_class(spec: str, target: str) -> type:
    from openenv.core.env_server.interfaces import Environment

    module_name, _, class_name = target.rpartition(":")
    if not module_name or not class_name:
        raise EnvSpecError(
            f"{spec}: give a server URL (ws://HOST:PORT) or an OpenEnv Environment class (package.module:EnvClass)"
        )
    if module_name.endswith(".py") or "/" in module_name:
        from envkit.registry.loading import _load_file

        module = _load_file(module_name)
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise EnvSpecError(f"{spec}: cannot import module {module_name!r}: {error}") from None
        except Exception as error:
            raise EnvSpecError(f"{spec}: importing {module_name} failed: {type(error).__name__}: {error}") from None
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        found = sorted(n for n, v in vars(module).items() if isinstance(v, type) and issubclass(v, Environment))
        what = "has no class" if cls is None else "has no OpenEnv Environment subclass"
        known = ", ".join(found) or "none"
        raise EnvSpecError(f"{spec}: {module_name} {what} {class_name!r}; OpenEnv Environment classes there: {known}")
    return cls
