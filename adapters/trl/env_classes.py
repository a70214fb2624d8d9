"""Classes written for TRL's ``GRPOTrainer(environment_factory=...)``, run unchanged as envkit tool envs:
``envkit.make("trl:package.module:Class", **config)`` (or ``"trl:path/to/file.py:Class"``).

The class is used the way TRL 1.16's ``GRPOTrainer`` uses it:

* **Tools**: every public function on the class (``inspect.getmembers(Class, inspect.isfunction)``, minus ``reset``,
  ``get_reward`` and names starting with ``_``) is a tool, its schema built by ``transformers.utils.get_json_schema``
  from its type hints and Google-style docstring, exactly as for envkit's ``@tool`` (so a method TRL could not
  describe fails here too, at ``envkit.make``). Arguments are validated with pydantic before the call (strict by
  default, :attr:`ToolEnv.argument_validation`; TRL itself passes them unchecked); a result that is not a
  ``str`` is sent as ``str(result)``, as TRL does. Errors follow envkit's convention (a tool message starting
  ``Error:``, never an exception out of ``step``). ``async`` methods are run to completion.
* **Opening messages**: like TRL, ``reset(**row)`` is called with one dataset row; when the row has a ``prompt``
  (a string or a list of chat messages) that is the opening, and the string ``reset`` returns is appended to the last
  user message's content (TRL concatenates them as they are); without a ``prompt`` the returned string is the user
  message. Rows: ``dataset=`` (a list of dicts, a ``datasets.Dataset``, or ``"package.module:NAME"`` naming one or a
  function returning one); task seed ``s`` is row ``s % len(dataset)``. Without ``dataset=`` the row is
  ``{"task_seed": s}`` (what envkit's ``build_dataset`` rows carry, so ``to_environment_factory`` exports read it).
  ``reset(options={"row": {...}})`` passes one row directly.
* **Score**: what TRL would sum into the rollout's reward: ``get_reward()`` when the class defines it (TRL 1.16's
  environment-owned reward, weight 1), plus ``reward_funcs=`` (callables or ``"package.module:function"``, with
  optional ``reward_weights=``), each called TRL-style with one-element lists — ``prompts``, ``completions`` (the
  messages after the opening), ``completion_ids`` (empty), ``environments`` (the instance), every other row column —
  and ``trainer_state=None``, ``log_extra``/``log_metric`` no-ops. ``None`` and NaN rewards are skipped (TRL's
  ``nansum``; nothing given sums to 0). A class with neither fails at ``envkit.make``. The score is read after every
  step (envkit's step reward is its change), so reward code should be cheap and free of side effects.
* **Reward range**: TRL takes any reward; an envkit score is in [0, 1]. The sum is never clipped (a class whose rewards
  run from -1 to 0, or one like TRL's ``grpo_2048`` example whose game score runs from 20 to 32, would score one value
  on every episode: no training signal). Declare the class's range with ``reward_range=[lo, hi]``, mapped linearly
  onto [0, 1]; without it the range is [0, 1]. A sum outside the range fails the episode with a message naming
  ``reward_range``.
* **Episode end**: a turn without tool calls ends the episode (TRL's loop), as does ``max_turns`` (10 by default, TRL's
  ``max_tool_calling_iterations``; ``max_turns=`` to change).

Every other keyword of ``envkit.make`` goes to the class's constructor (TRL calls it without arguments). There is no
oracle: TRL classes have none.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
from collections.abc import Callable
from typing import Any, ClassVar

from envkit.adapters._adapted import ROUNDING, SpecBuilt, class_name, reward_range_config, scaled_score
from envkit.core.messages import Message
from envkit.core.tools import (
    ToolDefinitionError,
    ToolEnv,
    ToolError,
    ToolSpec,
    build_tool_spec,
    decode_tool_call,
)
from envkit.registry import EnvSpecError
from envkit.registry.loading import import_entry_point, load_file

PREFIX = "trl"
RESERVED = ("reset", "get_reward")


def public_methods(cls: type) -> list[tuple[str, Callable[..., Any]]]:
    """The methods TRL's GRPOTrainer exposes as tools: public functions on the class, minus ``reset``/``get_reward``."""
    return [
        (name, member)
        for name, member in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in RESERVED and not name.startswith("_")
    ]


def _load(target: str, what: str) -> Any:
    """``package.module:NAME`` or ``path/to/file.py:NAME``."""
    module_path, _, name = target.rpartition(":")
    if not module_path or not name:
        raise EnvSpecError(f"{what} must be 'package.module:NAME' or 'path/to/file.py:NAME', got {target!r}")
    module = (
        load_file(module_path) if module_path.endswith(".py") or "/" in module_path else import_entry_point(module_path)
    )
    if not hasattr(module, name):
        raise EnvSpecError(f"{module_path} has no {name!r} ({what})")
    return getattr(module, name)


def env_class(rest: str) -> type[TRLEnv]:
    """The env class of ``trl:package.module:Class``."""
    factory = _load(rest.strip(), "trl:package.module:Class")
    if not isinstance(factory, type):
        raise EnvSpecError(f"trl:{rest} is not a class (got {type(factory).__name__}); name the environment class")
    if not callable(getattr(factory, "reset", None)):
        raise EnvSpecError(f"trl:{rest}: {factory.__name__} has no reset method (TRL requires a callable reset)")
    specs: dict[str, ToolSpec] = {}
    for name, method in public_methods(factory):
        try:
            specs[name] = build_tool_spec(factory.__name__, method)
        except ToolDefinitionError as error:
            raise EnvSpecError(f"trl:{rest}: {error}") from None
    if not specs:
        raise EnvSpecError(f"trl:{rest}: {factory.__name__} has no public methods, so no tools for the model")
    cls = type(
        class_name("TRL", factory.__name__),
        (TRLEnv,),
        {
            "factory": factory,
            "owns_reward": callable(getattr(factory, "get_reward", None)),
            "envkit_spec": f"{PREFIX}:{rest.strip()}",
            "__module__": __name__,
            "__doc__": f"TRL environment class {factory.__module__}.{factory.__qualname__}; see {__name__}.",
        },
    )
    cls._tool_specs = specs  # after class creation: ToolEnv.__init_subclass__ collects @tool methods only
    return cls


def _resolved(value: Any) -> Any:
    """Run a coroutine to completion (TRL allows async tools and ``get_reward``)."""
    return asyncio.run(_awaited(value)) if inspect.isawaitable(value) else value


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _rows(dataset: Any) -> list[dict[str, Any]] | None:
    if dataset is None:
        return None
    if isinstance(dataset, str):
        dataset = _load(dataset, "dataset=")
        if callable(dataset) and not hasattr(dataset, "__len__"):
            dataset = dataset()
    try:
        rows = [dict(row) for row in dataset]
    except (TypeError, ValueError) as error:
        raise EnvSpecError(
            f"dataset= must be rows (dicts): a list, a datasets.Dataset or 'module:NAME' ({error})"
        ) from None
    if not rows:
        raise EnvSpecError("dataset= has no rows")
    return rows


def _reward_funcs(funcs: Any, weights: Any) -> list[tuple[Callable[..., Any], float]]:
    if funcs is None:
        funcs = []
    elif callable(funcs) or isinstance(funcs, str):
        funcs = [funcs]
    resolved = []
    for func in funcs:
        function = _load(func, "reward_funcs=") if isinstance(func, str) else func
        if not callable(function):
            raise EnvSpecError(f"reward_funcs= entries must be callables or 'package.module:function', got {func!r}")
        resolved.append(function)
    weights = [1.0] * len(resolved) if weights is None else [float(w) for w in weights]
    if len(weights) != len(resolved):
        raise EnvSpecError(f"reward_weights= has {len(weights)} weights for {len(resolved)} reward functions")
    return list(zip(resolved, weights, strict=True))


def _opening(prompt: Any) -> list[Message]:
    if prompt is None:
        return []
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    messages = []
    for message in prompt:
        kept = {k: message[k] for k in ("role", "content", "name", "tool_calls") if k in message}
        messages.append(kept)
    return messages


class TRLEnv(SpecBuilt, ToolEnv):
    """A TRL ``environment_factory`` class as an envkit tool env; subclassed per class by :func:`env_class`."""

    factory: ClassVar[type] = object
    owns_reward: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        inherited = cls._tool_specs  # the tools of the class's TRL class, which carries no @tool marks
        super().__init_subclass__(**kwargs)
        if not cls._tool_specs and inherited:
            cls._tool_specs = inherited

    def __init__(
        self,
        dataset: Any = None,
        reward_funcs: Any = None,
        reward_weights: Any = None,
        max_turns: int | None = None,
        reward_range: tuple[float, float] | list[float] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        self._remember(
            {
                "dataset": dataset,
                "reward_funcs": reward_funcs,
                "reward_weights": reward_weights,
                "max_turns": max_turns,
                "reward_range": reward_range,
            }
            | kwargs
        )
        self.reward_range = reward_range_config(reward_range, self.envkit_spec)
        if max_turns is not None:
            self.max_turns = int(max_turns)  # type: ignore[misc]
        self.rows = _rows(dataset)
        self.reward_funcs = _reward_funcs(reward_funcs, reward_weights)
        if not self.owns_reward and not self.reward_funcs:
            raise EnvSpecError(
                f"{self.envkit_spec}: {self.factory.__name__} has no get_reward() method and no reward_funcs= were "
                "given: nothing to score episodes with"
            )
        self.instance = self.factory(**kwargs)
        self.row: dict[str, Any] = {}
        self.opening: list[Message] = []

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """``reset(**row)`` on the instance; the row's ``prompt`` plus the returned text is the opening."""
        super().reset(seed=seed, options=options)
        if seed is None:
            seed = int(self.np_random.integers(2**31 - 1))
        self._started(seed, options)
        if options and isinstance(options.get("row"), dict):
            row = dict(options["row"])
        elif self.rows is not None:
            row = dict(self.rows[int(seed) % len(self.rows)])
        else:
            row = {"task_seed": int(seed)}
        self.row = row
        observation = _resolved(self.instance.reset(**row))
        messages = _opening(row.get("prompt"))
        if isinstance(observation, list):  # multimodal content blocks: their text parts
            observation = "".join(str(p.get("text", "")) for p in observation if isinstance(p, dict))
        if observation is not None:
            text = str(observation)
            if messages and messages[-1].get("role") == "user" and isinstance(messages[-1].get("content"), str):
                messages[-1] = {**messages[-1], "content": messages[-1]["content"] + text}
            else:
                messages.append({"role": "user", "content": text})
        if not messages:
            raise ValueError(
                f"{self.factory.__name__}.reset returned None and the row has no 'prompt': nothing to show the model "
                "(return the opening text from reset, or pass dataset= rows with a prompt)"
            )
        self.opening = messages
        return [dict(m) for m in messages], {"row": {k: v for k, v in row.items() if k != "prompt"}}

    def call_tool(self, call: Any) -> tuple[str, str, bool]:
        """Run one tool call on the instance (same checks and error texts as :meth:`ToolEnv.call_tool`)."""
        name, arguments, error = decode_tool_call(call, self._tool_specs)
        if error is not None:
            return name, error, True
        arguments, error = self.tool_arguments(name, arguments)
        if error is not None:
            return name, error, True
        try:
            method = self._tool_function(name)
            result = _resolved(method(**arguments))
        except ToolError as error:
            return name, f"Error: {error}", True
        except Exception as error:
            return name, f"Error: {name} failed with {type(error).__name__}: {error}", True
        return name, result if isinstance(result, str) else str(result), False

    def _tool_function(self, name: str) -> Callable[..., Any]:
        return getattr(self.instance, name)

    def score(self) -> float:
        """``get_reward()`` plus the weighted ``reward_funcs``, mapped from ``reward_range`` onto [0, 1];
        ``ValueError`` for a sum outside it (see the module docstring)."""
        total = 0.0
        if self.owns_reward:
            value = _resolved(self.instance.get_reward())
            if not _skipped(value, f"{self.envkit_spec}: get_reward()"):
                total += float(value)
        if self.reward_funcs:
            columns = {k: [v] for k, v in self.row.items() if k not in ("prompt", "completion", "completion_ids")}
            kwargs = {
                **columns,
                "prompts": [self.opening],
                "completions": [self.messages[len(self.opening) :]],
                "completion_ids": [[]],
                "environments": [self.instance],
                "trainer_state": None,
                "log_extra": lambda *args, **kw: None,
                "log_metric": lambda *args, **kw: None,
            }
            for func, weight in self.reward_funcs:
                values = _resolved(func(**kwargs))
                value = values[0] if isinstance(values, list | tuple) and values else None
                if not _skipped(value, f"{self.envkit_spec}: reward function {getattr(func, '__name__', func)}"):
                    total += weight * float(value)
        return scaled_score(total, self.reward_range, self.envkit_spec, "reward (what TRL would sum)")


def _skipped(value: Any, source: str) -> bool:
    """Whether TRL leaves ``value`` out of its sum (``None``, NaN in TRL's tensor); anything else must be a number."""
    if value is None:
        return True
    try:
        return math.isnan(float(value))
    except (TypeError, ValueError):
        raise ValueError(f"{source} gave {value!r:.80}: a reward must be a number or None") from None


SEED_PREFIX = "seed"
_SEED_TOKENIZERS: dict[str | None, Any] = {}
_SEED_ROWS: dict[tuple[str, str, str | None], list[dict[str, Any]]] = {}


def seed_style_env_class(rest: str) -> type[SeedStyleEnv]:
    """The env class of ``seed:package.module:Class`` (or ``seed:path/to/file.py:Class``): a seed-style class
    (``build_dataset(tokenizer)``, ``score_episode(model, tokenizer, completion, case_idx)``, optional ``get_tools()``)
    as an envkit tool env, so that ``envkit eval``, ``play`` and the rollout engine run it as TRL's tool loop would.

    Task seed ``s`` is dataset row ``s % len(rows)``: its conversational ``prompt`` is the opening, ``get_tools()``'s
    functions are the tools, a turn without tool calls ends the episode (``max_turns`` 10, TRL's
    ``max_tool_calling_iterations``), and the score is ``score_episode(None, tokenizer, completion, case_idx)`` on the
    text of every message after the opening (what ``envkit train`` passes, with the model in training only). The
    dataset is built with ``envkit_tokenizer=`` (a tokenizer folder; default: envkit's bundled ChatML one)."""
    from envkit.validate.seed_style import is_seed_style

    target = _load(rest.strip(), f"{SEED_PREFIX}:package.module:Class")
    if not isinstance(target, type) or not is_seed_style(target):
        raise EnvSpecError(
            f"{SEED_PREFIX}:{rest}: not a seed-style class (it needs build_dataset(tokenizer) and "
            "score_episode(model, tokenizer, completion, case_idx))"
        )
    return type(
        class_name("Seed", target.__name__),
        (SeedStyleEnv,),
        {
            "seed_class": target,
            "envkit_spec": f"{SEED_PREFIX}:{rest.strip()}",
            "__module__": __name__,
            "__doc__": f"Seed-style class {target.__module__}.{target.__qualname__}; see {__name__}.",
        },
    )


def seed_score(value: Any, spec: str) -> float:
    """``score_episode``'s ``value`` (awaited when a coroutine) as an envkit score: a finite number in [0, 1], the
    range ``envkit validate`` checks. Anything else raises ``ValueError`` naming the value: the episode failed
    (counted, and given no reward in training), never a reward envkit made up by clipping or by reading NaN as 0."""
    value = _resolved(value)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{spec}: score_episode returned {value!r:.80}, not a number") from None
    if not (math.isfinite(number) and -ROUNDING <= number <= 1 + ROUNDING):
        raise ValueError(
            f"{spec}: score_episode returned {number:g}, outside [0, 1]: a seed-style class scores each episode in "
            "[0, 1] (envkit validate checks it); scale its score into that range"
        )
    return min(1.0, max(0.0, number))


def seed_style_spec(spec: str) -> str:
    """The ``envkit.make`` spec of a seed-style class named ``spec`` on a command line (``module:Class``)."""
    return spec if spec.startswith(f"{SEED_PREFIX}:") else f"{SEED_PREFIX}:{spec}"


def _seed_tokenizer(path: str | None) -> Any:
    if path not in _SEED_TOKENIZERS:
        if path is None:
            from envkit.validate.template import bundled_tokenizer

            _SEED_TOKENIZERS[path] = bundled_tokenizer()
        else:
            from envkit.models.loading import ModelLoadError, load_tokenizer

            try:
                _SEED_TOKENIZERS[path] = load_tokenizer(path)
            except ModelLoadError as error:
                raise EnvSpecError(str(error)) from None
    return _SEED_TOKENIZERS[path]


def completion_text(messages: list[Message]) -> str:
    """The text ``score_episode`` scores: every message's content after the opening, joined (as envkit train joins
    TRL's completion messages)."""
    return "".join(str(m.get("content") or "") for m in messages if isinstance(m, dict))


class SeedStyleEnv(SpecBuilt, ToolEnv):
    """A seed-style class as an envkit tool env; subclassed per class by :func:`seed_style_env_class`."""

    seed_class: ClassVar[type] = object
    call_tool = TRLEnv.call_tool
    _shared = ("tokenizer", "rows", "_functions")

    def __init__(self, envkit_tokenizer: str | None = None, max_turns: int | None = None, **kwargs: Any) -> None:
        super().__init__()
        self._remember({"envkit_tokenizer": envkit_tokenizer, "max_turns": max_turns} | kwargs)
        if max_turns is not None:
            self.max_turns = int(max_turns)  # type: ignore[misc]
        self.instance = self.seed_class(**kwargs)
        self.tokenizer = _seed_tokenizer(envkit_tokenizer)
        get_tools = getattr(self.instance, "get_tools", None)
        self._functions: dict[str, Callable[..., Any]] = {}
        specs: dict[str, ToolSpec] = {}
        for function in list(get_tools() or []) if callable(get_tools) else []:
            if not callable(function):
                raise EnvSpecError(
                    f"{self.envkit_spec}: get_tools() returned {type(function).__name__}, not a function: envkit can "
                    "describe a schema to the model but cannot call it; return typed, docstringed functions"
                )
            try:
                specs[function.__name__] = build_tool_spec(self.seed_class.__name__, function)
            except ToolDefinitionError as error:
                raise EnvSpecError(f"{self.envkit_spec}: {error}") from None
            self._functions[function.__name__] = function
        self._tool_specs = specs  # per instance: get_tools() may depend on the config
        key = (self.envkit_spec, json.dumps(kwargs, sort_keys=True, default=repr), envkit_tokenizer)
        if key not in _SEED_ROWS:  # one dataset per class, config and tokenizer in a process, not one per episode
            _SEED_ROWS[key] = [dict(row) for row in self.instance.build_dataset(self.tokenizer)]
        self.rows = _SEED_ROWS[key]
        if not self.rows:
            raise EnvSpecError(f"{self.envkit_spec}: build_dataset returned no rows")
        self.case_idx = 0
        self.opening: list[Message] = []

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Row ``seed % len(rows)`` of the dataset: its conversational prompt is the opening."""
        super().reset(seed=seed, options=options)
        if seed is None:
            seed = int(self.np_random.integers(2**31 - 1))
        self._started(seed, options)
        index = int(seed) % len(self.rows)
        row = self.rows[index]
        self.case_idx = int(row.get("case_idx", index))
        prompt = row.get("prompt")
        if not isinstance(prompt, list):
            raise ValueError(
                f"{self.seed_class.__name__}.build_dataset's prompts are {type(prompt).__name__}, not conversations: "
                "envkit renders the opening messages with the chat template itself; return prompts as lists of "
                '{"role", "content"} messages'
            )
        self.opening = _opening(prompt)
        return [dict(m) for m in self.opening], {"case_idx": self.case_idx}

    def _tool_function(self, name: str) -> Callable[..., Any]:
        return self._functions[name]

    def score(self) -> float:
        """``score_episode(None, tokenizer, completion, case_idx)``, which must be in [0, 1]."""
        text = completion_text(self.messages[len(self.opening) :])
        return seed_score(self.instance.score_episode(None, self.tokenizer, text, self.case_idx), self.envkit_spec)
