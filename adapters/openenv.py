"""OpenEnv envs as envkit envs: ``envkit.make("openenv:ws://HOST:PORT")`` and ``"openenv:package.module:EnvClass"``.

``openenv:ws://HOST:PORT`` (also ``wss://``, ``http(s)://``) talks to a running OpenEnv server through openenv-core's
own client (``GenericEnvClient``: one WebSocket session per env instance, opened on the first ``reset``).
``openenv:package.module:EnvClass`` (or ``path/to/file.py:EnvClass``) runs an OpenEnv ``Environment`` class in this
process — no network — driven the way OpenEnv's server drives it (its MCP session held open, ``step_async`` where
the class has one).

Two kinds of server:

* **An envkit env served by** ``envkit serve-env`` (recognised by the ``envkit`` entry of its state). The consumed env
  is the served one, turn for turn: each assistant turn goes over as one ``{"type": "message"}`` action (content and
  every tool call), the observation is the env's own new messages, reward/terminated/truncated/info are the served
  env's, ``score()`` is its score, ``tools`` its schemas verbatim, ``max_turns`` its own, and ``oracle()`` is its
  oracle, read from the session's state. So ``envkit validate openenv:ws://…`` checks the served env.
* **Any other OpenEnv MCP env.** ``tools`` are its MCP tools (``list_tools``) as OpenAI function schemas; each tool
  call of a turn is one ``call_tool`` step (its text result, or ``Error: …``, is the tool message; at most
  ``max_tool_calls_per_turn`` per turn, unknown tools and bad JSON answered locally, as in :class:`envkit.ToolEnv`).
  A turn without tool calls ends the episode (such envs have no way to answer text). The opening messages come from
  the reset observation: its ``messages`` when it has chat messages, else one user message with its ``prompt`` /
  ``text`` / ``message`` / ``content`` / ``question`` / ``instruction`` / ``task`` string, else the observation as
  JSON (``system_prompt=`` prepends a system message). ``score()`` is the sum of the rewards so far, clipped to
  [0, 1]; an episode ends when a step says ``done``; ``max_turns`` defaults to 10. There is no oracle.

Constructor arguments: ``timeout_s`` (seconds per server reply, default 60), ``max_turns`` and ``system_prompt``
(other OpenEnv envs); for ``package.module:EnvClass`` any other keyword goes to ``EnvClass(...)``. ``close()`` ends
the session (it also ends when the env is garbage-collected). A session the server closed (its idle timeout, a restart)
is reopened by the next ``reset``, and mid-episode, for a served envkit env, restored: a new session is reset with the
episode's seed and its turns are replayed (envkit envs are deterministic given both; ``envkit validate`` checks it).
Instances copy and pickle by spec the same way: a copy opens its own session and replays the episode's actions.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import math
import os
import re
import threading
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

from envkit.core import Env
from envkit.messages import Message
from envkit.registry import EnvSpecError, make
from envkit.tools import ToolEnv

_URL = re.compile(r"^(wss?|https?)://[^/\s]+", re.IGNORECASE)

TEXT_KEYS = ("prompt", "text", "message", "content", "question", "instruction", "task")
"""Reset-observation fields that can be a task's text (first one that is a non-empty string wins)."""

DEFAULT_MAX_TURNS = 10


class OpenEnvConnectionError(ConnectionError):
    """The OpenEnv server cannot be reached, or the session's connection broke; the message names the URL."""


# ---- one event loop for every remote session of this process ---------------------------------------------------------
class _Loop:
    """A daemon thread running the asyncio loop that every OpenEnv client of this process lives on (per pid: a forked
    worker starts its own)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None
    _pid: int | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._pid != os.getpid() or not cls._loop.is_running():
                loop = asyncio.new_event_loop()
                ready = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(ready.set)
                    loop.run_forever()

                threading.Thread(target=run, name="envkit-openenv-loop", daemon=True).start()
                ready.wait(10)
                cls._loop, cls._pid = loop, os.getpid()
            return cls._loop

    @classmethod
    def run(cls, coroutine: Any, timeout_s: float | None = None) -> Any:
        """Run ``coroutine`` on the loop and wait for its result (from any thread but the loop's own)."""
        future = asyncio.run_coroutine_threadsafe(coroutine, cls.get())
        try:
            return future.result(timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    @classmethod
    def submit(cls, coroutine: Any) -> None:
        """Start ``coroutine`` on the loop without waiting (cleanup from finalizers)."""
        loop = cls._loop
        if loop is not None and cls._pid == os.getpid() and loop.is_running():
            asyncio.run_coroutine_threadsafe(coroutine, loop)
        else:
            coroutine.close()


# ---- sessions: the OpenEnv wire format (observation dicts) over a server or an in-process Environment ----------------
class _RemoteSession:
    """One OpenEnv WebSocket session through openenv-core's ``GenericEnvClient``."""

    def __init__(self, url: str, timeout_s: float) -> None:
        from openenv.core.generic_client import GenericEnvClient

        self.url = url
        self.timeout_s = timeout_s
        self.client = GenericEnvClient(
            base_url=url, connect_timeout_s=min(timeout_s, 10.0), message_timeout_s=timeout_s
        )

    def _run(self, coroutine: Any) -> Any:
        try:
            return _Loop.run(coroutine, self.timeout_s + 5.0)
        except RuntimeError as error:  # OpenEnv's client: "Server error: … (code: …)"
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
        try:
            _Loop.run(self.client.connect(), self.timeout_s + 5.0)
        except Exception as error:
            raise OpenEnvConnectionError(
                f"cannot reach the OpenEnv server at {self.url} ({_reason(error)}); start it "
                "(e.g. `envkit serve-env ENV --port PORT`) or check the URL"
            ) from None

    def reset(self, **kwargs: Any) -> dict[str, Any]:
        result = self._run(self.client.reset(**kwargs))
        return {"observation": result.observation, "reward": result.reward, "done": result.done}

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        result = self._run(self.client.step(action))
        return {"observation": result.observation, "reward": result.reward, "done": result.done}

    def state(self) -> dict[str, Any]:
        return dict(self._run(self.client.state()) or {})

    def close(self) -> None:
        with contextlib.suppress(Exception):
            _Loop.run(self.client.close(), 10.0)

    def close_soon(self) -> None:
        _Loop.submit(_quietly(self.client.close()))


class _LocalSession:
    """An OpenEnv ``Environment`` instance in this process, driven as OpenEnv's server drives a session's env."""

    def __init__(self, cls: type, config: dict[str, Any], timeout_s: float) -> None:
        self.env = cls(**config)
        self.timeout_s = timeout_s
        self.stack: contextlib.AsyncExitStack | None = None

    def open(self) -> None:
        factory = getattr(self.env, "mcp_session", None)
        if callable(factory):  # OpenEnv's server holds the env's MCP session open for the session's lifetime

            async def enter() -> contextlib.AsyncExitStack:
                stack = contextlib.AsyncExitStack()
                await stack.enter_async_context(factory())
                return stack

            self.stack = _Loop.run(enter(), self.timeout_s)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.serialization import serialize_observation

        asynchronous = getattr(type(self.env), f"{name}_async", None)
        if asynchronous is not None and asynchronous is not getattr(Environment, f"{name}_async"):
            function = getattr(self.env, f"{name}_async")
            observation = _Loop.run(function(*args, **_accepted(function, kwargs)), self.timeout_s)
        else:
            function = getattr(self.env, name)
            observation = function(*args, **_accepted(function, kwargs))
        return serialize_observation(observation)

    def reset(self, **kwargs: Any) -> dict[str, Any]:
        return self._call("reset", **kwargs)

    def step(self, action: dict[str, Any]) -> dict[str, Any]:
        from openenv.core.env_server.serialization import deserialize_action
        from openenv.core.env_server.types import Action

        return self._call("step", deserialize_action(action, Action))

    def state(self) -> dict[str, Any]:
        state = self.env.state
        return state.model_dump() if hasattr(state, "model_dump") else dict(state or {})

    def close(self) -> None:
        stack, self.stack = self.stack, None
        if stack is not None:
            with contextlib.suppress(Exception):
                _Loop.run(stack.aclose(), 10.0)
        with contextlib.suppress(Exception):
            self.env.close()

    def close_soon(self) -> None:
        stack, self.stack = self.stack, None
        if stack is not None:
            _Loop.submit(_quietly(stack.aclose()))
        with contextlib.suppress(Exception):
            self.env.close()


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
    max_turns: ClassVar[int] = DEFAULT_MAX_TURNS

    def __init__(
        self,
        *,
        timeout_s: float = 60.0,
        max_turns: int | None = None,
        system_prompt: str | None = None,
        **env_config: Any,
    ) -> None:
        super().__init__()
        if env_config and self.openenv_class is None:
            raise TypeError(
                f"unexpected argument(s) {', '.join(sorted(env_config))}: an OpenEnv server env takes timeout_s, "
                "max_turns and system_prompt"
            )
        if not timeout_s > 0:
            raise ValueError("timeout_s must be a positive number of seconds")
        if max_turns is not None:
            if int(max_turns) < 1:
                raise ValueError("max_turns must be at least 1")
            self.max_turns = int(max_turns)  # type: ignore[misc]
        self._init_kwargs = {"timeout_s": timeout_s, "max_turns": max_turns, "system_prompt": system_prompt}
        self._init_kwargs.update(env_config)
        self._env_config = env_config
        self.timeout_s = float(timeout_s)
        self.system_prompt = system_prompt
        self._session: _RemoteSession | _LocalSession | None = None
        self._finalizer: weakref.finalize | None = None
        self._instance_served: dict[str, Any] | None = None
        self._instance_tools: list[dict[str, Any]] | None = None
        self._score = 0.0
        self._rewards = 0.0
        self._ended = False
        self._task_seed: int | None = None
        self._options: Any = None

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
        served, tools = describe(self._open())
        self._instance_served, self._instance_tools = served, tools
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
        self._score, self._rewards, self._ended = 0.0, 0.0, False
        observation = payload.get("observation") or {}
        if self.envkit_served is not None:
            self._score = _unit(observation.get("score", 0.0))
            messages = list(observation.get("messages") or [])
            return messages, dict(observation.get("info") or {})
        self._rewards = _number(payload.get("reward"))
        self._score = _unit(self._rewards)
        return opening_messages(observation, self.system_prompt), {}

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """One assistant turn: a served envkit env takes it whole; other OpenEnv envs get one MCP call per tool call."""
        if self.envkit_served is None:
            return super().step(action)
        message = _jsonable(action)
        payload = self._request(lambda s: s.step({"type": "message", "message": message}), restore=self.turns - 1)
        observation = payload.get("observation") or {}
        self._score = _unit(observation.get("score", self._score))
        truncated = bool(observation.get("truncated"))
        terminated = bool(payload.get("done")) and not truncated
        messages = list(observation.get("messages") or [])
        return messages, _number(payload.get("reward")), terminated, truncated, dict(observation.get("info") or {})

    def call_tool(self, call: Any) -> tuple[str, str, bool]:
        """One tool call as one OpenEnv ``call_tool`` step; ``(name, result text, failed)``."""
        function = call.get("function", call) if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return "invalid_tool_call", f"Error: a tool call must be an object with a function, got {call!r:.200}", True
        name = function.get("name")
        known = [t["function"]["name"] for t in self.tools]
        if not isinstance(name, str) or name not in known:
            return (
                str(name)[:100],
                f"Error: unknown tool {str(name)[:100]!r}. Available tools: {', '.join(known)}",
                True,
            )
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as error:
                return name, f"Error: arguments for {name} are not valid JSON ({error.msg})", True
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            return name, f"Error: arguments for {name} must be a JSON object, got {type(arguments).__name__}", True
        if self._ended:
            return name, "Error: the episode has ended; this call was not run", True
        payload = self._request(lambda s: s.step({"type": "call_tool", "tool_name": name, "arguments": arguments}))
        self._rewards += _number(payload.get("reward"))
        if payload.get("done"):
            self._ended = True
            self.end_episode()
        text, failed = tool_result_text(payload.get("observation") or {})
        return name, text, failed

    def score(self) -> float:
        """The served env's score; for other OpenEnv envs the rewards so far, clipped to [0, 1]."""
        return self._score if self.envkit_served is not None else _unit(self._rewards)

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


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def _unit(value: Any) -> float:
    return min(1.0, max(0.0, _number(value)))


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
    env's tools as OpenAI function schemas."""
    try:
        state = session.state()
    except OpenEnvConnectionError:
        raise
    except Exception:
        state = {}
    served = state.get("envkit") if isinstance(state, dict) else None
    if isinstance(served, dict) and isinstance(served.get("tools"), list):
        return served, [dict(t) for t in served["tools"]]
    payload = session.step({"type": "list_tools"})
    tools = (payload.get("observation") or {}).get("tools") or []
    return None, [to_function_schema(t) for t in tools if isinstance(t, dict) and t.get("name")]


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
        text = next((observation[k] for k in TEXT_KEYS if isinstance(observation.get(k), str) and observation[k]), None)
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
            served, tools = describe(session)
        except Exception as error:
            raise EnvSpecError(
                f"{spec}: the OpenEnv server at {url} did not describe its env ({_reason(error)})"
            ) from None
        finally:
            session.close()
        attributes: dict[str, Any] = {"url": url, "served": served, "openenv_tools": tools}
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
        from envkit.registry import _load_file

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
