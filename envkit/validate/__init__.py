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

The package imports its submodules on first use (:pep:`562`): ``import envkit.validate.seed_style`` (what ``envkit
train`` asks) or ``from envkit.validate import is_seed_style`` loads that module, not the whole validator.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envkit.validate.distractors import DistractorPolicy
    from envkit.validate.driver import Driver
    from envkit.validate.policies import oracle_policy
    from envkit.validate.registry import ENV, REGISTRY, SEED_STYLE, CheckSpec, checks, progress_total, titles
    from envkit.validate.report import FAIL, PASS, SKIP, WARN, Check, ConstructionError, Outcome, ValidationReport
    from envkit.validate.runner import validate_env, validate_seed_style
    from envkit.validate.seed_style import is_seed_style
    from envkit.validate.template import BUNDLED_LABEL, TemplateTokenizer, bundled_tokenizer

_HOMES = {
    "validate_env": "runner",
    "validate_seed_style": "runner",
    "is_seed_style": "seed_style",
    "ValidationReport": "report",
    "Check": "report",
    "Outcome": "report",
    "ConstructionError": "report",
    "PASS": "report",
    "FAIL": "report",
    "WARN": "report",
    "SKIP": "report",
    "REGISTRY": "registry",
    "ENV": "registry",
    "SEED_STYLE": "registry",
    "CheckSpec": "registry",
    "checks": "registry",
    "progress_total": "registry",
    "titles": "registry",
    "bundled_tokenizer": "template",
    "TemplateTokenizer": "template",
    "BUNDLED_LABEL": "template",
    "Driver": "driver",
    "DistractorPolicy": "distractors",
    "oracle_policy": "policies",
}
"""Each public name and the submodule that defines it (the submodule is imported when the name is first used)."""

__all__ = [
    "BUNDLED_LABEL",
    "ENV",
    "FAIL",
    "PASS",
    "REGISTRY",
    "SEED_STYLE",
    "SKIP",
    "WARN",
    "Check",
    "CheckSpec",
    "ConstructionError",
    "DistractorPolicy",
    "Driver",
    "Outcome",
    "TemplateTokenizer",
    "ValidationReport",
    "bundled_tokenizer",
    "checks",
    "is_seed_style",
    "oracle_policy",
    "progress_total",
    "titles",
    "validate_env",
    "validate_seed_style",
]


def __getattr__(name: str) -> Any:
    """Import the submodule that defines ``name`` on first use (:pep:`562`); submodules load as usual."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
