"""An envkit ToolEnv exported for TRL's own tool loop (``GRPOTrainer(environment_factory=...)``)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from envkit.core.env import Env


def to_environment_factory(env_class: type[Env], **config: Any) -> Callable[[], Any]:
    """Export a :class:`envkit.ToolEnv` class for ``GRPOTrainer(environment_factory=...)``.

    Each instance wraps a fresh env: ``reset(**row)`` resets it with the row's ``task_seed`` (rows from
    :func:`build_dataset`), every ``@tool`` becomes a public method with the same signature and docstring, and
    ``get_reward()`` returns the env's score. What TRL's loop cannot express: turns without tool calls (``on_text``,
    e.g. a simulated user) — the episode ends at the first such turn, which never reaches the env — and envkit's
    token-exact suffixes (TRL renders tool results itself). So the env is never told how its episode ended
    (:attr:`~envkit.Env.ending` stays ``None`` unless a tool ended it), and an env whose reward credits only a proper
    ending (:attr:`~envkit.Env.requires_proper_ending`, e.g. τ²-bench's) is refused: through this loop it would score
    every episode as cut.

    Raises:
        TypeError: ``env_class`` has no tools, or requires a proper ending (the message names ``envkit train``).
    """
    tools = getattr(env_class, "_tool_specs", {})
    if not tools:
        raise TypeError(f"{env_class.__name__} has no @tool methods: TRL's environment_factory needs tools")
    if env_class.requires_proper_ending:
        raise TypeError(
            f"{env_class.__name__} credits only an episode that ended properly, and TRL's environment_factory loop "
            "ends at the first reply without a tool call without giving it to the env: train it with envkit train "
            "(its rollout_func plays that reply)"
        )

    def reset(self: Any, **row: Any) -> None:
        self.env.reset(seed=int(row.get("task_seed", 0)))
        return None

    def get_reward(self: Any) -> float:
        return float(self.env.score())

    def make_method(name: str) -> Callable[..., str]:
        original = getattr(env_class, name)

        @functools.wraps(original)
        def method(self: Any, **arguments: Any) -> str:
            _, content, failed = self.env.call_tool({"function": {"name": name, "arguments": arguments}})
            if failed:
                raise RuntimeError(content.removeprefix("Error: "))
            return content

        return method

    namespace: dict[str, Any] = {
        "__init__": lambda self: setattr(self, "env", env_class(**config)),
        "__doc__": f"TRL environment wrapping envkit's {env_class.__name__}.",
        "reset": reset,
        "get_reward": get_reward,
    }
    namespace.update({name: make_method(name) for name in tools})
    exported = type(f"{env_class.__name__}ForTRL", (), namespace)
    return exported
