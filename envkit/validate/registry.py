"""The one registry of checks: each check's envkit id, title, OpenEnv RFC-008 id and function, in run order.

The runner, the CLI's progress bar, ``--json``, the human report and the README's tables all read it (a test holds
the README to it). RFC-008 ids are those of OpenEnv's "Environment Auto-Validation" RFC; ``None`` where it has no
check for what envkit checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envkit.validate.answer_checks import check_accepts_more, check_answer_hidden, check_tool_answer
from envkit.validate.chat_checks import check_schemas, check_transcripts
from envkit.validate.crash_checks import check_final_inputs
from envkit.validate.ending_checks import check_cut_ending
from envkit.validate.leak_checks import STATE_LEAK, check_leaks
from envkit.validate.limit_checks import check_cuts, check_termination
from envkit.validate.policies import SCRIPTED_POLICIES
from envkit.validate.report import (
    RESET_BROKEN,
    RESET_NONDETERMINISTIC,
    STEP_NONDETERMINISTIC,
    TEMPLATE_DROPS_TOOLS,
    VACUOUS_SCORE,
    Outcome,
)
from envkit.validate.runtime_checks import (
    SCORE_RAISES,
    check_contract,
    check_copy,
    check_fuzz,
    check_isolation,
    check_latency,
    check_replay,
    check_reset,
    check_scores,
)
from envkit.validate.seed_style import check_construction, check_dataset, check_scoring, check_tools
from envkit.validate.semantic_checks import check_group_signal, check_noop, check_oracle
from envkit.validate.verifier_checks import check_canaries, check_verifier_determinism

ENV, SEED_STYLE = "env", "seed-style"
"""The kinds of target: :class:`envkit.Env` classes and seed-style classes (their reports' ``kind``)."""


@dataclass(frozen=True)
class RootCause:
    """A bug that breaks checks beyond the one that finds it.

    Args:
        key: Its name (an :class:`~envkit.validate.report.Outcome`'s ``cause``).
        owner: The id of the env check that reports it.
        what: What is wrong, for the SKIP line of a check that depends on it.
    """

    key: str
    owner: int
    what: str


ROOT_CAUSES: dict[str, RootCause] = {
    cause.key: cause
    for cause in (
        RootCause(RESET_BROKEN, 2, "reset() fails or returns malformed opening messages"),
        RootCause(RESET_NONDETERMINISTIC, 2, "reset() with one seed gives different tasks"),
        RootCause(STEP_NONDETERMINISTIC, 5, "the same seed and actions give another episode"),
        RootCause(VACUOUS_SCORE, 4, "score() is 1.0 before any action"),
        RootCause(TEMPLATE_DROPS_TOOLS, 10, "the chat template drops the tool definitions"),
        RootCause(STATE_LEAK, 22, "episodes write into state that later episodes or other instances read"),
        RootCause(SCORE_RAISES, 8, "score() raises"),
    )
}
"""The root causes one check reports and others depend on: when the owner FAILs with one, every check that
:attr:`depends on <CheckSpec.depends_on>` it and did not pass is reported as SKIP "see check N" instead of
repeating the finding under another name."""


@dataclass(frozen=True)
class CheckSpec:
    """One registered check.

    Args:
        id: envkit's number of the check within its kind (the report's ``#``; stable across releases).
        title: Its name in reports and the README.
        rfc008: The OpenEnv RFC-008 check id it implements, or ``None``.
        run: The check: takes the run's context (:class:`~envkit.validate.context.EnvContext` or
            :class:`~envkit.validate.seed_style.SeedContext`) and returns an :class:`Outcome`.
        kind: :data:`ENV` or :data:`SEED_STYLE`.
        needs_episodes: Env checks only: ``False`` for a check that runs before the scripted policies play.
        after_hang: Runs even after an env call hung (it reports the hang); every other check is then a SKIP.
        depends_on: The :data:`ROOT_CAUSES` that make this check meaningless: once the owner reported one, this
            check's FAIL, WARN or SKIP becomes a SKIP naming the owner (a PASS stands).
    """

    id: int
    title: str
    rfc008: str | None
    run: Callable[[Any], Outcome]
    kind: str = ENV
    needs_episodes: bool = True
    after_hang: bool = False
    depends_on: tuple[str, ...] = ()


# Run order matters where a check reads what earlier ones left on the driver: the score check reads the scores of the
# scripted, fuzzing and endless episodes (the verifier checks, after it, judge their own replays' scores), latency
# times every call before it, and the transcript check renders every episode played, so it comes last.
_EPISODES = (RESET_BROKEN,)  # every check that plays episodes needs a working reset()
_SAME_SEED = (RESET_BROKEN, RESET_NONDETERMINISTIC)  # checks that compare two episodes of one seed
REGISTRY: tuple[CheckSpec, ...] = (
    CheckSpec(1, "construction and contract", None, check_contract, needs_episodes=False),
    CheckSpec(3, "oracle reaches 1.0", "semantic.oracle_max", check_oracle, depends_on=_EPISODES),
    CheckSpec(4, "no-op policies never reach 1.0", "semantic.floor_gap", check_noop, depends_on=_EPISODES),
    CheckSpec(15, "answers padded with distractors", None, check_accepts_more, depends_on=_SAME_SEED),
    CheckSpec(19, "answer hidden until the work is done", None, check_answer_hidden, depends_on=_SAME_SEED),
    CheckSpec(
        20,
        "score depends on a tool-call answer",
        None,
        check_tool_answer,
        depends_on=(*_SAME_SEED, STEP_NONDETERMINISTIC),
    ),
    CheckSpec(2, "reset: messages, seeding, variety", "runtime.seed_control", check_reset),
    CheckSpec(22, "state between episodes and instances", None, check_leaks, depends_on=_SAME_SEED),
    CheckSpec(
        5, "replay determinism", "runtime.episode_determinism", check_replay, depends_on=(STATE_LEAK, *_SAME_SEED)
    ),
    CheckSpec(
        6,
        "isolation between instances",
        "runtime.episode_isolation",
        check_isolation,
        depends_on=(STATE_LEAK, *_SAME_SEED, STEP_NONDETERMINISTIC),
    ),
    CheckSpec(7, "fuzzing with malformed actions", None, check_fuzz, depends_on=_EPISODES),
    CheckSpec(
        9,
        "termination by max_turns",
        "runtime.resource_bounds",
        check_termination,
        depends_on=(*_EPISODES, SCORE_RAISES),
    ),
    CheckSpec(8, "scores finite and in [0, 1]", "runtime.reward_well_formed", check_scores),
    CheckSpec(
        21,
        "final answers as a model writes them",
        None,
        check_final_inputs,
        depends_on=(STATE_LEAK, *_SAME_SEED, STEP_NONDETERMINISTIC),
    ),
    CheckSpec(
        16,
        "verifier determinism",
        "semantic.verifier_determinism",
        check_verifier_determinism,
        depends_on=(STATE_LEAK, *_SAME_SEED, STEP_NONDETERMINISTIC),
    ),
    CheckSpec(17, "canaries stay at the no-op floor", "semantic.canary_floor", check_canaries, depends_on=_SAME_SEED),
    CheckSpec(
        18,
        "score when the engine cuts the episode",
        None,
        check_cut_ending,
        depends_on=(*_SAME_SEED, STEP_NONDETERMINISTIC, SCORE_RAISES),
    ),
    CheckSpec(
        23,
        "score when an episode is cut at any turn",
        None,
        check_cuts,
        depends_on=(STATE_LEAK, *_SAME_SEED, STEP_NONDETERMINISTIC),
    ),
    CheckSpec(
        10,
        "tool schemas and chat template",
        "runtime.tool_declaration_accuracy",
        check_schemas,
        depends_on=_EPISODES,
    ),
    CheckSpec(
        11,
        "group signal",
        "statistical.variance_bound",
        check_group_signal,
        depends_on=(*_SAME_SEED, VACUOUS_SCORE),
    ),
    CheckSpec(12, "deep-copy and pickle", None, check_copy),
    CheckSpec(13, "latency", "semantic.resource_envelope", check_latency, after_hang=True),
    CheckSpec(
        14,
        "transcripts through the chat template",
        "runtime.observation_schema",
        check_transcripts,
        depends_on=(RESET_BROKEN, TEMPLATE_DROPS_TOOLS),
    ),
    CheckSpec(1, "construction and interface", None, check_construction, kind=SEED_STYLE),
    CheckSpec(2, "dataset", "runtime.task_declaration_accuracy", check_dataset, kind=SEED_STYLE),
    CheckSpec(3, "score_episode", "runtime.reward_well_formed", check_scoring, kind=SEED_STYLE),
    CheckSpec(4, "tool schemas", "runtime.tool_declaration_accuracy", check_tools, kind=SEED_STYLE),
)
"""Every check of both kinds, each kind's in the order they run."""


def checks(kind: str = ENV) -> list[CheckSpec]:
    """The checks of ``kind``, in run order."""
    if kind not in (ENV, SEED_STYLE):
        raise ValueError(f"unknown kind {kind!r}: {ENV!r} or {SEED_STYLE!r}")
    return [spec for spec in REGISTRY if spec.kind == kind]


def by_id(kind: str = ENV) -> list[CheckSpec]:
    """The checks of ``kind``, in id order (the order of reports and the README)."""
    return sorted(checks(kind), key=lambda spec: spec.id)


def titles(kind: str = ENV) -> dict[int, str]:
    """Each check's title by id."""
    return {spec.id: spec.title for spec in by_id(kind)}


def progress_total(kind: str = ENV) -> int:
    """How many times a validation of ``kind`` ticks its progress callback: once per check, and for env classes
    once per scripted policy's episodes too."""
    return len(checks(kind)) + (len(SCRIPTED_POLICIES) if kind == ENV else 0)
