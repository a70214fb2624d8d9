"""The environment protocol: a :class:`gymnasium.Env` whose observations and actions are chat messages."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ClassVar

import gymnasium as gym

from envkit.core.messages import Message, MessageSpace, as_assistant_message


class Env(gym.Env[list[Message], Message]):
    """A multi-turn conversation environment for an LLM agent.

    Observations are lists of *new* chat messages (Hugging Face chat dicts ``{"role", "content"}``); an action is one
    assistant message. A plain ``str`` action is accepted and treated as ``{"role": "assistant", "content": str}``.

    Subclasses implement :meth:`reset`, :meth:`step` and :meth:`score`, and may implement :meth:`oracle` (a perfect
    agent) and :meth:`canaries` (known reward hacks, which must score no more than doing nothing). Their
    ``reset`` must call ``super().reset(seed=seed, options=options)`` first. The base class keeps the whole
    transcript in :attr:`messages` and enforces :attr:`max_turns`, so a subclass only returns what is new.

    The episode's *score* in ``[0, 1]`` is what training optimises and evaluation reports. The step reward returned
    by ``step`` is for Gymnasium-style consumers; :class:`envkit.ToolEnv` returns the change in score, so the step
    rewards of an episode add up to its final score.
    """

    max_turns: ClassVar[int] = 10
    """Assistant turns after which the episode is truncated."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}

    messages: list[Message]
    """The full transcript of the current episode: opening messages, assistant turns and env messages, in order."""

    turns: int
    """Assistant turns taken in the current episode."""

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = _checked_render_mode(type(self), render_mode)
        self.observation_space = MessageSpace()
        self.action_space = MessageSpace(roles=("assistant",), max_messages=1)
        self.messages = []
        self.turns = 0
        self._done = False
        self._recording = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # gymnasium.make passes render_mode to every constructor (check_env tries each declared mode): accept it
        # whatever the subclass's own signature.
        if "__init__" in cls.__dict__:
            cls.__init__ = _accepting_render_mode(cls.__dict__["__init__"])  # type: ignore[method-assign]
        # The base class keeps the transcript whatever the subclass's reset/step do: wrap them where defined.
        if "reset" in cls.__dict__:
            cls.reset = _recording_reset(cls.__dict__["reset"])  # type: ignore[method-assign]
        if "step" in cls.__dict__:
            cls.step = _recording_step(cls.__dict__["step"])  # type: ignore[method-assign]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start a new episode and return its opening messages (system/user) and an info dict.

        The same ``seed`` must give the same task. Subclasses call ``super().reset(seed=seed, options=options)``
        first (it seeds :attr:`np_random` and clears the transcript), then build and return the opening messages.
        """
        super().reset(seed=seed, options=options)
        self.messages = []
        self.turns = 0
        self._done = False
        return [], {}

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Apply one assistant message and return Gymnasium's 5-tuple.

        Returns:
            ``(new_messages, reward, terminated, truncated, info)``: the env's new messages (tool results, a user's
            reply; empty when the episode ends silently), the step reward, whether the episode ended by itself,
            whether it was cut off (by :attr:`max_turns`), and an info dict.
        """
        raise NotImplementedError

    def score(self) -> float:
        """The episode's score so far, in ``[0, 1]`` (1.0 = task fully solved)."""
        raise NotImplementedError

    def score_components(self) -> dict[str, float]:
        """What the current :meth:`score` is made of, by name (optional; none by default).

        Called right after :meth:`score` at the end of every episode the rollout engine runs (in the same worker as
        the env). Each value is a finite number, e.g. ``{"booked": 1.0, "policy": 0.5}``; they need not add up to
        the score. They are diagnostics, never the reward: ``envkit eval`` writes them in each episode's JSON line
        (``score_components``) and their means in its metrics (``score/NAME``), and training logs them as
        ``envkit/score/NAME``. A value that is not a finite number fails the episode, as a bad score does.
        """
        return {}

    def oracle(self) -> Message | None:
        """The next action of a perfect agent in the current state, or ``None`` when the env provides no oracle.

        Used by ``envkit validate`` (the oracle must reach score 1.0) and to make demonstrations for warm-starting.
        """
        return None

    def canaries(self) -> dict[str, list[Message | str]]:
        """Known reward hacks of the current task, which must earn no more than doing nothing (none by default).

        Returns ``{name: actions}``: each value is the whole action sequence of one episode, as :meth:`step` accepts
        actions (a ``str`` or an assistant message dict, tool calls included), and each name says which hack it is
        (``"every price in one reply"``). Called right after ``reset(seed=...)``, so a canary may be built from the
        task's hidden state, as :meth:`oracle` is (the right answer among wrong ones, the prices the tools would show).

        ``envkit validate`` replays each canary from ``reset`` with the same seed, one action per step until the
        actions run out or the episode ends, and fails when its final score is above the seed's measured no-op floor
        (the best score of an empty answer and of a refusal there), naming the canary.
        """
        return {}

    @property
    def done(self) -> bool:
        """Whether the current episode has ended (terminated or truncated)."""
        return self._done

    def render(self) -> str:  # type: ignore[override]
        """The transcript as plain text (Gymnasium's ``ansi`` render mode; returned whatever :attr:`render_mode` is).

        Every envkit env takes ``render_mode=None`` or ``"ansi"`` as a constructor keyword (what ``gymnasium.make``
        passes), whether or not its own ``__init__`` names it.
        """
        from envkit.core.messages import format_transcript

        return format_transcript(self.messages)


def _checked_render_mode(cls: type, render_mode: str | None) -> str | None:
    modes = cls.metadata.get("render_modes", [])  # type: ignore[attr-defined]
    if render_mode is not None and render_mode not in modes:
        raise ValueError(f"{cls.__name__} has no render mode {render_mode!r}; its render modes: {', '.join(modes)}")
    return render_mode


def _accepting_render_mode(init: Callable[..., None]) -> Callable[..., None]:
    if "render_mode" in inspect.signature(init).parameters:  # the subclass takes it (and passes it on) itself
        return init

    @functools.wraps(init)
    def wrapper(self: Env, *args: Any, render_mode: str | None = None, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        if render_mode is not None:  # set after the inner constructors, which saw no render_mode
            self.render_mode = _checked_render_mode(type(self), render_mode)

    return wrapper


def _recording_reset(reset: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(reset)
    def wrapper(
        self: Env, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        if getattr(self, "_recording", False):  # called through super() from an outer override
            return reset(self, seed=seed, options=options)
        if not hasattr(self, "messages"):
            raise TypeError(f"{type(self).__name__}.__init__ must call super().__init__()")
        self._recording = True
        try:
            returned = reset(self, seed=seed, options=options)
        finally:
            self._recording = False
        if not (isinstance(returned, tuple) and len(returned) == 2 and isinstance(returned[1], dict)):
            # A bare list of two messages would otherwise unpack into (['role', 'content'], {message}) silently.
            shape = f"a {type(returned).__name__}" + (f" of {len(returned)}" if hasattr(returned, "__len__") else "")
            raise TypeError(f"{type(self).__name__}.reset() returned {shape}, expected (messages, info)")
        observation, info = returned
        observation = list(observation)
        self.messages = [*observation]
        self.turns = 0
        self._done = False
        return observation, dict(info)

    return wrapper


def _recording_step(step: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(step)
    def wrapper(self: Env, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        if getattr(self, "_recording", False):
            return step(self, action)
        if self._done:
            raise RuntimeError(f"{type(self).__name__}: the episode has ended; call reset() before step()")
        message = as_assistant_message(action)
        self.messages.append(message)
        self.turns += 1
        self._recording = True
        try:
            observation, reward, terminated, truncated, info = step(self, message)
        finally:
            self._recording = False
        observation = list(observation)
        self.messages.extend(observation)
        terminated, truncated = bool(terminated), bool(truncated)
        if not terminated and self.turns >= self.max_turns:
            truncated = True
            info = {**info, "truncated_by": "max_turns"}
        self._done = terminated or truncated
        return observation, float(reward), terminated, truncated, dict(info)

    return wrapper
