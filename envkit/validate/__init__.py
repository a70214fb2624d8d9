"""``envkit validate``: find an environment's bugs offline, before they waste GPU hours.

No model is needed: the env is driven by scripted policies (its oracle, no-op answers, a random tool caller, a policy
that never stops, a fuzzer of malformed actions, the oracle with its answer padded by distractors, and the env's own
canaries). Each check reports PASS / FAIL / WARN / SKIP with a one-line reason and a hint how to fix it. An exception
raised by the env is a finding, never a crash of the validator.

The checks — their envkit ids, titles and OpenEnv RFC-008 ids — are listed once, in :data:`registry.REGISTRY
<envkit.validate.registry.REGISTRY>`; :func:`validate_env` runs those of :class:`envkit.Env` classes and
:func:`validate_seed_style` those of seed-style classes (``build_dataset(tokenizer)``, ``score_episode(model,
tokenizer, completion, case_idx)``, optional ``get_tools()``).

Rendering uses the tokenizer passed as ``tokenizer=`` (``envkit validate --tokenizer PATH``) or, without one,
:func:`bundled_tokenizer`: envkit's own ChatML template on a byte-level tokenizer built in memory.

Modules: :mod:`~envkit.validate.registry` (the checks), :mod:`~envkit.validate.runner` (runs them),
:mod:`~envkit.validate.driver` (plays episodes), :mod:`~envkit.validate.policies`, :mod:`~envkit.validate.fuzz` and
:mod:`~envkit.validate.distractors` (what plays), the check modules (``runtime_checks``, ``semantic_checks``,
``verifier_checks``, ``chat_checks``, ``seed_style``; ``crash_checks``: answers as models write them, ``leak_checks``:
state between episodes and instances, ``limit_checks``: the turn cap and cut episodes), :mod:`~envkit.validate.template`
(the chat template) and :mod:`~envkit.validate.report` (the report).
"""

from __future__ import annotations

from envkit.validate.distractors import DISTRACTOR_CALLS, MAX_DISTRACTORS, DistractorPolicy, candidate_tokens
from envkit.validate.driver import CALL_TIMEOUT_S, MAX_TERMINATION_STEPS, Driver, Fault, Hung, Run, timed_call
from envkit.validate.fuzz import fuzz_actions
from envkit.validate.policies import (
    CHATTER,
    REFUSAL,
    SCRIPTED_POLICIES,
    call_message,
    chatter_policy,
    empty_policy,
    oracle_policy,
    random_policy,
    random_value,
    refusal_policy,
    tool_schemas,
)
from envkit.validate.registry import ENV, REGISTRY, SEED_STYLE, CheckSpec, checks, progress_total, titles
from envkit.validate.report import (
    FAIL,
    PASS,
    SKIP,
    WARN,
    Check,
    ConstructionError,
    Outcome,
    ValidationReport,
)
from envkit.validate.runner import validate_env, validate_seed_style
from envkit.validate.runtime_checks import SLOW_STEP_MS
from envkit.validate.seed_style import GARBAGE_COMPLETIONS, is_seed_style
from envkit.validate.template import BUNDLED_LABEL, TemplateTokenizer, bundled_tokenizer

CHECK_NAMES = titles(ENV)
"""The env checks' titles by id (a view of the registry)."""
ENV_PROGRESS_STEPS = progress_total(ENV)
"""Progress ticks of :func:`validate_env` (from the registry)."""
SEED_STYLE_PROGRESS_STEPS = progress_total(SEED_STYLE)
"""Progress ticks of :func:`validate_seed_style` (from the registry)."""

__all__ = [
    "BUNDLED_LABEL",
    "CALL_TIMEOUT_S",
    "CHATTER",
    "CHECK_NAMES",
    "DISTRACTOR_CALLS",
    "ENV",
    "ENV_PROGRESS_STEPS",
    "FAIL",
    "GARBAGE_COMPLETIONS",
    "MAX_DISTRACTORS",
    "MAX_TERMINATION_STEPS",
    "PASS",
    "REFUSAL",
    "REGISTRY",
    "SCRIPTED_POLICIES",
    "SEED_STYLE",
    "SEED_STYLE_PROGRESS_STEPS",
    "SKIP",
    "SLOW_STEP_MS",
    "WARN",
    "Check",
    "CheckSpec",
    "ConstructionError",
    "DistractorPolicy",
    "Driver",
    "Fault",
    "Hung",
    "Outcome",
    "Run",
    "TemplateTokenizer",
    "ValidationReport",
    "bundled_tokenizer",
    "call_message",
    "candidate_tokens",
    "chatter_policy",
    "checks",
    "empty_policy",
    "fuzz_actions",
    "is_seed_style",
    "oracle_policy",
    "progress_total",
    "random_policy",
    "random_value",
    "refusal_policy",
    "timed_call",
    "titles",
    "tool_schemas",
    "validate_env",
    "validate_seed_style",
]
