"""The environment protocol: a :class:`gymnasium.Env` whose observations and actions are chat messages."""

from __future__ import annotations

import enum
import functools
import hashlib
import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import gymnasium as gym

from envkit.core.messages import Message, MessageSpace, as_assistant_message


class Ending(str, enum.Enum):
    """How an episode ended: what the rollout engine (or whoever drives an env) tells the env through :meth:`Env.end`
    before it reads :meth:`Env.score`, so that ``score()`` never has to guess whether the agent finished or was cut.

    An env names its own ending in ``step``'s info (``info["ending"]``, one of these values) when it ends an episode
    for a reason other than the plain ones (``terminated``: :attr:`DONE`; ``truncated``: :attr:`MAX_TURNS`). The
    values are also :attr:`envkit.rollout.Episode.finish_reason`'s.
    """

    DONE = "done"
    """The env ended the episode itself (``step`` returned ``terminated``): the agent or the user closed the
    conversation, a tool ended it. The only *proper* ending (:attr:`proper`)."""
    MAX_TURNS = "max_turns"
    """A turn cap cut the episode: the env's own :attr:`Env.max_turns`, or the engine's ``max_turns``
    (``--max-turns``)."""
    MAX_STEPS = "max_steps"
    """The env's own step limit cut the episode (τ²-bench's 200 orchestrator steps)."""
    TOO_MANY_ERRORS = "too_many_errors"
    """The env ended the episode after too many failed tool calls (:attr:`envkit.ToolEnv.max_tool_errors`)."""
    MAX_EPISODE_TOKENS = "max_episode_tokens"
    """A token budget cut the episode: ``max_episode_tokens``, ``max_completion_tokens`` or the model's context."""
    TIMEOUT = "timeout"
    """An env call took longer than its deadline (the engine then scores the episode 0 without calling
    ``score()``)."""
    ERROR = "error"
    """The env, the model or the engine failed (the engine then scores the episode 0 without calling ``score()``)."""

    @property
    def proper(self) -> bool:
        """Whether the episode ended as the task intends (:attr:`DONE`), not cut by a limit or a failure."""
        return self is Ending.DONE

    def __str__(self) -> str:
        return self.value


def step_ending(terminated: bool, truncated: bool, info: Mapping[str, Any]) -> Ending | None:
    """How a step ended its episode: the :class:`Ending` ``info["ending"]`` names, else :attr:`Ending.DONE` when
    ``terminated`` and :attr:`Ending.MAX_TURNS` when ``truncated``; ``None`` when the episode goes on.

    Raises:
        ValueError: ``info["ending"]`` is not an :class:`Ending` value.
    """
    if not (terminated or truncated):
        return None
    named = info.get("ending")
    if named is not None:
        try:
            return Ending(named)
        except ValueError:
            values = ", ".join(e.value for e in Ending)
            raise ValueError(f"step() returned info['ending']={named!r}; an ending is one of: {values}") from None
    return Ending.DONE if terminated else Ending.MAX_TURNS


TASK_ID_KEY = "task_id"
"""The :meth:`Env.reset` info key by which an env says which task a reset gave (optional; see :func:`task_identity`).

An env whose opening messages do not tell its tasks apart (each seed its own database, a hidden number, questions
that repeat over different data) returns ``info["task_id"]``: a ``str`` equal for two resets exactly when they give
the same task, opening and hidden state together. Derive it from what makes the task (a digest of the question and
its database), never from the seed alone: ``envkit train`` calls its eval held-out when no eval task's id is a
training task's, and ``envkit validate`` checks that one seed always gives one id. A digest keeps the id from telling
the answer to whoever reads ``info``. Envs without it are identified by their opening messages."""


def task_id_of(info: Mapping[str, Any]) -> str | None:
    """The task id a reset's ``info`` names (:data:`TASK_ID_KEY`), or ``None`` when it names none.

    Args:
        info: The info dict :meth:`Env.reset` returned.

    Returns:
        The id as a ``str`` (an ``int`` id is accepted and written in decimal); ``None`` when the key is absent or
        ``None``.

    Raises:
        ValueError: The id is neither a ``str`` nor an ``int``, or is an empty ``str``.
    """
    value = info.get(TASK_ID_KEY)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise ValueError(
            f"reset() returned info[{TASK_ID_KEY!r}]={value!r}: a task id is a non-empty str naming the task "
            "(e.g. a digest of its question and data)"
        )
    return str(value)


def opening_digest(opening: Sequence[Mapping[str, Any]]) -> str:
    """A digest of a task's opening messages (roles and contents): two tasks with one digest look the same to the
    model.

    Args:
        opening: The messages :meth:`Env.reset` returned.

    Returns:
        A SHA-256 hex digest.
    """
    pairs = [[m.get("role"), m.get("content")] for m in opening]
    return hashlib.sha256(json.dumps(pairs, sort_keys=True, default=str).encode()).hexdigest()


def task_identity(opening: Sequence[Mapping[str, Any]], info: Mapping[str, Any]) -> str:
    """What identifies the task a reset gave: two resets with one identity are the same task.

    The env's own ``info["task_id"]`` (:data:`TASK_ID_KEY`) when it names one, else the opening messages
    (:func:`opening_digest`), so an env that says nothing is identified as the model sees its task. The two kinds
    never compare equal.

    Args:
        opening: The messages :meth:`Env.reset` returned.
        info: The info dict it returned.

    Returns:
        ``"task_id:<id>"`` or ``"opening:<digest>"``.

    Raises:
        ValueError: ``info["task_id"]`` is not a task id (see :func:`task_id_of`).
    """
    task_id = task_id_of(info)
    return f"task_id:{task_id}" if task_id is not None else f"opening:{opening_digest(opening)}"


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

    How the episode ended is part of the contract: before reading :meth:`score` at the end of an episode, the rollout
    engine calls :meth:`end` with an :class:`Ending` (on every worker kind: threads, processes, Ray, and an env served
    over OpenEnv), so :attr:`ending` tells an episode the agent finished (:attr:`Ending.DONE`) from one the engine cut
    (its turn cap, a token budget). An env whose reward needs a proper ending reads :attr:`ending` in ``score()`` and
    declares :attr:`requires_proper_ending`; other envs need do nothing.

    What identifies a task is part of it too: a task is its opening messages, unless ``reset`` names it in
    ``info["task_id"]`` (:data:`TASK_ID_KEY`), which an env whose tasks differ in hidden state (each seed its own
    database) does; ``envkit train``'s held-out check and ``envkit validate`` read it (:func:`task_identity`).
    """

    max_turns: ClassVar[int] = 10
    """Assistant turns after which the episode is truncated (:attr:`Ending.MAX_TURNS`)."""

    requires_proper_ending: ClassVar[bool] = False
    """Whether the reward credits only an episode that ended properly (:attr:`Ending.DONE`): ``score()`` reads
    :attr:`ending` and gives an episode cut by a turn cap, a token budget or the env's own limits less than full
    credit (τ²-bench scores it 0). ``envkit validate`` then fails the env when its oracle, cut before its last turn,
    still scores 1.0. Off by default: most rewards judge the final state, however the episode ended."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 1}

    messages: list[Message]
    """The full transcript of the current episode: opening messages, assistant turns and env messages, in order."""

    turns: int
    """Assistant turns taken in the current episode."""

    ending: Ending | None
    """How the current episode ended: set by :meth:`end` (what the rollout engine calls before :meth:`score`), and by
    the base class when ``step`` ends the episode (:func:`step_ending`); ``None`` while the episode goes on, and when
    whoever drives the env stopped stepping it without calling :meth:`end`."""

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = _checked_render_mode(type(self), render_mode)
        self.observation_space = MessageSpace()
        self.action_space = MessageSpace(roles=("assistant",), max_messages=1)
        self.messages = []
        self.turns = 0
        self.ending = None
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
        When the opening messages do not tell tasks apart (the same question over each seed's own data), name the
        task in ``info["task_id"]`` (:data:`TASK_ID_KEY`): a ``str``, equal for two resets exactly when they give the
        same task.
        """
        super().reset(seed=seed, options=options)
        self.messages = []
        self.turns = 0
        self.ending = None
        self._done = False
        return [], {}

    def step(self, action: Message | str) -> tuple[list[Message], float, bool, bool, dict[str, Any]]:
        """Apply one assistant message and return Gymnasium's 5-tuple.

        Returns:
            ``(new_messages, reward, terminated, truncated, info)``: the env's new messages (tool results, a user's
            reply; empty when the episode ends silently), the step reward, whether the episode ended by itself,
            whether it was cut off (by :attr:`max_turns`), and an info dict. An env that ends the episode for a
            reason of its own names it in ``info["ending"]`` (an :class:`Ending` value, e.g. ``"max_steps"``).
        """
        raise NotImplementedError

    def end(self, ending: Ending | str) -> None:
        """Be told how the episode ended; the rollout engine calls it before reading :meth:`score`.

        The default records it in :attr:`ending` and closes the episode (``step`` then refuses to run). An override
        calls ``super().end(ending)`` first; ``score()`` may read :attr:`ending` afterwards.

        Args:
            ending: An :class:`Ending` or its value (``"max_turns"``).

        Raises:
            ValueError: ``ending`` is not an :class:`Ending` value.
        """
        try:
            self.ending = Ending(ending)
        except ValueError:
            values = ", ".join(e.value for e in Ending)
            raise ValueError(f"{type(self).__name__}.end({ending!r}): an ending is one of: {values}") from None
        self._done = True

    def score(self) -> float:
        """The episode's score so far, in ``[0, 1]`` (1.0 = task fully solved).

        Read at the end of an episode after :meth:`end` (so :attr:`ending` says how it ended), and after every step
        by some callers (``envkit validate``, :class:`envkit.ToolEnv`'s step reward).
        """
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
        self.ending = None
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
        info = dict(info)
        if not terminated and self.turns >= self.max_turns:
            truncated = True
            info["truncated_by"] = "max_turns"
            info.setdefault("ending", Ending.MAX_TURNS.value)  # unless the env cut it for a reason of its own
        self._done = terminated or truncated
        if self._done:
            self.ending = step_ending(terminated, truncated, info)
        return observation, float(reward), terminated, truncated, info

    return wrapper
