"""``envkit eval``: a model played on an env's task seeds, through any backend of :mod:`envkit.backends.registry`,
with its metrics on screen and each episode as a JSON line in ``--out``."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from envkit.cli.commands import (
    EXIT_FAIL,
    EXIT_OK,
    UsageError,
    build_env,
    check_counts,
    check_max_error_rate,
    output_file,
    resolve_cli_target,
    sampling_from_flags,
    seed_style_as_env,
    set_torch_threads,
)
from envkit.util.threads import AUTO


def cmd_eval(args: argparse.Namespace, console: Console) -> int:
    """Evaluate a model on an env: metrics on screen, one JSON line per episode in --out."""
    from envkit.adapters.trl import ErrorRateExceeded, check_error_rate
    from envkit.backends import BackendError, Closable
    from envkit.chat.render import TemplateError
    from envkit.cli.eval_summary import training_mismatches
    from envkit.rollout import ChatRolloutEngine, RolloutEngine, summarize
    from envkit.workers import EnvFactory, LeakedThreadsError

    cls, config, target = resolve_cli_target(args)
    env_config = config  # as given: a seed-style class's gets the tokenizer added
    cls, config, target = seed_style_as_env(cls, config, target, tokenizer=args.tokenizer or args.model)
    probe = build_env(cls, config)  # fail early, with one line, on a bad config
    with contextlib.suppress(Exception):  # at once: an env may hold a server session, and episodes need every one
        probe.close()
    if args.tasks < 1 or args.samples < 1:
        raise UsageError("--tasks and --samples must be at least 1")
    check_max_error_rate(args.max_error_rate)
    check_counts(
        {
            "--max-new-tokens": args.max_new_tokens,
            "--max-turns": args.max_turns,
            "--max-episode-tokens": args.max_episode_tokens,
            "--max-completion-tokens": args.max_completion_tokens,
            "--concurrency": args.concurrency,
        }
    )
    if args.out:
        output_file(args.out, "--out")
    sampling = sampling_from_flags(  # seeded: a rerun with the same flags samples the same episodes
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
    )
    for flag, value in (("--step-timeout", args.step_timeout), ("--generate-timeout", args.generate_timeout)):
        if value is None or not value > 0:  # None: a YAML null
            raise UsageError(
                f"{flag} must be a positive number of seconds, got {value if value is None else f'{value:g}'}"
            )
    if args.samples > 1 and (args.temperature == 0 or args.top_k == 1):
        print(
            f"warning: --samples {args.samples} with greedy decoding (--temperature 0 or --top-k 1): every sample of a "
            f"task is the same episode, so pass@{args.samples} is pass@1; sample at a temperature above 0",
            file=sys.stderr,
        )
    for warning in training_mismatches(
        args.model,
        target,
        range(args.seed, args.seed + args.tasks),
        env_config=env_config,
        max_new_tokens=args.max_new_tokens,
        max_completion_tokens=args.max_completion_tokens,
    ):
        print(f"warning: {warning}", file=sys.stderr)
    env_workers = _env_workers(args)
    backend, tokenizer = _make_backend(args)
    factory = EnvFactory(target, config)  # picklable: every --env-workers kind builds envs from it
    budgets = {"max_episode_tokens": args.max_episode_tokens, "max_completion_tokens": args.max_completion_tokens}
    common = {
        "max_turns": args.max_turns,
        "concurrency": args.concurrency,
        "step_timeout_s": args.step_timeout,
        "generate_timeout_s": args.generate_timeout,
        "progress": not args.json,
        "env_workers": env_workers,
    }
    if tokenizer is None:  # a message-level backend (--backend chat): the server renders the prompt and parses
        try:
            engine: RolloutEngine = ChatRolloutEngine(factory, backend, **budgets, **common)
        except ValueError as error:
            raise UsageError(str(error)) from None
    else:
        engine = RolloutEngine(factory, backend, tokenizer, **budgets, **common)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # checked before the model loaded (output_file)
    out = open(args.out, "w", encoding="utf-8") if args.out else None  # noqa: SIM115 (written as episodes finish)

    def write(episode: Any) -> None:
        if out is not None:
            out.write(episode.to_json() + "\n")
            out.flush()

    try:
        episodes = engine.run(list(range(args.seed, args.seed + args.tasks)), args.samples, sampling, on_episode=write)
    except (BackendError, TemplateError, LeakedThreadsError) as error:  # e.g. a tool env on a template without tools
        raise UsageError(str(error)) from None
    finally:
        if out is not None:
            out.close()
        if isinstance(backend, Closable):  # e.g. vLLM's engine and its thread
            backend.close()
        engine.close()  # env worker processes / Ray actors
    metrics = summarize(episodes)
    from envkit.cli.eval_summary import env_notes, summary_rows, task_ids

    notes = env_notes(probe, episodes)
    if args.json:
        print(json.dumps({"env": target, **metrics, "task_ids": task_ids(episodes), "notes": notes}, indent=2))
    else:
        from rich.table import Table

        title = f"envkit eval {target} ({args.tasks} tasks × {args.samples} samples)"
        table = Table("metric", "value", title=title)
        for key, value in summary_rows(metrics, episodes):
            table.add_row(key, value)
        console.print(table)
        for note in notes:
            console.print(f"{target}: {note}", highlight=False, soft_wrap=True)
        if args.out:
            console.print(f"episodes written to {args.out}")
    # Training's rule: a run whose episodes mostly failed measured the env or the server, not the model. Checked
    # after the metrics and the episodes are out, so nothing is lost.
    try:
        check_error_rate(episodes, args.max_error_rate)
    except ErrorRateExceeded as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_FAIL
    return EXIT_OK


def _env_workers(args: argparse.Namespace) -> Any:
    """The env workers of --env-workers/--ray-address/--concurrency (what RolloutEngine's env_workers= takes)."""
    from envkit.workers import workers_from_flags

    try:
        return workers_from_flags(args.env_workers, args.concurrency, args.ray_address)
    except (ValueError, ImportError) as error:
        raise UsageError(str(error)) from None


def _make_backend(args: argparse.Namespace) -> tuple[Any, Any]:
    """The backend named by --backend (any in :mod:`envkit.backends.registry`), built from --model, --tokenizer,
    --base-url and --served-model-name, and the tokenizer (None for a message-level backend, which needs none).
    A remote backend's servers are checked first; its API key is ``$OPENAI_API_KEY`` when set."""
    from envkit.backends import BackendError, Checkable
    from envkit.backends.http import parse_base_urls
    from envkit.backends.registry import BackendOptions, backend_names, backend_spec, build_backend
    from envkit.models.loading import ModelLoadError, load_tokenizer

    try:
        spec = backend_spec(args.backend)
    except ValueError as error:
        raise UsageError(str(error)) from None
    base_urls = None
    if not spec.remote:  # ignored by an in-process backend, which would evaluate another model than the one meant
        for flag, value in (("--base-url", args.base_url), ("--served-model-name", args.served_model_name)):
            if value:
                remote = ", ".join(name for name in backend_names() if backend_spec(name).remote)
                raise UsageError(
                    f"{flag} goes with a remote --backend ({remote}); --backend {spec.name} runs --model in this "
                    "process"
                )
    if not spec.token_exact and args.tokenizer:  # the server renders the prompt and parses the reply
        raise UsageError(
            f"--tokenizer is not used by --backend {spec.name}: the server renders the conversation with its own "
            "template; drop it"
        )
    if spec.remote:
        if not args.base_url:
            raise UsageError(f"--backend {spec.name} needs --base-url (e.g. http://127.0.0.1:8000)")
        try:
            base_urls = parse_base_urls(args.base_url)
        except ValueError as error:
            raise UsageError(f"--base-url: {error}") from None
    try:
        tokenizer = load_tokenizer(args.tokenizer or args.model) if spec.token_exact else None
        if not spec.remote:
            set_torch_threads(args, Console(stderr=True) if args.json else Console())
        elif args.torch_threads != AUTO:
            (Console(stderr=True) if args.json else Console()).print(
                f"--torch-threads {args.torch_threads} has no effect with --backend {spec.name}: the model runs on "
                "the server (give the server its threads)",
                style="dim",
                highlight=False,
            )
        options = BackendOptions(
            model=args.model,
            tokenizer=tokenizer,
            base_urls=base_urls,
            served_model_name=args.served_model_name,
            api_key=os.environ.get("OPENAI_API_KEY") if spec.remote else None,
            max_model_len=args.max_episode_tokens,
        )
        backend = build_backend(spec.name, options)
        if isinstance(backend, Checkable):
            backend.check()
        return backend, tokenizer
    except (ModelLoadError, BackendError, ImportError, ValueError) as error:
        raise UsageError(str(error)) from None
