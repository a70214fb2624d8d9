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

from envkit.adapters.openenv.env import DEFAULT_MAX_TURNS, OpenEnvEnv, env_class
from envkit.adapters.openenv.observations import (
    STEP_TOOL,
    TEXT_KEYS,
    describe,
    observation_text,
    opening_messages,
    step_tool,
    to_function_schema,
    tool_result_text,
)
from envkit.adapters.openenv.sessions import OpenEnvActionError, OpenEnvConnectionError, OpenEnvScoreError

__all__ = [
    "DEFAULT_MAX_TURNS",
    "STEP_TOOL",
    "TEXT_KEYS",
    "OpenEnvActionError",
    "OpenEnvConnectionError",
    "OpenEnvEnv",
    "OpenEnvScoreError",
    "describe",
    "env_class",
    "observation_text",
    "opening_messages",
    "step_tool",
    "to_function_schema",
    "tool_result_text",
]
