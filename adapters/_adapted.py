"""What the ``reasoning-gym:``, ``textarena:`` and ``trl:`` adapter envs share: their classes are built at run time
from a spec, so they copy and pickle by spec (the spec, the config and the episode so far) instead of by class name."""

from __future__ import annotations

import copy
import re
from typing import Any

from envkit.core import Env
from envkit.registry import make


def class_name(prefix: str, name: str) -> str:
    """A readable class name for a spec's env class: ``ReasoningGym_leg_counting``."""
    return f"{prefix}_{re.sub(r'[^0-9A-Za-z_]+', '_', name).strip('_') or 'env'}"


def rebuild(spec: str, config: dict[str, Any], seed: int | None, options: Any, actions: list[Any]) -> Env:
    """Unpickle an adapter env: build it from its spec, reset it with the recorded seed and replay its actions (the
    adapters are deterministic given the seed and the actions, which ``envkit validate`` checks)."""
    env = make(spec, **config)
    if seed is not None:
        env.reset(seed=seed, options=options)
        for action in actions:
            env.step(action)
    return env


class SpecBuilt:
    """Mixin for env classes made by an adapter's ``env_class(rest)``.

    Such a class has no importable name, so pickling goes through :func:`rebuild` (spec + config + seed + the actions
    so far); a deep copy copies the instance's state directly (``_shared`` attributes — read-only data such as a
    dataset generator — are shared, not copied). Subclasses call :meth:`_remember` in ``__init__`` and
    :meth:`_started` with the effective task seed in ``reset``.
    """

    envkit_spec: str = ""
    render_mode: str | None = None
    """The spec the class was built from, e.g. ``"reasoning-gym:leg_counting"``."""

    _shared: tuple[str, ...] = ()

    def _remember(self, config: dict[str, Any]) -> None:
        self._config = dict(config)
        self._task_seed: int | None = None
        self._options: Any = None

    def _started(self, seed: int, options: Any) -> None:
        self._task_seed, self._options = int(seed), copy.deepcopy(options)

    def __reduce__(self) -> tuple[Any, ...]:
        messages = getattr(self, "messages", [])
        actions = [m for m in messages if m.get("role") == "assistant"]
        config = self._config if self.render_mode is None else {**self._config, "render_mode": self.render_mode}
        return rebuild, (self.envkit_spec, config, self._task_seed, self._options, actions)

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        clone = object.__new__(type(self))
        for name in self._shared:
            value = self.__dict__.get(name)
            if value is not None:
                memo[id(value)] = value
        memo[id(self)] = clone
        clone.__dict__.update(copy.deepcopy(self.__dict__, memo))
        return clone
