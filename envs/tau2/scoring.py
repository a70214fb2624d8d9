"""τ²-bench's reward, computed as tau2's own ``evaluate_simulation`` does, without an LLM where it needs none.

* The reward is the product of the task's ``reward_basis`` components, 0 when the episode ended abnormally (tau2
  scores only AGENT_STOP / USER_STOP; envkit's max_turns truncation is tau2's max-steps end).
* **DB**: the database after the agent's tool calls equals (sha256 of the sorted-key JSON dump) the database after the
  task's gold actions, each replayed on a fresh copy of the initial one. The gold path is one valid path, not
  required. The env's live database *is* the replay of the agent's calls (the tools are deterministic), so only the
  gold side is replayed, once per task and process.
* **COMMUNICATE**: every required string appears (case-insensitive, commas removed from the message) in some
  assistant message with text.
* **NL_ASSERTION**: natural-language assertions an LLM judges. Tasks that have them are flagged
  (:attr:`Task.needs_llm_judge`); without a judge envkit scores their other components and reports
  ``nl_assertion_unscored: 1`` in the score components, never a silent pass or fail. With a judge configured
  (:class:`envkit.envs.tau2.llm.NLJudge`) its verdict is the ``nl_assertion`` component. A basis of NL_ASSERTION without
  assertions scores 1.0, as tau2.
* A component with nothing to check (COMMUNICATE without strings, NL_ASSERTION without assertions: :func:`vacuous`)
  counts 1.0 in the reward, as in tau2, and is left out of the score components.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

from pydantic import BaseModel

from envkit.core.messages import Message
from envkit.core.tools import ToolError
from envkit.envs.tau2.common import ToolsBase, diff_hash, overlay
from envkit.envs.tau2.data import Task, load_domain


def tools_class(domain: str) -> type[ToolsBase]:
    """The tools of ``domain``."""
    if domain == "airline":
        from envkit.envs.tau2.airline import AirlineTools

        return AirlineTools
    from envkit.envs.tau2.retail import RetailTools

    return RetailTools


@functools.cache
def base_db(domain: str) -> BaseModel:
    """The domain's initial database, validated once per process; never changed (tools change overlays of it)."""
    if domain == "airline":
        from envkit.envs.tau2.airline_db import FlightDB

        return FlightDB.model_validate(load_domain(domain).db_json)
    from envkit.envs.tau2.retail_db import RetailDB

    return RetailDB.model_validate(load_domain(domain).db_json)


def fresh_db(domain: str) -> Any:
    """A private (copy-on-write) copy of the domain's initial database."""
    return overlay(base_db(domain))


def db_state(domain: str, db: Any) -> str:
    """What DB scoring compares: equal for two databases exactly when tau2's DB hashes of them are equal."""
    return diff_hash(db, base_db(domain))


@functools.cache
def initial_hash(domain: str) -> str:
    """:func:`db_state` of the untouched database."""
    return db_state(domain, fresh_db(domain))


def replay(domain: str, calls: list[tuple[str, dict[str, Any]]]) -> Any:
    """A fresh database after running ``calls`` (name, arguments) in order; failing calls are skipped as tau2 logs
    and skips them (whatever they changed before failing stays, as in tau2)."""
    tools = tools_class(domain).on(fresh_db(domain), base_db(domain))
    for name, arguments in calls:
        method = getattr(tools, name, None)
        if method is None or not getattr(method, "__envkit_tool__", False):
            continue
        with contextlib.suppress(ToolError, TypeError):
            method(**arguments)
    return tools.db


@functools.cache
def gold_hash(domain: str, task_id: str) -> str:
    """The hash of the database after the task's gold actions."""
    task = load_domain(domain).task(task_id)
    if not any(action.name in tools_class(domain).write_tools() for action in task.actions):
        return initial_hash(domain)  # reads only: the replay would leave the database as it is
    return db_state(domain, replay(domain, [(a.name, a.arguments) for a in task.actions]))


def is_read_only(domain: str, task: Task) -> bool:
    """Whether doing nothing scores 1.0 in envkit on ``task``: its gold path changes nothing and nothing must be said
    (on a task with NL assertions, that is its DB part: the assertions are left to a judge)."""
    nothing_to_say = "COMMUNICATE" not in task.reward_basis or not task.communicate_info
    return nothing_to_say and gold_hash(domain, task.id) == initial_hash(domain)


def communicated(task: Task, messages: list[Message]) -> bool:
    """tau2's COMMUNICATE check over the transcript's assistant messages."""
    texts = [
        str(m.get("content")).lower().replace(",", "")
        for m in messages
        if m.get("role") == "assistant" and isinstance(m.get("content"), str) and m["content"].strip()
    ]
    return all(any(info.lower() in text for text in texts) for info in task.communicate_info)


def components(
    domain: str, task: Task, live_db_hash: str, messages: list[Message], nl_verdict: bool | None = None
) -> dict[str, float]:
    """Each reward-basis component the task has something to check for (1.0 / 0.0), plus ``nl_assertion_unscored``
    (1.0 when the task's NL assertions need an LLM judge and were not scored). ``nl_verdict``: an LLM judge's verdict
    on them, when one was given (then ``nl_assertion`` is scored instead).

    A component with nothing to check is left out (:func:`vacuous`): COMMUNICATE without strings, NL_ASSERTION
    without assertions. tau2 scores such a component 1.0, and :func:`reward` counts an absent one as 1.0, so the
    reward is tau2's; leaving it out keeps a vacuous 1.0 from reading as a pass in ``score/NAME`` means."""
    result: dict[str, float] = {}
    if "DB" in task.reward_basis:
        result["db"] = float(live_db_hash == gold_hash(domain, task.id))
    if "COMMUNICATE" in task.reward_basis and task.communicate_info:
        result["communicate"] = float(communicated(task, messages))
    if task.needs_llm_judge:
        if nl_verdict is not None:
            result["nl_assertion"] = float(nl_verdict)
        else:
            result["nl_assertion_unscored"] = 1.0
    unknown = set(task.reward_basis) - {"DB", "COMMUNICATE", "NL_ASSERTION"}
    if unknown:  # ENV_ASSERTION / ACTION: no task of airline or retail uses them; refuse rather than guess
        raise ValueError(f"tau2 task {task.id}: reward basis {sorted(unknown)} is not supported")
    return result


def vacuous(task: Task) -> list[str]:
    """The components of ``task``'s reward basis that have nothing to check, which tau2 scores 1.0 and
    :func:`components` leaves out: ``communicate`` (COMMUNICATE without ``communicate_info``: 44 of airline's 50
    tasks) and ``nl_assertion`` (NL_ASSERTION without assertions: 72 of retail's 114)."""
    names = []
    if "COMMUNICATE" in task.reward_basis and not task.communicate_info:
        names.append("communicate")
    if "NL_ASSERTION" in task.reward_basis and not task.nl_assertions:
        names.append("nl_assertion")
    return names


def reward(task: Task, parts: dict[str, float], ended_normally: bool) -> float:
    """The product of the scored components (an absent one counts 1.0: outside the basis, :func:`vacuous`, or NL
    assertions left unscored); 0 when the episode ended abnormally."""
    if not ended_normally:
        return 0.0
    value = 1.0
    for name in ("db", "communicate", "nl_assertion"):
        value *= parts.get(name, 1.0)
    return value
