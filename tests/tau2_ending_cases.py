"""How τ²-bench episodes end, played through envkit's env, for the agreement test (tests/test_tau2_agreement.py), which
replays each through tau2's own orchestrator (scripts/tau2_reference_run.py): the engine's cuts (its turn cap before
the closing message, a token budget halfway; told through ``Env.end``), 9 and 10 failed tool calls (tau2's
``--max-errors``) and tau2's 200 steps (a closing message at turn 99 and at turn 100, 100 tool turns)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from tau2_cases import CLOSING, _call, env_for

from envkit.envs.tau2.data import Action, Task, load_domain

FILLER = {"airline": Action("list_all_airports", {}), "retail": Action("list_all_product_types", {})}
"""A read-only call that always works: what a long episode repeats."""
TAU2_TERMINATION = {
    "done": "user_stop",
    "too_many_errors": "too_many_errors",
    "max_steps": "max_steps",
    "max_turns": "max_steps",
    "max_episode_tokens": "max_steps",
}
"""How tau2's orchestrator ends the run that envkit ended so (an engine cut is a run whose step limit is reached at the
same point)."""


def failing(index: int) -> dict[str, Any]:
    """A call that fails in tau2's environment and in envkit's: an unknown tool, or a known one without arguments."""
    name = "no_such_tool" if index % 2 else "get_user_details"
    return {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": name, "arguments": {}}}]}


def play(env: Any, task: Task, turns: list[dict[str, Any]], cut: str | None = None) -> dict[str, Any]:
    """Play ``turns`` until the episode ends (then ``cut`` it, as the engine would, if it did not end): the
    transcript, how it ended and what tau2's orchestrator needs to replay it."""
    env.reset(options={"task_id": task.id})
    for turn in turns:
        if env.done:
            break
        env.step(turn)
    if not env.done:
        env.end(cut or "max_turns")
    return {
        "messages": [m for m in env.messages if m["role"] != "system"],
        "user_stops": env._stopped,
        "max_steps": env.steps if env.ending.value in ("max_turns", "max_episode_tokens") else env.max_steps,
        "max_errors": env.max_tool_errors,
        "ending": env.ending.value,
        "score": env.score(),
        "tool_errors": env.episode_tool_errors,
    }


def cases(domain: str, every: int = 5) -> Iterator[tuple[str, Task, Callable[[Any], dict[str, Any]]]]:
    """(case name, task, play) for every ``every``-th task of ``domain`` (the step-limit cases on its first task)."""
    tasks = load_domain(domain).tasks
    for number, task in enumerate(tasks):
        if number % every:
            continue
        gold = [_call(a) for a in task.actions]
        closing = {"role": "assistant", "content": f"All done. {'; '.join(task.communicate_info)} {CLOSING}".strip()}
        half = gold[: len(gold) // 2]
        yield "cut by the turn cap before closing", task, lambda env, t=task, g=gold: play(env, t, g, "max_turns")
        yield (
            "cut by a token budget halfway",
            task,
            lambda env, t=task, h=half: play(env, t, h, "max_episode_tokens"),
        )
        for errors in (9, 10):
            turns = [*gold[:-1], *(failing(i) for i in range(errors)), *gold[-1:], closing]
            yield f"{errors} tool errors", task, lambda env, t=task, turns=turns: play(env, t, turns)
    first, filler = tasks[0], _call(FILLER[domain])
    closing = {"role": "assistant", "content": CLOSING}
    for name, turns in (
        ("closing at turn 99", [filler] * 98 + [closing]),
        ("closing at turn 100: tau2's step limit", [filler] * 99 + [closing]),
        ("100 tool turns: tau2's step limit", [filler] * 101),
    ):
        yield name, first, lambda env, t=first, turns=turns: play(env, t, turns)


def played(domain: str) -> dict[str, tuple[Task, dict[str, Any]]]:
    """Every case of ``domain`` played through one env, by case key."""
    env = env_for(domain)
    return {f"{task.id}/{number}/{name}": (task, run(env)) for number, (name, task, run) in enumerate(cases(domain))}
