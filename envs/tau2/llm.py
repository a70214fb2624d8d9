"""The τ²-bench parts that need a language model, run through an envkit backend: :class:`LLMUser` (the customer as
tau2's user simulator plays it) and :class:`NLJudge` (tau2's judge of a task's natural-language assertions).

Both take a *chat model*: any object with ``reply(messages) -> str``, or a JSON-able config that
:func:`envkit.backends.chat.chat_model` turns into one (``{"model": DIR}`` for a local model, ``{"base_url": URL,
"model": NAME, "tokenizer": DIR}`` for an OpenAI-compatible server), imported only when a config is given.
"""

from __future__ import annotations

import json
import logging
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from envkit.core.messages import Message
from envkit.envs.tau2.data import Task

log = logging.getLogger(__name__)

STOP, TRANSFER, OUT_OF_SCOPE = "###STOP###", "###TRANSFER###", "###OUT-OF-SCOPE###"
"""tau2's three tokens by which the user ends the conversation (done, transferred, scenario exhausted)."""

FIRST_AGENT_MESSAGE = "Hi! How can I help you today?"
"""The agent's greeting tau2's orchestrator opens every conversation with; the user answers it first."""

GUIDELINES = f"""# User Simulation Guidelines
You play a customer who contacts a customer service agent. Follow the scenario below, and nothing else.

## How to behave
- Write one message at a time, as a customer would in a chat.
- Follow the scenario instructions strictly.
- Never invent information: whatever the scenario does not give you is unknown to you.
- Say things in your own words rather than repeating the instructions word for word.
- Give information only when the agent asks for it, a little at a time.

## Ending the conversation
- Keep the conversation going until your task is done; agreeing to an action is not the action being done.
- When every request of your scenario has been handled, write '{STOP}' to end the conversation.
- If you are transferred to another agent, write '{TRANSFER}'.
- If the scenario does not tell you enough to go on, write '{OUT_OF_SCOPE}'."""
"""envkit's wording of tau2's user-simulator guidelines (same rules, same end tokens). ``user_guidelines=PATH``
uses another text, e.g. upstream tau2-bench's ``data/tau2/user_simulator/simulation_guidelines.md``."""

JUDGE_SYSTEM_PROMPT = """
        TASK
        - You will be given a list of expected outcomes and a conversation that was collected during a test case run.
        - The conversation is between an agent and a customer.
        - Your job is to evaluate whether the agent satisfies each of the expected outcomes.
        - Grade each expected outcome individually.

        FORMAT
        - Your response should be a JSON object with the following fields:
        - `reasoning`: a short explanation for your classification
        - `metExpectation`: `true` if the agent satisfies the expected outcomes, `false` otherwise
        - `expectedOutcome`: repeat the expectation from the input that you are grading
        
        Example response structure:
        {
            "results": [
                {
                    "expectedOutcome": "<one of the expected outcomes from the input>",
                    "reasoning": "<reasoning trace>",
                    "metExpectation": <false or true>,
                }
            ]
        }
        """  # noqa: W293 -- tau2's judge prompt (tau2/evaluator/evaluator_nl_assertions.py) character for character
"""The judge's system prompt, as tau2 sends it."""


class ChatModelLike(Protocol):
    """What the user and the judge need of a model."""

    def reply(self, messages: list[dict[str, Any]]) -> str:
        """The model's reply to a conversation."""
        ...


def load_chat_model(config: Any, what: str) -> ChatModelLike:
    """A chat model from ``config`` (an object with ``reply`` is used as is); ``what`` names the option in errors."""
    if callable(getattr(config, "reply", None)):
        return config
    from envkit.backends.chat import chat_model  # loads torch/transformers: only when a model is configured

    try:
        return chat_model(config)
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None


def scenario_text(task: Task) -> str:
    """The task's user scenario as tau2 prints it into the user's system prompt (persona, then instructions)."""
    scenario = task.raw.get("user_scenario") or {}
    instructions = scenario.get("instructions")
    if isinstance(instructions, dict):
        lines = [f"Domain: {instructions.get('domain', '')}"]
        lines.append(f"Reason for call:\n{textwrap.indent(str(instructions.get('reason_for_call', '')), chr(9))}")
        for key, title in (("known_info", "Known info"), ("unknown_info", "Unknown info")):
            if instructions.get(key) is not None:
                lines.append(f"{title}:\n{textwrap.indent(str(instructions[key]), chr(9))}")
        lines.append(f"Task instructions:\n{textwrap.indent(str(instructions.get('task_instructions', '')), chr(9))}")
        body = "\n".join(lines)
    else:
        body = str(instructions or "")
    parts = []
    if scenario.get("persona") is not None:
        parts += ["Persona:", textwrap.indent(str(scenario["persona"]), "\t")]
    parts += ["Instructions:", textwrap.indent(body, "\t")]
    return "\n".join(parts)


def is_stop(text: str) -> bool:
    """Whether a user message ends the conversation (it holds one of tau2's end tokens)."""
    return any(token in text for token in (STOP, TRANSFER, OUT_OF_SCOPE))


class LLMUser:
    """The customer of one task played by a model, as tau2's user simulator: its system prompt is the guidelines
    then the task's scenario in ``<scenario>`` tags; it sees the agent's text messages as the *user* side and its own
    as the *assistant* side (tool calls and results are the agent's business and never shown to it); it answers the
    greeting :data:`FIRST_AGENT_MESSAGE` first. A reply holding an end token (:func:`is_stop`) ends the episode.

    Args:
        task: The task whose scenario it follows.
        model: A chat model (see the module doc).
        guidelines: The guidelines text (default :data:`GUIDELINES`).
    """

    def __init__(self, task: Task, model: ChatModelLike, guidelines: str = GUIDELINES) -> None:
        self.task = task
        self.model = model
        self.system_prompt = f"{guidelines}\n\n<scenario>\n{scenario_text(task)}\n</scenario>"
        self.history: list[dict[str, Any]] = []

    def opening(self) -> str:
        """The customer's first message: its answer to the agent's greeting."""
        return self.reply(FIRST_AGENT_MESSAGE)

    def reply(self, agent_text: str) -> str:
        """The customer's answer to one agent message (it may hold an end token)."""
        self.history.append({"role": "user", "content": agent_text})
        text = self.model.reply([{"role": "system", "content": self.system_prompt}, *self.history])
        self.history.append({"role": "assistant", "content": text})
        return text


@dataclass
class Verdict:
    """The judge's verdict on a task's NL assertions: ``met`` is ``None`` when the judge's reply could not be read
    (then ``error`` says why; the assertions stay unscored, never a guessed pass or fail)."""

    met: bool | None
    checks: list[dict[str, Any]]
    error: str = ""
    raw: str = ""


class NLJudge:
    """tau2's NL-assertion judge: the same system prompt, the conversation as ``role: content`` lines and the
    assertions as a list; every assertion must be met. A reply that is not the JSON tau2 asks for, or that does not
    grade every assertion, gives a :class:`Verdict` with ``met=None`` (tau2 would raise, or count a missing grade as
    met: envkit reports it unscored instead)."""

    def __init__(self, model: ChatModelLike) -> None:
        self.model = model

    def prompt(self, messages: Sequence[Message], assertions: Sequence[str]) -> list[dict[str, Any]]:
        """The judge's messages for a transcript (the agent's system prompt is not part of tau2's trajectory)."""
        shown = [m for m in messages if m.get("role") != "system"]
        trajectory = "\n".join(f"{m.get('role')}: {m.get('content') or None}" for m in shown)
        user = f"""
        conversation:
        {trajectory}
        
        expectedOutcomes:
        {list(assertions)}
        """  # noqa: W293 -- tau2's layout
        return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]

    def judge(self, messages: Sequence[Message], assertions: Sequence[str]) -> Verdict:
        """Ask the model; read its verdict."""
        raw = self.model.reply(self.prompt(messages, assertions))
        return read_verdict(raw, assertions)


def read_verdict(raw: str, assertions: Sequence[str]) -> Verdict:
    """The verdict in a judge reply: the first JSON object in it with a ``results`` list grading every assertion."""
    data = _first_json_object(raw)
    if data is None or not isinstance(data.get("results"), list):
        return Verdict(None, [], "the judge's reply holds no JSON object with a 'results' list", raw)
    checks = [r for r in data["results"] if isinstance(r, dict) and isinstance(r.get("metExpectation"), bool)]
    if len(checks) < len(assertions):
        return Verdict(None, checks, f"the judge graded {len(checks)} of {len(assertions)} assertions", raw)
    return Verdict(all(c["metExpectation"] for c in checks), checks, "", raw)


def _first_json_object(text: str) -> dict[str, Any] | None:
    decoder = json.JSONDecoder()
    start = text.find("{")
    while start >= 0:
        try:
            value, _ = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start = text.find("{", start + 1)
            continue
        if isinstance(value, dict):
            return value
        start = text.find("{", start + 1)
    return None


def read_guidelines(path: str | None) -> str:
    """The user guidelines: :data:`GUIDELINES`, or the text of the file at ``path``."""
    if path is None:
        return GUIDELINES
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ValueError(f"user_guidelines: cannot read {path}: {error.strerror}") from None
