"""BFCL v4's multi-turn data (tasks, ground truth, function docs), read from the installed ``bfcl-eval`` package;
nothing is vendored here.

``bfcl-eval`` (Apache-2.0, the Berkeley Function Calling Leaderboard's own package) is installed with ``--no-deps``:
its declared dependencies pin numpy 1.26, vLLM, faiss and five API SDKs, none of which the multi-turn categories use.
The multi-turn part needs only ``mpmath`` (its ``MathAPI``). See envs/bfcl/README.md.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envkit.util.install import install_command

BFCL_VERSION = "2026.3.23"
"""The ``bfcl-eval`` release envkit's agreement suite was run against (``pip install --no-deps bfcl-eval==…``)."""

CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
"""BFCL v4's multi-turn categories (200 tasks each), in BFCL's order."""

SPLITS: dict[str, tuple[str, ...]] = {
    "train": ("base",),
    "test": ("miss_func", "miss_param", "long_context"),
    "all": CATEGORIES,
    **{category: (category,) for category in CATEGORIES},
}
"""Split → the categories it plays: train on ``base``; ``test`` holds the other three out (each also on its own)."""

PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
"""What BFCL appends to every function description of a Python category (``_get_language_specific_hint``)."""

ADDITIONAL_FUNCTION_PROMPT = "I have updated some more functions you can choose from. What about now?"
"""BFCL's user message at a ``miss_func`` task's held-out turn (``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``)."""

ADDITIONAL_FUNCTION_PROMPT_WITH_DOCS = "{functions}\n" + ADDITIONAL_FUNCTION_PROMPT
"""The same for prompting-mode models, which get the new functions' docs in the message itself
(``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING``): what envkit sends, so the tool list in the system
prompt never changes mid-episode and every earlier token stays as it was."""

# BFCL's type names → JSON Schema's (bfcl_eval.constants.type_mappings.GORILLA_TO_OPENAPI).
GORILLA_TO_OPENAPI: dict[str, str] = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
    "byte": "integer",
    "short": "integer",
    "long": "integer",
    "double": "number",
    "char": "string",
    "ArrayList": "array",
    "Array": "array",
    "HashMap": "object",
}


class BfclMissing(ValueError):
    """``bfcl-eval`` is not installed; the message names the command."""


def install_hint() -> str:
    """The commands that install what ``bfcl-multi-turn`` needs into this envkit."""
    return f"{install_command('bfcl')} && pip install --no-deps bfcl-eval=={BFCL_VERSION}"


@dataclass
class Task:
    """One BFCL multi-turn task: its conversation, the APIs it runs on and their ground truth."""

    id: str
    """BFCL's id, e.g. ``multi_turn_base_0``."""
    category: str
    ground_truth: list[list[str]] = field(repr=False)
    """Each turn's gold calls as BFCL writes them (``"cd(folder='document')"``); a turn may have none."""
    raw: dict[str, Any] = field(repr=False)
    """BFCL's entry as published (``question``, ``initial_config``, ``involved_classes``, ``missed_function``…)."""

    @property
    def turns(self) -> list[list[dict[str, Any]]]:
        """The user's messages of each turn (``question``); a ``miss_func`` task's held-out turn is empty."""
        return self.raw["question"]

    @property
    def initial_config(self) -> dict[str, Any]:
        """Each involved class's starting state (BFCL's ``initial_config``)."""
        return self.raw["initial_config"]

    @property
    def involved_classes(self) -> list[str]:
        """The API classes of the task, in BFCL's order."""
        return self.raw["involved_classes"]

    @property
    def long_context(self) -> bool:
        """Whether BFCL loads the APIs' long-context scenario (``long_context`` in the category)."""
        return "long_context" in self.category

    @property
    def functions(self) -> list[dict[str, Any]]:
        """The function docs offered from the start (BFCL's ``function`` after ``populate…`` and the Python hint)."""
        return self._docs[0]

    @property
    def missed_functions(self) -> dict[int, list[dict[str, Any]]]:
        """``miss_func``: turn → the function docs held out until that turn (BFCL's ``missed_function``), unhinted."""
        return self._docs[1]

    @functools.cached_property
    def tools(self) -> list[dict[str, Any]]:
        """The tools offered from the start, as BFCL's function-calling handlers send them to an OpenAI-style API."""
        return to_tools(self.functions)

    @functools.cached_property
    def _docs(self) -> tuple[list[dict[str, Any]], dict[int, list[dict[str, Any]]]]:
        # BFCL's populate_test_cases_with_predefined_functions, then add_language_specific_hint_to_function_doc;
        # built when the task is first played.
        functions = [doc for name in self.involved_classes for doc in json.loads(_function_docs(name))]
        missed: dict[int, list[dict[str, Any]]] = {}
        for turn, names in (self.raw.get("missed_function") or {}).items():
            missed[int(turn)] = []
            for name in names:
                for index, doc in enumerate(functions):
                    if doc["name"] == name:
                        missed[int(turn)].append(functions.pop(index))
                        break
        for doc in functions:
            doc["description"] = doc["description"] + PYTHON_HINT
        return functions, missed


def package_folder() -> Path:
    """The installed ``bfcl_eval`` package's folder; :class:`BfclMissing` when it is not installed."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or spec.origin is None:
        raise BfclMissing(f"bfcl-multi-turn needs BFCL's package bfcl-eval, which is not installed: {install_hint()}")
    if importlib.util.find_spec("mpmath") is None:
        raise BfclMissing(f"bfcl-multi-turn needs mpmath (BFCL's MathAPI uses it): {install_hint()}")
    return Path(spec.origin).parent


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@functools.cache
def _function_docs(class_name: str) -> str:
    """A class's function docs as one JSON array's text: each task parses its own copy (faster than deep copies)."""
    from bfcl_eval.constants.executable_backend_config import MULTI_TURN_FUNC_DOC_FILE_MAPPING

    file = package_folder() / "data" / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name]
    return json.dumps(_jsonl(file))


@functools.cache
def load_category(category: str) -> tuple[Task, ...]:
    """The tasks of one multi-turn category in BFCL's order, read once per process.

    Raises:
        ValueError: Not a multi-turn category.
        BfclMissing: ``bfcl-eval`` is not installed.
    """
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL multi-turn category {category!r}; choose from {', '.join(CATEGORIES)}")
    data = package_folder() / "data"
    raws = _jsonl(data / f"BFCL_v4_multi_turn_{category}.json")
    file = f"BFCL_v4_multi_turn_{category}.json"
    answers = {row["id"]: row["ground_truth"] for row in _jsonl(data / "possible_answer" / file)}
    return tuple(Task(raw["id"], category, answers[raw["id"]], raw) for raw in raws)


def split_tasks(split: str) -> list[Task]:
    """The tasks of ``split`` (:data:`SPLITS`), category after category in BFCL's order."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; choose from {', '.join(SPLITS)}")
    return [task for category in SPLITS[split] for task in load_category(category)]


def find_task(task_id: str) -> Task:
    """The task with BFCL's id ``task_id`` (``multi_turn_miss_param_12``), whatever the split."""
    match = re.fullmatch(r"multi_turn_(\w+)_(\d+)", task_id)
    if match is None or match.group(1) not in CATEGORIES:
        raise ValueError(f"{task_id!r} is not a BFCL multi-turn task id (e.g. 'multi_turn_base_0')")
    for task in load_category(match.group(1)):
        if task.id == task_id:
            return task
    raise ValueError(f"BFCL has no task {task_id!r}")


def to_tools(functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Function docs as BFCL's function-calling handlers send them to OpenAI-style chat APIs: BFCL's
    ``convert_to_tool(functions, GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)``, ported (its module imports
    BFCL's parsers and API SDKs, which a ``--no-deps`` install lacks).

    Args:
        functions: BFCL function docs (``name``, ``description``, ``parameters``, ``response``).

    Returns:
        ``{"type": "function", "function": doc}`` with BFCL's types mapped to JSON Schema's.
    """
    tools = []
    for item in copy.deepcopy(functions):
        item["name"] = re.sub(r"\.", "_", item["name"])
        item["parameters"]["type"] = "object"
        item["parameters"]["properties"] = _cast_to_openai_type(item["parameters"]["properties"])
        tools.append({"type": "function", "function": item})
    return tools


def _cast_to_openai_type(properties: dict[str, Any]) -> dict[str, Any]:
    # BFCL's _cast_to_openai_type with GORILLA_TO_OPENAPI, line for line.
    mapping = GORILLA_TO_OPENAPI
    for key, value in properties.items():
        if "type" not in value:
            properties[key]["type"] = "string"
        else:
            var_type = value["type"]
            if var_type == "float":
                properties[key]["format"] = "float"
                properties[key]["description"] += " This is a float type value."
            properties[key]["type"] = mapping.get(var_type, "string")
        if properties[key]["type"] in ("array", "object"):
            if "properties" in properties[key]:
                properties[key]["properties"] = _cast_to_openai_type(properties[key]["properties"])
            elif "items" in properties[key]:
                items = properties[key]["items"]
                items["type"] = mapping[items["type"]]
                if items["type"] == "array" and "items" in items:
                    items["items"]["type"] = mapping[items["items"]["type"]]
                elif items["type"] == "object" and "properties" in items:
                    items["properties"] = _cast_to_openai_type(items["properties"])
    return properties
