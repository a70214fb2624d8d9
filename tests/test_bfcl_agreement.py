"""bfcl-multi-turn against BFCL itself, on every multi-turn task (``pytest -m bfcl``; scripts/test.sh runs it).

For each of BFCL v4's 800 multi-turn tasks, trajectories are played through envkit's env and scored twice: by the
env, and by BFCL's own ``multi_turn_checker`` (package ``bfcl-eval``) on the same calls written as BFCL's
function-calling handlers write them (:func:`~envkit.envs.bfcl.execution.call_string`: validated names and
``repr``-ed literals, the only strings BFCL's ``eval`` is given here). The trajectories: the ground truth, the ground
truth without each one of its calls, no calls at all, and up to three wrong-argument variants (one argument of a
gold call changed). Every score must equal BFCL's verdict, and every tool result the model reads must equal what
BFCL's inference executor returns for the same call. The same helpers run on a few tasks in the default suite
(tests/test_bfcl.py).
"""

from __future__ import annotations

import ast
import copy
import itertools
import re
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("bfcl_eval", reason="BFCL is not installed: pip install --no-deps bfcl-eval==2026.3.23 mpmath")

from envkit.envs.bfcl import BfclMultiTurnEnv, data
from envkit.envs.bfcl.data import Task
from envkit.envs.bfcl.execution import Apis, call_string
from envkit.envs.bfcl.scoring import MAX_STEPS_PER_TURN

Call = tuple[str, dict[str, Any]]
Trajectory = list[list[list[Call]]]
"""Per user turn, the model's replies with calls (each a list of calls); every turn then ends with a text reply."""

_names = itertools.count()


def bfcl_inference(trajectory: Trajectory) -> Trajectory:
    """The part of ``trajectory`` BFCL's inference would play: it quits the task after a turn's 21st calling reply
    (more than ``MAXIMUM_STEP_LIMIT`` steps), so later replies and turns never happen."""
    played: Trajectory = []
    for turn in trajectory:
        steps = [step for step in turn if step]
        played.append(steps[: MAX_STEPS_PER_TURN + 1])
        if len(steps) > MAX_STEPS_PER_TURN:
            break
    return played


def bfcl_verdict(task: Task, trajectory: Trajectory) -> bool:
    """BFCL's own verdict on ``trajectory``, as its eval runner gives it (``_evaluate_single_multi_turn_entry``): a
    task its inference quit before the last turn is invalid; otherwise ``multi_turn_checker``, under a model name no
    other case uses (its executor caches instances in its module's globals by model name and task id; they are
    removed afterwards)."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    played = bfcl_inference(trajectory)
    if len(played) != len(task.ground_truth):
        return False
    model = f"envkit_case_{next(_names)}"
    decoded = [[[call_string(name, args) for name, args in step] for step in turn] for turn in played]
    try:
        verdict = multi_turn_checker(decoded, task.ground_truth, copy.deepcopy(task.raw), task.category, model)
        return bool(verdict["valid"])
    finally:
        _forget(multi_turn_utils, model)


def bfcl_results(task: Task, trajectory: Trajectory) -> list[list[str]]:
    """What BFCL's inference shows the model for each reply of ``trajectory``: its executor's results, in order."""
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    model = f"envkit_run_{next(_names)}"
    shown = []
    try:
        for turn in bfcl_inference(trajectory):
            for step in turn:
                if step:
                    calls = [call_string(name, args) for name, args in step]
                    results, _ = execute_multi_turn_func_call(
                        calls,
                        task.initial_config,
                        task.involved_classes,
                        model,
                        task.id,
                        long_context=task.long_context,
                    )
                    shown.append(results)
    finally:
        _forget(multi_turn_utils, model)
    return shown


def _forget(module: Any, model: str) -> None:
    prefix = re.sub(r"[-./:]", "_", model) + "_"
    for key in [key for key in vars(module) if key.startswith(prefix)]:
        del vars(module)[key]


def play(env: BfclMultiTurnEnv, task: Task, trajectory: Trajectory) -> tuple[float, list[list[str]]]:
    """Play ``trajectory`` through the env until it ends the episode: each reply as a message with tool calls, each
    turn closed by a text reply. Returns the score and the tool results the model read, reply by reply."""
    env.reset(options={"task_id": task.id})
    shown = []
    for turn in trajectory:
        for step in turn:
            if step and not env.done:
                calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in step]
                observation, *_ = env.step({"role": "assistant", "content": "", "tool_calls": calls})
                shown.append([m["content"] for m in observation if m["role"] == "tool"])
        if not env.done:
            env.step("Done.")
    assert env.done
    return env.score(), shown


def wrong(value: Any) -> Any:
    """Another value of the same JSON kind (a list loses its last item, an empty one gains one)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 1.5
    if isinstance(value, str):
        return value + "_x"
    if isinstance(value, list):
        return value[:-1] if value else ["x"]
    if isinstance(value, dict):
        return {}
    return "x"


def trajectories(task: Task, wrong_arguments: int = 3) -> Iterator[tuple[str, Trajectory]]:
    """The cases of one task: ``gold`` (each turn's gold calls in one reply), ``gold, one call per reply``, ``empty``,
    ``minus T.I`` (gold without call I of turn T) and ``wrong T.I.ARG`` (the first ``wrong_arguments`` gold calls
    that have arguments, their first argument changed)."""
    apis = Apis(task)
    gold = [[apis.gold_call(text) for text in turn] for turn in task.ground_truth]
    yield "gold", [[list(turn)] for turn in gold]
    yield "gold, one call per reply", [[[call] for call in turn] for turn in gold]
    yield "empty", [[] for _ in gold]
    where = [(t, i) for t, turn in enumerate(gold) for i in range(len(turn))]
    for t, i in where:
        cut = [[list(turn)] for turn in gold]
        del cut[t][0][i]
        yield f"minus {t}.{i}", cut
    changed = 0
    for t, i in where:
        name, arguments = gold[t][i]
        if not arguments or changed == wrong_arguments:
            continue
        key = sorted(arguments)[0]
        case = [[list(turn)] for turn in gold]
        case[t][0][i] = (name, {**arguments, key: wrong(arguments[key])})
        changed += 1
        yield f"wrong {t}.{i}.{key}", case


def disagreements(env: BfclMultiTurnEnv, task: Task) -> tuple[int, list[str]]:
    """Every case of ``task`` scored by the env and by BFCL: how many, and those that differ."""
    differ, count = [], 0
    for label, trajectory in trajectories(task):
        score, shown = play(env, task, trajectory)
        verdict = bfcl_verdict(task, trajectory)
        count += 1
        if score != float(verdict):
            differ.append(f"{task.id} {label}: envkit {score}, BFCL {verdict}")
        if shown != bfcl_results(task, trajectory):
            differ.append(f"{task.id} {label}: tool results differ from BFCL's executor")
    return count, differ


def bfcl_convert_to_tool() -> Any:
    """BFCL's own ``convert_to_tool`` and ``_cast_to_openai_type``, taken from its installed source (their module
    imports BFCL's parsers and API SDKs, which a ``--no-deps`` install lacks) and compiled alone."""
    import json
    from pathlib import Path

    from bfcl_eval.constants.enums import ModelStyle
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    source = (Path(data.package_folder()) / "model_handler" / "utils.py").read_text()
    wanted = {"convert_to_tool", "_cast_to_openai_type"}
    tree = ast.parse(source)
    tree.body = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in wanted]
    namespace: dict[str, Any] = {"copy": copy, "re": re, "json": json, "ModelStyle": ModelStyle}
    namespace["GORILLA_TO_OPENAPI"] = GORILLA_TO_OPENAPI
    exec(compile(tree, "bfcl_eval/model_handler/utils.py", "exec"), namespace)
    return lambda functions: namespace["convert_to_tool"](functions, GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)


@pytest.mark.bfcl
@pytest.mark.parametrize("category", data.CATEGORIES)
def test_every_case_of_every_task_scores_as_bfcls_checker(category):
    env = BfclMultiTurnEnv(split=category)
    total, differ = 0, []
    for task in data.load_category(category):
        count, found = disagreements(env, task)
        total += count
        differ += found
    assert differ == [], f"{len(differ)} of {total} cases differ: {differ[:5]}"
    assert total > 2000


@pytest.mark.bfcl
def test_every_tasks_tools_are_bfcls_conversion_of_its_function_docs():
    convert = bfcl_convert_to_tool()
    for task in data.split_tasks("all"):
        assert task.tools == convert(task.functions), task.id
