"""The envkit env over an OpenEnv session (:class:`OpenEnvEnv`) and the ``openenv:`` spec that builds its class
(:func:`env_class`)."""

from __future__ import annotations

import importlib
import json
import math
import re
import weakref
from collections.abc import Callable
from typing import Any, ClassVar

from envkit.adapters._adapted import SCORE_RANGE, reward_range_config, scaled_score
from envkit.adapters.openenv.observations import (
    describe_with_action,
    observation_text,
    opening_messages,
    tool_result_text,
)
from envkit.adapters.openenv.sessions import (
    URL_PATTERN,
    LocalSession,
    OpenEnvActionError,
    OpenEnvConnectionError,
    OpenEnvScoreError,
    RemoteSession,
    reason,
)
from envkit.core.env import Ending, Env
from envkit.core.messages import Message
from envkit.core.tools import ToolEnv, decode_tool_call
from envkit.registry import EnvSpecError, make

DEFAULT_MAX_TURNS = 10

WITHHELD = "the served env exposes no oracle (serve-env --expose-oracle)"
"""Why a served envkit env's oracle and canaries do not reach its consumer: the server keeps them to itself."""


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
        self._session: RemoteSession | LocalSession | None = None
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
        ignored = [name for name, value in (("system_prompt", system_prompt), ("reward_range", reward_range)) if value]
        if ignored and self.envkit_served is not None:
            self._drop_session()
            raise EnvSpecError(
                f"{self.envkit_spec}: {' and '.join(ignored)} would be ignored: this server is envkit serve-env, whose "
                "env sends its own opening messages and score; give them to the served env (its --env-config)"
            )

    # ---- what the env is ---------------------------------------------------------------------------------------------
    @property
    def envkit_served(self) -> dict[str, Any] | None:
        """The served envkit env's description when the OpenEnv env is ``envkit serve-env`` (else ``None``)."""
        if self.openenv_class is not None and self._instance_tools is None:
            self._describe()
        return self._instance_served if self.openenv_class is not None else self.served

    @property
    def withheld(self) -> str | None:
        """:data:`WITHHELD` when the served envkit env has an oracle or canaries that its server keeps to itself (it
        was not started with ``--expose-oracle``); ``None`` otherwise (see ``envkit.validate``'s ``ServedEnv``)."""
        served = self.envkit_served
        if served is not None and (served.get("oracle_withheld") or served.get("canaries_withheld")):
            return WITHHELD
        return None

    @property
    def client_warnings(self) -> list[str]:
        """The served envkit env's warnings for OpenEnv clients (tools with an argument ``MCPToolClient.call_tool``
        cannot pass); empty for other OpenEnv envs."""
        served = self.envkit_served
        return [str(w) for w in (served or {}).get("client_warnings") or []]

    @property
    def tools(self) -> list[dict[str, Any]]:  # type: ignore[override]
        """The OpenEnv env's tools as OpenAI function schemas (a served envkit env's: its own, verbatim)."""
        if self.openenv_class is not None:
            if self._instance_tools is None:
                self._describe()
            return [dict(t) for t in self._instance_tools or []]
        return [dict(t) for t in self.openenv_tools or []]

    def _describe(self) -> None:
        served, tools, action = describe_with_action(self._open())
        self._instance_served, self._instance_tools, self._instance_action = served, tools, action
        if served is not None and self.__dict__.get("max_turns") is None:
            self.max_turns = int(served.get("max_turns", DEFAULT_MAX_TURNS))  # type: ignore[misc]

    # ---- the session -------------------------------------------------------------------------------------------------
    def _open(self) -> RemoteSession | LocalSession:
        if self._session is None:
            if self.openenv_class is not None:
                session: RemoteSession | LocalSession = LocalSession(
                    self.openenv_class, self._env_config, self.timeout_s
                )
            else:
                assert self.url is not None
                session = RemoteSession(self.url, self.timeout_s)
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

    def end(self, ending: Ending | str) -> None:
        """Be told how the episode ended (:meth:`envkit.Env.end`). A served envkit env is told too, through the
        session (its own ``end()`` runs there), and its score is read again; unless it ended the episode itself with
        that very ending (it knows it already). Other OpenEnv envs have no such call: their score is their rewards."""
        before = self.ending
        super().end(ending)
        told = self.ending
        served = self.envkit_served
        if told is before or told is None or self._session is None or served is None or not served.get("end_action"):
            return
        action = {"type": served["end_action"], "ending": told.value}
        payload = self._request(lambda s: s.step(action), restore=self.turns)
        self._served_score(payload.get("observation") or {})

    def score(self) -> float:
        """The served env's score as its ``score()`` returned it (:class:`OpenEnvScoreError` when that failed on the
        server); for other OpenEnv envs the rewards so far, mapped from ``reward_range`` (default [0, 1]) onto
        [0, 1] — a final sum outside the range raises, naming ``reward_range``, rather than being clipped. While the
        episode goes on, the sum so far is held inside the range (a step penalty can take it below the range before
        the final reward, and the step reward :class:`~envkit.ToolEnv` reads after each step must not fail the
        episode for it); the final score is checked whole."""
        if self.envkit_served is None:
            rewards = self._rewards
            if self.ending is None and not self._ended:  # mid-episode: step penalties may dip the sum out of range
                lo, hi = self.reward_range or SCORE_RANGE
                rewards = min(max(rewards, lo), hi)
            return scaled_score(rewards, self.reward_range, self.envkit_spec, "sum of rewards")
        if self._score_error is not None:
            raise OpenEnvScoreError(f"the served env's score() failed on the server: {self._score_error}")
        return self._score

    def oracle(self) -> Message | None:
        """A served envkit env's oracle (read from the session's state; what it raised there is raised here);
        ``None`` for other OpenEnv envs."""
        served = self.envkit_served
        if served is None or not served.get("has_oracle") or self._session is None or self.done:
            return None
        state = self._request(lambda s: s.state(), restore=self.turns)
        if state.get("oracle_error"):
            raise RuntimeError(f"the served env's oracle() failed on the server: {state['oracle_error']}")
        return state.get("oracle")

    def _served_canaries(self) -> dict[str, list[Message | str]]:
        """A served envkit env's canaries for the current task (read from the session's state, as the oracle is),
        the ``canaries()`` of classes whose server exposes them (``--expose-oracle``); what the env's ``canaries()``
        raised there is raised here."""
        if self._session is None:
            return {}
        state = self._request(lambda s: s.state(), restore=self.turns)
        if state.get("canaries_error"):
            raise RuntimeError(f"the served env's canaries() failed on the server: {state['canaries_error']}")
        return dict(state.get("canaries") or {})

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


# ---- the adapter entry point -----------------------------------------------------------------------------------------
def env_class(rest: str) -> type[Env]:
    """The envkit env class of ``openenv:REST``: REST is a server URL or ``package.module:EnvClass``."""
    target = rest.strip()
    spec = f"openenv:{rest}"
    if URL_PATTERN.match(target):
        url = _server_url(target)
        session = RemoteSession(url, 30.0)
        try:
            session.open()
        except OpenEnvConnectionError as error:
            raise EnvSpecError(f"{spec}: {error}") from None
        try:
            served, tools, action = describe_with_action(session)
        except OpenEnvConnectionError as error:
            raise EnvSpecError(f"{spec}: {error}") from None
        except Exception as error:
            raise EnvSpecError(
                f"{spec}: the OpenEnv server at {url} did not describe its env ({reason(error)})"
            ) from None
        finally:
            session.close()
        attributes: dict[str, Any] = {"url": url, "served": served, "openenv_tools": tools, "openenv_action": action}
        if served is not None:
            attributes["max_turns"] = int(served.get("max_turns", DEFAULT_MAX_TURNS))
            attributes["requires_proper_ending"] = bool(served.get("requires_proper_ending", False))
            if served.get("has_canaries"):  # the class has canaries() exactly when the served env gives them
                attributes["canaries"] = OpenEnvEnv._served_canaries
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
        from envkit.registry.loading import load_file

        module = load_file(module_name)
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
