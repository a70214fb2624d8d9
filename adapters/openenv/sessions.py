"""Sessions with an OpenEnv env: a running server through OpenEnv's own client (:class:`RemoteSession`), or an
``Environment`` class in this process driven as OpenEnv's server drives it (:class:`LocalSession`); the errors a
session raises."""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Awaitable, Callable
from typing import Any

from envkit.util.background import BackgroundLoop
from envkit.util.text import one_line

URL_PATTERN = re.compile(r"^(wss?|https?)://[^/\s]+", re.IGNORECASE)


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
class RemoteSession:
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
            raise OpenEnvConnectionError(f"OpenEnv server {self.url}: {reason(error)}") from None
        except Exception as error:
            if type(error).__module__.startswith("websockets"):  # ConnectionClosed and friends
                raise OpenEnvConnectionError(
                    f"OpenEnv server {self.url} closed the session ({reason(error)}); it may have timed out idle"
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
                f"the OpenEnv server at {self.url} refused a session ({reason(error)})"
            ) from None
        except (ConnectionError, OSError, TimeoutError) as error:
            raise OpenEnvConnectionError(
                f"cannot reach the OpenEnv server at {self.url} ({reason(error)}); start it "
                "(e.g. `envkit serve-env ENV --port PORT`) or check the URL"
            ) from None
        except Exception as error:  # the server answered, or the client broke: say what failed, not "unreachable"
            raise OpenEnvConnectionError(
                f"opening a session with the OpenEnv server at {self.url} failed: {type(error).__name__}: "
                f"{reason(error)}"
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


class LocalSession:
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
            raise OpenEnvActionError(reason(error)) from None
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


def reason(error: BaseException) -> str:
    return one_line(error, 300)
