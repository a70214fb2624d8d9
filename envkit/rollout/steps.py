"""One env step's engine work, off the event loop: parse the model's turn, step the env, render the env's reply.

Plain functions of a :class:`~envkit.chat.ChatRenderer` and the step's data, run on the env's thread when the env
lives in this process (:func:`step_in_process`: one call, one hop), else around the worker's step
(:func:`parse_turn`, then :func:`render_step` of the outcome it sends back).
"""

from __future__ import annotations

import dataclasses

from envkit.chat.parsing import parse_assistant
from envkit.chat.render import ChatRenderer
from envkit.core.env import Env
from envkit.core.messages import Message
from envkit.workers import StepOutcome, step_outcome


@dataclasses.dataclass
class StepResult(StepOutcome):
    """What one env step gave back (its :class:`~envkit.workers.StepOutcome`) and the env's reply as tokens."""

    suffix: list[int] = dataclasses.field(default_factory=list)
    """The env's reply as token ids: the template suffix after the model's end-of-turn (empty when none)."""
    render_error: str | None = None
    """Why the env's messages could not be rendered (the episode then ends with this error), or None."""


_OUTCOME_FIELDS = tuple(field.name for field in dataclasses.fields(StepOutcome))


def parse_turn(renderer: ChatRenderer, said: list[int]) -> Message:
    """The model's turn as an assistant message, in the chat template's own tool-call format."""
    text = renderer.tokenizer.decode(said, skip_special_tokens=False)
    return parse_assistant(text, renderer.tokenizer, chat_template=renderer.chat_template)


def render_step(renderer: ChatRenderer, outcome: StepOutcome, last: bool) -> StepResult:
    """The env's reply as a template suffix (tokens after the model's end-of-turn)."""
    step = StepResult(**{name: getattr(outcome, name) for name in _OUTCOME_FIELDS})
    ending = step.terminated or step.truncated or last
    if step.observation or not ending:  # no new message but the episode goes on: still open the next turn
        try:
            step.suffix = renderer.suffix_ids(step.history, step.observation, add_generation_prompt=not ending)
        except Exception as error:
            step.render_error = f"{type(error).__name__}: {error}"
    return step


def step_in_process(env: Env, renderer: ChatRenderer, said: list[int], last: bool) -> StepResult:
    """On a worker thread, for an env in this process: parse, step, render, in one call."""
    return render_step(renderer, step_outcome(env, parse_turn(renderer, said)), last)
