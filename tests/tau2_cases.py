"""Trajectories over every task of tau2-airline / tau2-retail, played through envkit's env, for the agreement test
(tests/test_tau2_agreement.py) and the oracle test: the gold path, the gold path minus each DB-changing action, an
empty conversation, and wrong-argument variants (an argument of a DB-changing gold action replaced by the value the
same argument has in another task's gold actions, an integer moved by one, a list shortened)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import envkit
from envkit.envs.tau2 import scoring
from envkit.envs.tau2.data import Action, Task, load_domain

CLOSING = "Thank you, goodbye."
"""The agent's last message: no question, so the scripted user ends the conversation (tau2's USER_STOP)."""


def _call(action: Action) -> dict[str, Any]:
    call = {"type": "function", "function": {"name": action.name, "arguments": copy.deepcopy(action.arguments)}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def play(env: Any, task: Task, actions: list[Action], closing: str) -> dict[str, Any]:
    """Play one trajectory through ``env``: one tool call per turn, then ``closing``; the transcript and score."""
    env.reset(options={"task_id": task.id})
    for action in actions:
        if env.done:
            break
        env.step(_call(action))
    if not env.done:
        env.step({"role": "assistant", "content": closing})
    return {
        "messages": [m for m in env.messages if m["role"] != "system"],
        "stopped": env._stopped,
        "score": env.score(),
        "components": env.score_components(),
    }


def _argument_pool(domain: str) -> dict[str, list[Any]]:
    pool: dict[str, list[Any]] = {}
    for task in load_domain(domain).tasks:
        for action in task.actions:
            for name, value in action.arguments.items():
                if value not in pool.setdefault(name, []):
                    pool[name].append(value)
    return pool


def wrong_arguments(domain: str, task: Task, limit: int = 3) -> Iterator[tuple[str, list[Action]]]:
    """Up to ``limit`` variants of the gold path, each with one argument of one DB-changing action changed."""
    writes = scoring.tools_class(domain).write_tools()
    pool = _argument_pool(domain)
    made = 0
    for index, action in enumerate(task.actions):
        if action.name not in writes:
            continue
        for name, value in sorted(action.arguments.items()):
            if made >= limit:
                return
            if isinstance(value, bool):
                continue
            if isinstance(value, int):
                changed: Any = value + 1
            elif isinstance(value, list) and len(value) > 1:
                changed = value[:-1]
            else:
                changed = next((v for v in pool.get(name, []) if v != value and type(v) is type(value)), None)
                if changed is None:
                    continue
            variant = list(task.actions)
            variant[index] = Action(action.name, {**action.arguments, name: changed}, action.requestor)
            made += 1
            yield f"wrong {action.name}.{name}", variant


def cases(domain: str) -> Iterator[tuple[str, Task, list[Action], str]]:
    """(case name, task, actions, closing message) for every task of ``domain``."""
    writes = scoring.tools_class(domain).write_tools()
    for task in load_domain(domain).tasks:
        said = "; ".join(task.communicate_info)
        yield "gold", task, list(task.actions), f"All done. {said} {CLOSING}".strip()
        yield "gold without saying", task, list(task.actions), CLOSING
        for index, action in enumerate(task.actions):
            if action.name in writes:
                yield (
                    f"gold minus #{index} {action.name}",
                    task,
                    [*task.actions[:index], *task.actions[index + 1 :]],
                    CLOSING,
                )
        yield "empty", task, [], CLOSING
        for name, actions in wrong_arguments(domain, task):
            yield name, task, actions, CLOSING


def env_for(domain: str) -> Any:
    """The envkit env of ``domain`` over all its tasks."""
    return envkit.make(f"tau2-{domain}", split="base", include_read_only=True)
