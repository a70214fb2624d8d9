"""Runs the registry's checks on a target and collects their outcomes into a :class:`ValidationReport`."""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from typing import Any

from envkit.core.env import Env
from envkit.validate.context import EnvContext
from envkit.validate.driver import CALL_TIMEOUT_S, Driver, timed_call
from envkit.validate.policies import SCRIPTED_POLICIES
from envkit.validate.registry import ENV, ROOT_CAUSES, SEED_STYLE, CheckSpec, checks
from envkit.validate.report import FAIL, PASS, SKIP, Check, ConstructionError, Outcome, ValidationReport
from envkit.validate.seed_style import SeedContext
from envkit.validate.template import TemplateTokenizer


def validate_env(
    factory: Callable[[], Env],
    *,
    target: str,
    episodes: int = 8,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    call_timeout_s: float = CALL_TIMEOUT_S,
    tokenizer: Any = None,
) -> ValidationReport:
    """Run every env check of the registry on the env built by ``factory`` over seeds ``seed … seed+episodes-1``.

    An env call (constructor, reset, step, score, oracle, canaries) that does not return within ``call_timeout_s``
    fails the latency check with the call named; the checks that would have needed the hung env are reported as SKIP.

    ``tokenizer`` (a Hugging Face tokenizer with a chat template, normally the model's) renders the opening prompt
    and every transcript played; ``None`` uses :func:`~envkit.validate.template.bundled_tokenizer`.

    Raises:
        ConstructionError: when ``factory()`` raises or hangs (nothing else can be checked).
    """
    started = time.perf_counter()
    tick = progress or (lambda _: None)
    chat = TemplateTokenizer.of(tokenizer)
    try:
        env = timed_call(factory, call_timeout_s)[0]
    except Exception as error:
        raise ConstructionError(f"constructing the env failed: {type(error).__name__}: {error}") from error
    driver = Driver(factory, call_timeout_s)
    driver.adopt(env)  # closed once a check needs an env of its own: validate holds no more envs than it needs
    seeds = list(range(seed, seed + max(2, episodes)))
    ctx = EnvContext(factory, env, driver, seeds, chat)
    specs = checks(ENV)
    hang_reporter = next(s for s in specs if s.after_hang)
    outcomes: list[tuple[CheckSpec, Outcome]] = []
    try:
        # No env outlives the check or the episodes it was made for (driver.close_all after each).
        for spec in (s for s in specs if not s.needs_episodes):
            outcomes.append((spec, run_outcome(spec, ctx)))
            driver.close_all()
            tick(spec.title)
        for name, policy in SCRIPTED_POLICIES:
            ctx.runs[name] = [driver.play(name, policy, s) for s in seeds]
            driver.close_all()
            tick(f"{name} episodes")
        for spec in (s for s in specs if s.needs_episodes):
            if driver.hang is None or spec.after_hang:
                outcomes.append((spec, run_outcome(spec, ctx)))
            else:
                outcomes.append((spec, Outcome(SKIP, f"not run: the env hung (see check {hang_reporter.id})")))
            driver.close_all()
            tick(spec.title)
    finally:
        driver.close_all()
    results = [_reported(spec, outcome) for spec, outcome in attribute_root_causes(outcomes)]
    results.sort(key=lambda c: c.id)
    return ValidationReport(target, ENV, results, time.perf_counter() - started, seeds, chat.label)


def validate_seed_style(
    cls: type,
    config: dict[str, Any],
    *,
    target: str,
    progress: Callable[[str], None] | None = None,
    tokenizer: Any = None,
) -> ValidationReport:
    """Run every seed-style check of the registry on a seed-style env class: construction, dataset, scoring of dummy
    completions, tool schemas.

    ``tokenizer`` is handed to ``build_dataset`` and ``score_episode`` (``None``: the bundled one). Whatever the
    class does wrong is reported as a FAIL of the check it broke, never raised; only a constructor that raises is a
    :class:`ConstructionError`. When the dataset cannot be built, the checks after it are not run.

    Raises:
        ConstructionError: when ``cls(**config)`` raises.
    """
    started = time.perf_counter()
    tick = progress or (lambda _: None)
    chat = TemplateTokenizer.of(tokenizer)
    try:
        instance = cls(**config)
    except Exception as error:
        message = f"constructing {cls.__name__} with {config} failed: {type(error).__name__}: {error}"
        raise ConstructionError(message) from error
    ctx = SeedContext(cls, config, instance, chat)
    results = []
    for spec in checks(SEED_STYLE):
        results.append(run_check(spec, ctx))
        tick(spec.title)
        if ctx.halted:
            break
    return ValidationReport(target, SEED_STYLE, results, time.perf_counter() - started, [], chat.label)


def run_check(spec: CheckSpec, ctx: Any) -> Check:
    """Run one check; an unexpected exception (an env broken in a way no check foresaw) becomes a FAIL."""
    return _reported(spec, run_outcome(spec, ctx))


def run_outcome(spec: CheckSpec, ctx: Any) -> Outcome:
    """The outcome of one check; an unexpected exception (an env broken in a way no check foresaw) is a FAIL."""
    try:
        return spec.run(ctx)
    except Exception as error:
        return broken_outcome(error)


def attribute_root_causes(outcomes: list[tuple[CheckSpec, Outcome]]) -> list[tuple[CheckSpec, Outcome]]:
    """One root cause, one FAIL: the checks that depend on a root cause its owner check reported — by the registry's
    ``depends_on``, or because their own finding names it as its cause — become SKIPs saying "see check N"; their
    own finding is kept in the details. A PASS stands."""
    reported = {
        outcome.cause: spec.id
        for spec, outcome in outcomes
        if outcome.status == FAIL and outcome.cause in ROOT_CAUSES and ROOT_CAUSES[outcome.cause].owner == spec.id
    }
    attributed = []
    for spec, outcome in outcomes:
        candidates = (*spec.depends_on, outcome.cause) if outcome.cause else spec.depends_on
        cause = next((c for c in candidates if c in reported and reported[c] != spec.id), None)
        if outcome.status == PASS or cause is None:
            attributed.append((spec, outcome))
            continue
        root = ROOT_CAUSES[cause]
        details = {
            **outcome.details,
            "root_cause": cause,
            "see_check": root.owner,
            "finding": f"{outcome.status}: {outcome.reason}",
        }
        skip = Outcome(SKIP, f"not judged: {root.what} (see check {root.owner})", "", details, cause)
        attributed.append((spec, skip))
    return attributed


def broken_outcome(error: Exception) -> Outcome:
    """The FAIL of a check that raised: a missing dependency (a broken install) or code the check did not foresee."""
    if isinstance(error, ImportError):
        return Outcome(
            FAIL,
            f"could not run: {type(error).__name__}: {error}",
            "a dependency of envkit is missing: reinstall envkit (pip install envkit)",
        )
    return Outcome(
        FAIL,
        f"the env broke the check itself: {type(error).__name__}: {error}",
        "run with --verbose and fix the env where the traceback points",
        {"trace": traceback.format_exc()},
    )


def _reported(spec: CheckSpec, outcome: Outcome) -> Check:
    return Check(spec.id, spec.title, outcome.status, outcome.reason, outcome.hint, outcome.details, spec.rfc008)
