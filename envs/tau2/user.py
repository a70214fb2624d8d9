"""The simulated customer. τ²-bench's user is an LLM following the task's user scenario; offline, envkit's
:class:`ScriptedUser` answers deterministically from the scenario's known facts, so validate, tests and the oracle
need no model."""

from __future__ import annotations

import re

from envkit.envs.tau2.data import Task

STOP = "###STOP###"
"""tau2's end-of-conversation signal; a user reply of exactly this ends the episode (USER_STOP)."""

_PRONOUNS = [
    (r"\byou are\b", "I am"),
    (r"\byou were\b", "I was"),
    (r"\byou have\b", "I have"),
    (r"\byou've\b", "I've"),
    (r"\byou'd\b", "I'd"),
    (r"\byou're\b", "I'm"),
    (r"\byour\b", "my"),
    (r"\byours\b", "mine"),
    (r"\byourself\b", "myself"),
    (r"(^|[.!?:]\s+|\n)you\b", r"\1I"),
    (r"\byou (want|need|do|don't|would|will|can|cannot|also|only|received|recently|just|prefer|are|had|made)\b",
     r"I \1"),
    (r"\byou\b", "me"),
]  # fmt: skip
_CONFIRM = re.compile(
    r"confirm|proceed|\byes\b|go ahead|shall i|should i|would you like|do you want|is that (?:ok|correct|right)",
    re.IGNORECASE,
)


def first_person(text: str) -> str:
    """The scenario's second-person notes ("You are Emma Kim. Your user id is …") as the customer says them."""
    for pattern, replacement in _PRONOUNS:
        text = re.sub(pattern, replacement, text, flags=re.IGNORECASE)
    return re.sub(r"(^|[.!?]\s+)([a-z])", lambda m: m.group(1) + m.group(2).upper(), text.strip())


class ScriptedUser:
    """A deterministic customer for one task.

    It opens with the scenario's reason for calling and known facts (in the first person); answers a request for
    confirmation with yes; answers any other question with its known facts once, then says it does not know; and
    ends the conversation (``###STOP###``) when the agent's message asks nothing, or after ``patience`` replies
    in all. It knows only what the scenario says: it never invents ids.
    """

    def __init__(self, task: Task, patience: int = 4) -> None:
        self.task = task
        self.patience = patience
        self.replies = 0
        self.facts_told = False

    def opening(self) -> str:
        """The customer's first message."""
        instructions = self.task.instructions
        parts = [first_person(str(instructions.get("reason_for_call") or "I need help."))]
        if instructions.get("known_info"):
            parts.append(first_person(str(instructions["known_info"])))
        return "Hi! " + " ".join(parts)

    def reply(self, agent_text: str) -> str:
        """The customer's answer to one agent message (``###STOP###`` ends the conversation)."""
        self.replies += 1
        if self.replies > self.patience or "?" not in agent_text:
            return STOP
        if _CONFIRM.search(agent_text):
            return "Yes, please go ahead."
        if not self.facts_told and self.task.instructions.get("known_info"):
            self.facts_told = True
            return first_person(str(self.task.instructions["known_info"]))
        return "I don't know anything more than what I told you."
