"""What the ``reasoning-gym:``, ``textarena:`` and ``trl:`` adapter envs share: their classes are built at run time
from a spec, so they copy and pickle by spec (the spec, the config and the episode so far) instead of by class name."""

from __future__ import annotations

import copy
import math
import re
from typing import Any

from envkit.core.env import Env
from envkit.registry import EnvSpecError, make

ROUNDING = 1e-9
"""How far (as a fraction of the range's width) a reward may stray outside its range by float rounding and still count
as the range's end: reasoning-gym's ``spell_backward`` scores some answers 1.0000000000000002."""

SCORE_RANGE: tuple[float, float] = (0.0, 1.0)
"""An envkit score's range: :func:`scaled_score`'s default for a reward whose env declared no ``reward_range``."""


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


def reward_range_config(value: Any, spec: str) -> tuple[float, float] | None:
    """The ``reward_range=`` config of an adapter env: ``None``, or ``[lo, hi]`` (two finite numbers, ``lo < hi``)."""
    if value is None:
        return None
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise EnvSpecError(f"{spec}: reward_range must be two numbers [lo, hi], got {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise EnvSpecError(f"{spec}: reward_range must be two finite numbers [lo, hi] with lo < hi, got {value!r}")
    return lo, hi


def scaled_score(
    reward: Any,
    reward_range: tuple[float, float] | None,
    spec: str,
    what: str = "reward",
    default: tuple[float, float] = SCORE_RANGE,
    default_is: str = "an envkit score's range",
) -> float:
    """``reward`` mapped linearly from ``reward_range`` (``default`` when none was declared) onto [0, 1].

    Nothing is clipped: a reward outside the range (beyond float rounding, :data:`ROUNDING`) raises ``ValueError``
    naming the value and the fix, since clipping would give different rewards the same score (a class whose rewards
    run from 20 to 32 would score 1.0 on every episode: no training signal). A reward that is not a finite number
    raises too.
    """
    try:
        value = float(reward)
    except (TypeError, ValueError):
        raise ValueError(f"{spec}: the {what} is not a number: {reward!r:.80}") from None
    if not math.isfinite(value):
        raise ValueError(f"{spec}: the {what} is {value} (not a finite number)")
    lo, hi = reward_range or default
    slack = ROUNDING * (hi - lo)
    if not lo - slack <= value <= hi + slack:
        if reward_range is not None:
            raise ValueError(
                f"{spec}: the {what} {value:g} is outside the declared reward_range [{lo:g}, {hi:g}]; "
                "declare the env's real range in reward_range"
            )
        raise ValueError(
            f"{spec}: the {what} {value:g} is outside [{lo:g}, {hi:g}], {default_is}, and envkit does not clip "
            "rewards (clipping gives different rewards one score); declare the env's reward range, which envkit maps "
            "linearly onto [0, 1]: reward_range=[LO, HI] (envkit.make(..., reward_range=[LO, HI]) or --env-config "
            "'{\"reward_range\": [LO, HI]}')"
        )
    return min(1.0, max(0.0, (value - lo) / (hi - lo)))  # only rounding is left to trim


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
