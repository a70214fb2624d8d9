"""Tool-using environments: :func:`tool` turns typed, docstringed methods into tools; :class:`ToolEnv` runs them."""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar, get_type_hints

import pydantic

from envkit.core.env import Ending, Env, step_ending
from envkit.core.messages import Message

F = TypeVar("F", bound=Callable[..., Any])

_TOOL_MARK = "__envkit_tool__"

ArgumentValidation = Literal["strict", "lax", "none"]
"""How :class:`ToolEnv` checks a tool call's arguments before the call (:attr:`ToolEnv.argument_validation`)."""


class ToolError(Exception):
    """Raise inside a tool for an expected failure (no availability, unknown id, …).

    The message goes back to the model as the tool's result, prefixed with ``Error:``; it counts as a tool error.
    """


class ToolDefinitionError(TypeError):
    """A method marked with :func:`tool` cannot be turned into a tool (missing type hints or docstring)."""


def tool(func: F) -> F:
    """Mark a method of a :class:`ToolEnv` subclass as a tool the model can call.

    The method needs type hints on every argument and a Google-style docstring with an ``Args:`` entry for each
    argument: the tool's JSON schema is built from them with ``transformers.utils.get_json_schema`` (so it renders in
    any chat template), and the model's arguments are validated against the signature with pydantic before the call.
    How strictly is the env's to choose (:attr:`ToolEnv.argument_validation`; by default ``"2"`` is not an ``int``).
    A tool returns a ``str`` (anything else is sent as JSON) and raises :class:`ToolError` for expected failures.
    A method that breaks these rules makes the class definition fail with a :class:`ToolDefinitionError`.
    """
    setattr(func, _TOOL_MARK, True)
    return func


@dataclass(frozen=True)
class ToolSpec:
    """One tool of a :class:`ToolEnv` class: its method name, JSON schema and pydantic argument model."""

    name: str
    schema: dict[str, Any]
    arguments: type[pydantic.BaseModel]


def build_tool_spec(owner: str, func: Callable[..., Any]) -> ToolSpec:
    """Build the schema and argument model of one tool method, or raise :class:`ToolDefinitionError`."""
    where = f"{owner}.{func.__name__}"
    if not inspect.getdoc(func):
        raise ToolDefinitionError(f"tool {where} has no docstring: describe it and each argument under 'Args:'")
    # transformers costs seconds to import: only an env class that defines tools pays for it, not ``import envkit``.
    from transformers.utils import get_json_schema
    from transformers.utils.chat_template_utils import DocstringParsingException, TypeHintParsingException

    try:
        schema = get_json_schema(func)
    except (DocstringParsingException, TypeHintParsingException) as error:
        raise ToolDefinitionError(f"tool {where}: {error}") from None
    try:
        hints = get_type_hints(func)
    except Exception as error:
        raise ToolDefinitionError(f"tool {where}: cannot resolve its type hints ({error})") from None
    fields: dict[str, Any] = {}
    for index, (name, param) in enumerate(inspect.signature(func).parameters.items()):
        if index == 0 and name in ("self", "cls"):
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ToolDefinitionError(f"tool {where}: *args/**kwargs cannot be described to a model")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[name] = (hints[name], default)
    model = pydantic.create_model(  # type: ignore[call-overload]
        f"{func.__name__}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields
    )
    if "function" not in schema:  # older transformers return the bare function schema
        schema = {"type": "function", "function": schema}
    return ToolSpec(name=func.__name__, schema=schema, arguments=model)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def decode_tool_call(
    call: Any, known: Iterable[str], *, null_arguments: bool = False
) -> tuple[str, dict[str, Any], str | None]:
    """A model's tool call checked for shape: ``(name, arguments, error)``, ``error`` the ``Error: …`` text for the
    model (an unknown tool, arguments that are not a JSON object) or ``None``. Never raises for a model's mistake.

    Args:
        call: ``{"function": {"name", "arguments"}}`` (or the function object itself); arguments as a dict or JSON.
        known: The tool names the env offers.
        null_arguments: Read ``"arguments": null`` as no arguments (else it is an error).
    """
    function = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return "invalid_tool_call", {}, f"Error: a tool call must be an object with a function, got {call!r:.200}"
    name = function.get("name")
    names = list(known)
    if not isinstance(name, str) or name not in names:
        available = ", ".join(names) or "none"
        return str(name)[:100], {}, f"Error: unknown tool {str(name)[:100]!r}. Available tools: {available}"
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            return name, {}, f"Error: arguments for {name} are not valid JSON ({error.msg})"
    if arguments is None and null_arguments:
        arguments = {}
    if not isinstance(arguments, dict):
        return name, {}, f"Error: arguments for {name} must be a JSON object, got {type(arguments).__name__}"
    return name, arguments, None


def format_validation_error(tool_name: str, error: pydantic.ValidationError) -> str:
    """A short, model-readable description of what is wrong with a tool call's arguments."""
    problems = []
    for item in error.errors(include_url=False):
        field = ".".join(str(p) for p in item["loc"]) or "arguments"
        if item["type"] == "extra_forbidden":
            problems.append(f"unexpected argument '{field}'")
        elif item["type"] == "missing":
            problems.append(f"missing required argument '{field}'")
        else:
            value = repr(item.get("input"))
            value = value if len(value) <= 60 else value[:57] + "..."
            problems.append(f"'{field}': {item['msg']} (got {value})")
    return f"Error: invalid arguments for {tool_name}: " + "; ".join(problems)


class ToolEnv(Env):
    """An :class:`Env` whose agent acts through tools: methods decorated with :func:`tool`.

    ``step`` runs every tool call of the assistant message in order and returns one ``{"role": "tool"}`` message per
    call. Unknown tools, invalid or missing arguments, malformed calls and exceptions raised inside a tool become tool
    messages with a clear ``Error: …`` string (never an exception out of ``step``), and the episode goes on.

    Two caps keep one turn from flooding the context or the env:

    * :attr:`max_tool_output_chars` — every tool message's content, a result or an error (an error message may echo a
      huge argument), is cut to this many characters, with a note saying how many more there were.
    * :attr:`max_tool_calls_per_turn` — only the first this-many calls of one assistant turn run; each call beyond it
      gets an ``Error: too many tool calls …`` tool message instead and counts as a tool error.

    An assistant turn without tool calls goes to :meth:`on_text`: return messages to continue (a simulated user's
    reply) or ``None`` to end the episode (the default). A tool may end the episode with :meth:`end_episode`, naming
    an :class:`~envkit.core.env.Ending` when the episode is cut rather than finished. With :attr:`max_tool_errors` set,
    the episode ends (:attr:`~envkit.core.env.Ending.TOO_MANY_ERRORS`) once that many tool calls have failed.

    The step reward is the change in :meth:`score`, so the rewards of an episode add up to its final score.
    """

    max_tool_output_chars: ClassVar[int] = 8000
    """Tool message contents (results and errors) longer than this are cut, with a note saying so."""

    max_tool_calls_per_turn: ClassVar[int] = 16
    """At most this many tool calls of one assistant turn are run; the rest are answered with an error."""

    argument_validation: ClassVar[ArgumentValidation] = "strict"
    """How a call's arguments are checked against the tool's type hints before the tool runs:

    * ``"strict"`` (the default): as the JSON the model wrote, converted only where JSON has no such type (a list
      for a ``tuple``, a string for an enum; an integer for a ``float``); ``"2"`` or ``2.0`` for an ``int``,
      ``1`` for a ``bool``, ``5`` for a ``str`` are errors the model reads (pydantic's strict mode on JSON input).
    * ``"lax"``: pydantic's lax mode: ``"2"`` and ``2.0`` become ``2``, ``"yes"`` becomes ``True``.
    * ``"none"``: no check: the tool gets the model's values as they are, as an API that calls its functions
      directly would (a wrong type then fails inside the tool, or is used as it is; τ²-bench's envs do this,
      because τ²-bench does).

    Strict is the default because an env teaches what it accepts: a policy trained where ``"2"`` passes for an int
    writes ``"2"``, and a typed API rejects it; a strict error names the argument and the expected type, which is
    cheap to learn from. Choose ``"lax"`` for a tool whose real counterpart coerces, ``"none"`` to reproduce an
    upstream that does not validate."""

    max_tool_errors: ClassVar[int | None] = None
    """End the episode (:attr:`~envkit.core.env.Ending.TOO_MANY_ERRORS`, truncated) after the turn that brings the
    episode's failed tool calls (:attr:`episode_tool_errors`) to this many; ``None`` (the default): no cap."""

    episode_tool_errors: int
    """Tool calls of the current episode that failed (each step counts its own in ``info["tool_errors"]``)."""

    _tool_specs: ClassVar[dict[str, ToolSpec]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        specs: dict[str, ToolSpec] = {}
        for klass in reversed(cls.__mro__):
            for name, member in vars(klass).items():
                if getattr(member, _TOOL_MARK, False):
                    specs[name] = build_tool_spec(klass.__name__, member)
                elif name in specs:  # overridden by a non-tool attribute
                    del specs[name]
        cls._tool_specs = specs

    def __init__(self) -> None:
        super().__init__()
        self._last_score = 0.0
        self._end_requested: Ending | None = None
        self.episode_tool_errors = 0

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools as OpenAI-style function schemas, ready for ``apply_chat_template(tools=...)``."""
        return [spec.schema for spec in self._tool_specs.values()]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start a new episode; see :meth:`Env.reset`."""
        observation, info = super().reset(seed=seed, options=options)
        self._last_score = 0.0
        self._end_requested = None
        self.episode_tool_errors = 0
        return observation, info

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Run the tool calls of ``action`` (or :meth:`on_text` when it has none); see :meth:`Env.step`."""
        message: Message = action if isinstance(action, dict) else {"role": "assistant", "content": action}
        calls = message.get("tool_calls") or []
        malformed = message.get("malformed_tool_calls") or []
        info: dict[str, Any] = {"tool_calls": 0, "tool_errors": 0, "malformed_tool_calls": len(malformed)}
        terminated = False
        if not calls and not malformed:
            reply = self.on_text(message)
            observation = [] if reply is None else list(reply)
            terminated = reply is None
        else:
            observation = []
            for bad in malformed:
                info["tool_calls"] += 1
                info["tool_errors"] += 1
                observation.append(self._tool_message("invalid_tool_call", f"Error: could not parse tool call: {bad}"))
            if not isinstance(calls, list):
                calls = [calls]
            limit = self.max_tool_calls_per_turn
            for index, call in enumerate(calls):
                if index < limit:
                    name, content, failed = self.call_tool(call)
                else:
                    name, failed = _call_name(call), True
                    content = (
                        f"Error: too many tool calls in one turn ({len(calls)}); at most {limit} are run per turn "
                        "— this call was skipped"
                    )
                info["tool_calls"] += 1
                info["tool_errors"] += int(failed)
                observation.append(self._tool_message(name, content))
        self.episode_tool_errors += info["tool_errors"]
        if self.max_tool_errors is not None and self.episode_tool_errors >= self.max_tool_errors:
            self.end_episode(Ending.TOO_MANY_ERRORS)
        truncated = False
        if self._end_requested is not None and not self._end_requested.proper:  # cut, not finished
            terminated, truncated = False, True
            info["ending"] = self._end_requested.value
        else:
            terminated = terminated or self._end_requested is not None
        if terminated or truncated:  # known before the step is scored, so the step rewards add up to the score
            self.ending = step_ending(terminated, truncated, info)
        score = self.score()
        reward, self._last_score = score - self._last_score, score
        return observation, reward, terminated, truncated, info

    def on_text(self, message: Message) -> list[Message] | None:
        """Handle an assistant turn without tool calls: messages to continue, or ``None`` to end (the default)."""
        return None

    def end_episode(self, ending: Ending | str = Ending.DONE) -> None:
        """End the episode after the current step (call it from a tool, e.g. ``submit_answer``).

        Args:
            ending: How it ends: :attr:`~envkit.core.env.Ending.DONE` (the default: the step is ``terminated``), or a
                cut (e.g. :attr:`~envkit.core.env.Ending.MAX_STEPS`: the step is ``truncated`` and its info names it).
                Called again in the same step, the last call wins.
        """
        self._end_requested = Ending(ending)

    def call_tool(self, call: Any) -> tuple[str, str, bool]:
        """Run one tool call and return ``(tool name, result text, failed)``; never raises for a model's mistake.

        The text is whole; :meth:`step` caps it at :attr:`max_tool_output_chars` in the tool message.
        """
        name, arguments, error = decode_tool_call(call, self._tool_specs)
        if error is not None:
            return name, error, True
        arguments, error = self.tool_arguments(name, arguments)
        if error is not None:
            return name, error, True
        try:
            result = getattr(self, name)(**arguments)
            if inspect.isawaitable(result):  # an async tool: run it to completion in this (worker) thread
                result = asyncio.run(_awaited(result))
        except ToolError as error:
            return name, f"Error: {error}", True
        except Exception as error:
            return name, f"Error: {name} failed with {type(error).__name__}: {error}", True
        text = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False, default=str)
        return name, text, False

    def tool_arguments(self, name: str, arguments: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        """The keyword arguments tool ``name`` is called with, checked as :attr:`argument_validation` says.

        Args:
            name: A tool of this env.
            arguments: The model's arguments, decoded from JSON.

        Returns:
            ``(keyword arguments, None)`` (defaults filled in unless ``"none"``), or ``({}, error)``: the ``Error: …``
            text for the model when they do not fit the tool's signature.
        """
        if self.argument_validation == "none":
            return dict(arguments), None
        model = self._tool_specs[name].arguments
        try:
            if self.argument_validation == "strict":
                try:
                    text = json.dumps(arguments)
                except (TypeError, ValueError) as error:  # a Python caller's objects: no JSON the model could write
                    return {}, f"Error: arguments for {name} are not JSON values ({error})"
                parsed = model.model_validate_json(text, strict=True)
            else:
                parsed = model.model_validate(arguments)
        except pydantic.ValidationError as error:
            return {}, format_validation_error(name, error)
        return {field: getattr(parsed, field) for field in type(parsed).model_fields}, None

    def _tool_message(self, name: str, content: str) -> Message:
        """The tool message the model sees; the one place every content is capped, so nothing escapes the cap."""
        limit = self.max_tool_output_chars
        if len(content) > limit:
            content = content[:limit] + f"\n[output cut: {len(content) - limit} more characters]"
        return {"role": "tool", "name": name, "content": content}


def _call_name(call: Any) -> str:
    """The function name a (possibly malformed) tool call gives, for the tool message answering it."""
    function = call.get("function", call) if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name[:100] if isinstance(name, str) else "invalid_tool_call"
