"""The ``envkit`` subcommands' work: each ``_cmd_*`` takes the parsed arguments and a console and returns the exit
code; user mistakes raise :class:`UsageError` (one line, exit code 2). :mod:`envkit.cli.app` parses and dispatches."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from envkit.util.install import install_command
from envkit.util.threads import AUTO

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A user mistake (bad flag value, unknown env, missing file): printed as one line, exit code 2."""


def check_counts(counts: dict[str, int | None]) -> None:
    """Raise :class:`UsageError` for the first flag (``{"--flag": value}``) whose count is below 1; ``None`` is a flag
    not given (the env's value, or no limit)."""
    for flag, value in counts.items():
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")


def check_max_error_rate(value: float | None) -> None:
    """Raise :class:`UsageError` unless ``--max-error-rate`` is between 0 and 1 (``None``: a YAML null)."""
    if value is None or not 0.0 <= value <= 1.0:
        shown = value if value is None else f"{value:g}"
        raise UsageError(f"--max-error-rate must be between 0 and 1, got {shown}")


def output_folder(path: str, flag: str) -> None:
    """Check, before anything loads, that the output folder ``path`` of ``flag`` can be written to or created; one
    line (:class:`UsageError`) when not."""
    from envkit.util.paths import OutputPathError, check_output_folder

    try:
        check_output_folder(path, flag)
    except OutputPathError as error:
        raise UsageError(str(error)) from None


def output_file(path: str, flag: str) -> None:
    """Check, before anything loads, that the output file ``path`` of ``flag`` can be written (in a folder that is
    there or can be created); one line (:class:`UsageError`) when not."""
    from envkit.util.paths import OutputPathError, check_output_file

    try:
        check_output_file(path, flag)
    except OutputPathError as error:
        raise UsageError(str(error)) from None


def sampling_from_flags(**fields: Any) -> Any:
    """The :class:`~envkit.backends.SamplingParams` of a command's flags (``top_p=args.top_p`` for ``--top-p``), built
    before any model loads; a value out of its range raises :class:`UsageError` naming the flag."""
    from envkit.backends import SamplingParams, SamplingRangeError

    try:
        return SamplingParams(**fields)
    except SamplingRangeError as error:
        raise UsageError(f"--{error.flag} {error.requirement}") from None


def parse_json_object(text: str | None, flag: str) -> dict[str, Any]:
    """Parse a JSON-object flag value (``--env-config``/``--rl-env-config``/``--options``) or raise
    :class:`UsageError`."""
    from envkit.registry import EnvSpecError, parse_config

    try:
        return parse_config(text, flag)
    except EnvSpecError as error:
        raise UsageError(str(error)) from None


def env_config_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The env's constructor arguments: ``--env-config`` / ``--rl-env-config`` from the command line and the YAML
    ``--config`` file (:func:`envkit.registry.merge_env_config`), over the deprecated JSON ``--config`` (a YAML
    ``--config`` never gets here: :mod:`envkit.util.options` applied it)."""
    from envkit.registry import ENV_CONFIG_NAMES, EnvSpecError, merge_env_config
    from envkit.util.options import JSON_CONFIG_DEPRECATION, file_value_dest

    config: dict[str, Any] = {}
    if getattr(args, "config", None):
        print(f"warning: {JSON_CONFIG_DEPRECATION}", file=sys.stderr)
        config.update(parse_json_object(args.config, "--config"))
    try:
        config.update(
            merge_env_config(
                {name: getattr(args, name, None) for name in ENV_CONFIG_NAMES},
                {name: getattr(args, file_value_dest(name), None) for name in ENV_CONFIG_NAMES},
            )
        )
    except EnvSpecError as error:
        raise UsageError(str(error)) from None
    return config


def cmd_list(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    import envkit
    from envkit.envs import BUILTINS

    if args.names:
        print("\n".join(sorted(envkit.registered())))
        return EXIT_OK
    table = Table("name", "class", "gymnasium id", title="registered envs")
    for name, entry_point in sorted(envkit.registered().items()):
        table.add_row(name, entry_point, BUILTINS.get(name, ("", ""))[1])
    console.print(table)
    from rich.markup import escape

    from envkit.registry import ADAPTER_FAMILIES

    families = Table("spec", "what", "installed", title="adapter families (envkit.make(SPEC), any command's ENV)")
    for family in ADAPTER_FAMILIES.values():
        install = f"no: {install_command(family.extra)}" if family.extra else f"no: pip install {family.requires}"
        families.add_row(family.example, family.description, "yes" if family.installed() else escape(install))
    console.print(families)
    return EXIT_OK


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    """Run the offline checks; exit 0 (no FAIL), 1 (a FAIL) or 2 (the env cannot be loaded or built)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from envkit import validate

    cls, config, target = resolve_cli_target(args)
    if args.episodes < 2:
        raise UsageError("--episodes must be at least 2")
    if not args.call_timeout > 0:
        raise UsageError("--call-timeout must be a positive number of seconds")
    tokenizer = _validation_tokenizer(args.tokenizer)
    seed_style = validate.is_seed_style(cls)
    with Progress(
        TextColumn("[bold]validate[/] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=args.json,
    ) as progress:
        total = validate.progress_total(validate.SEED_STYLE if seed_style else validate.ENV)
        task = progress.add_task(target, total=total)

        def tick(what: str) -> None:
            progress.update(task, advance=1, description=f"{target}: {what}")

        try:
            if seed_style:
                report = validate.validate_seed_style(cls, config, target=target, progress=tick, tokenizer=tokenizer)
            else:
                report = validate.validate_env(
                    lambda: cls(**config),
                    target=target,
                    episodes=args.episodes,
                    seed=args.seed,
                    progress=tick,
                    call_timeout_s=args.call_timeout,
                    tokenizer=tokenizer,
                )
        except validate.ConstructionError as error:
            if args.verbose:
                raise
            raise UsageError(str(error)) from None
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        _print_report(report, console, verbose=args.verbose)
    return EXIT_FAIL if report.failed else EXIT_OK


def _validation_tokenizer(path: str | None) -> Any:
    """The tokenizer of ``validate --tokenizer PATH`` (a local folder), or ``None`` for the bundled default."""
    if path is None:
        return None
    from pathlib import Path

    from envkit.models.loading import ModelLoadError, load_tokenizer

    if not Path(path).expanduser().is_dir():
        raise UsageError(f"--tokenizer {path}: no such folder (a local tokenizer folder, e.g. a model's)")
    try:
        return load_tokenizer(str(Path(path).expanduser()))
    except ModelLoadError as error:
        raise UsageError(f"--tokenizer: {error}") from None


def _print_report(report: Any, console: Console, *, verbose: bool) -> None:
    """The report as a table: one row per check, its RFC-008 id under its name; details of findings with --verbose."""
    from rich.markup import escape
    from rich.table import Table

    styles = {"PASS": "green", "FAIL": "bold red", "WARN": "yellow", "SKIP": "dim"}
    table = Table("#", "check", "status", "result", title=f"envkit validate {report.target}", show_lines=False)
    for check in report.checks:
        name = escape(check.name) + (f"\n[dim]{check.rfc008}[/]" if check.rfc008 else "")
        result = check.reason + (f"\n[dim]hint: {check.hint}[/]" if check.hint and check.status != "PASS" else "")
        table.add_row(str(check.id), name, f"[{styles[check.status]}]{check.status}[/]", result)
    console.print(table)
    if verbose:
        for check in report.checks:
            if check.details and check.status != "PASS":
                console.print(
                    f"[bold]{check.id}. {check.name}[/]",
                    json.dumps(check.details, indent=2, default=str),
                    markup=False,
                    highlight=False,
                )
    console.print(("[bold red]" if report.failed else "[bold green]") + report.summary() + "[/]")


def resolve_cli_target(args: argparse.Namespace) -> tuple[type, dict[str, Any], str]:
    """The class to validate, its constructor config and a label, from ENV or the --rl-env-* flags."""
    import envkit

    config = env_config_from_args(args)
    try:
        cls, spec = envkit.resolve_target(
            args.env, getattr(args, "rl_env_module", None), getattr(args, "rl_env_class", None)
        )
    except envkit.EnvSpecError as error:
        raise UsageError(str(error)) from None
    return cls, config, spec


def seed_style_as_env(
    cls: type, config: dict[str, Any], target: str, *, tokenizer: str | None
) -> tuple[type, dict[str, Any], str]:
    """A seed-style class as the envkit env that runs it (``seed:`` spec,
    :mod:`~envkit.adapters.trl.env_classes`), its dataset
    built with ``tokenizer`` (a folder; None: envkit's bundled ChatML one); any other class as it is."""
    from envkit.validate import is_seed_style

    if not is_seed_style(cls):
        return cls, config, target
    import envkit
    from envkit.adapters.trl.env_classes import seed_style_spec

    spec = seed_style_spec(target)
    try:
        return envkit.resolve(spec), {**config, "envkit_tokenizer": tokenizer}, spec
    except envkit.EnvSpecError as error:
        raise UsageError(str(error)) from None


def cmd_eval(args: argparse.Namespace, console: Console) -> int:
    """Evaluate a model on an env: metrics on screen, one JSON line per episode in --out."""
    from envkit.adapters.trl import ErrorRateExceeded, check_error_rate
    from envkit.backends import BackendError, Closable
    from envkit.chat.render import TemplateError
    from envkit.cli.eval_summary import training_mismatches
    from envkit.rollout import ChatRolloutEngine, RolloutEngine, summarize
    from envkit.workers import EnvFactory, LeakedThreadsError

    cls, config, target = resolve_cli_target(args)
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
    for warning in training_mismatches(
        args.model,
        target,
        range(args.seed, args.seed + args.tasks),
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


def load_local_model(path: str) -> tuple[Any, Any]:
    """``(tokenizer, model)`` from a local folder; a missing or unreadable one is a :class:`UsageError`."""
    from envkit.models.loading import ModelLoadError, load_model, load_tokenizer

    try:
        return load_tokenizer(path), load_model(path)
    except ModelLoadError as error:
        raise UsageError(str(error)) from None


def set_torch_threads(args: argparse.Namespace, console: Console) -> None:
    """Apply --torch-threads before a model loads, printing the choice in one line; a bad value is a UsageError."""
    from envkit.util.threads import TorchThreadsError, apply_torch_threads

    try:
        apply_torch_threads(args.torch_threads, lambda line: console.print(line, style="dim", highlight=False))
    except TorchThreadsError as error:
        raise UsageError(str(error)) from None


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
    from envkit.backends.registry import BackendOptions, backend_spec, build_backend
    from envkit.models.loading import ModelLoadError, load_tokenizer

    try:
        spec = backend_spec(args.backend)
    except ValueError as error:
        raise UsageError(str(error)) from None
    base_urls = None
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


def cmd_serve(args: argparse.Namespace, console: Console) -> int:
    """Serve a local model over an OpenAI-compatible /v1/completions endpoint until interrupted."""
    from envkit.serving.openai import make_server

    limits = {"max_body_bytes": args.max_body_bytes, "max_n": args.max_n, "max_tokens_limit": args.max_tokens_limit}
    check_counts({f"--{name.replace('_', '-')}": value for name, value in limits.items()})
    tokenizer, model = load_local_model(args.model)
    try:
        server = make_server(
            model,
            tokenizer,
            host=args.host,
            port=args.port,
            model_name=args.served_model_name or args.model,
            **{name: value for name, value in limits.items() if value is not None},  # else make_server's defaults
        )
    except OSError as error:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {error}") from None
    console.print(
        f"serving {args.model} on http://{args.host}:{server.server_address[1]}/v1/completions", highlight=False
    )
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return EXIT_OK


def cmd_serve_env(args: argparse.Namespace, console: Console) -> int:
    """Serve an envkit env over the OpenEnv protocol (OpenEnv's own server) until interrupted."""
    import importlib.util

    if importlib.util.find_spec("openenv") is None:
        raise UsageError(f"envkit serve-env needs openenv, which is not installed: {install_command('openenv')}")
    from envkit.registry import EnvSpecError

    config = env_config_from_args(args)
    if args.max_sessions < 1:
        raise UsageError("--max-sessions must be at least 1")
    if not args.session_timeout > 0:
        raise UsageError("--session-timeout must be a positive number of seconds")
    if args.max_message_bytes < 1024:
        raise UsageError("--max-message-bytes must be at least 1024")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port} is not a TCP port (0-65535; 0 picks a free one)")
    if not args.step_timeout > 0:
        raise UsageError("--step-timeout must be a positive number of seconds")
    if args.env_processes is not None and args.env_processes < 1:
        raise UsageError("--env-processes must be at least 1")
    if args.cpu_limit < 0 or args.memory_limit < 0:
        raise UsageError("--cpu-limit and --memory-limit must be 0 (no limit) or more")
    from envkit.adapters.openenv.server import create_envkit_app, start_server
    from envkit.util.children import ResourceLimits

    limits = ResourceLimits(cpu_s=args.cpu_limit or None, memory_bytes=int(args.memory_limit * (1 << 30)) or None)
    try:
        app = create_envkit_app(
            args.env,
            config,
            max_sessions=args.max_sessions,
            session_timeout_s=args.session_timeout,
            max_message_bytes=args.max_message_bytes,
            expose_oracle=args.expose_oracle,
            step_timeout_s=args.step_timeout,
            env_processes=args.env_processes,
            limits=limits,
        )
    except EnvSpecError as error:
        raise UsageError(str(error)) from None

    for warning in app.warnings:
        print(f"warning: {warning}", file=sys.stderr, flush=True)

    def ready(url: str) -> None:
        print(f"serving {args.env} over OpenEnv at {url} (consume it: envkit.make('openenv:{url}'))", flush=True)

    try:
        start_server(
            app,
            host=args.host,
            port=args.port,
            max_message_bytes=args.max_message_bytes,
            background=False,
            on_ready=ready,
        )
    except OSError as error:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {error}") from None
    return EXIT_OK


def build_env(spec: Any, config: dict[str, Any]) -> Any:
    import envkit

    try:
        return envkit.make(spec, **config)
    except envkit.EnvSpecError as error:
        raise UsageError(str(error)) from None


def cmd_sft(args: argparse.Namespace, console: Console) -> int:
    """Warm-start a model by supervised fine-tuning on the env's oracle demonstrations."""
    from envkit.adapters.trl.sft import sft_on_oracle
    from envkit.backends.oracle import NoOracle

    # Before the env and the model load: a bad flag costs a second, not a minute.
    check_counts({"--episodes": args.episodes, "--steps": args.steps, "--batch-size": args.batch_size})
    if not args.learning_rate > 0:
        raise UsageError(f"--learning-rate must be above 0, got {args.learning_rate:g}")
    cls, config, target = resolve_cli_target(args)
    build_env(cls, config)
    set_torch_threads(args, console)
    output_folder(args.output_dir, "--output-dir")
    tokenizer, model = load_local_model(args.model)
    try:
        metrics = sft_on_oracle(
            model,
            tokenizer,
            lambda: cls(**config),
            seeds=list(range(args.seed, args.seed + args.episodes)),
            output_dir=args.output_dir,
            max_steps=args.steps,
            learning_rate=args.learning_rate,
            batch_size=args.batch_size,
            log=lambda text: console.print(text, highlight=False),
        )
    except (NoOracle, ValueError) as error:
        raise UsageError(str(error)) from None
    console.print(
        f"sft on {target}: loss {metrics.get('train_loss', float('nan')):.4f}; saved to {args.output_dir}",
        soft_wrap=True,
    )
    return EXIT_OK


def cmd_view(args: argparse.Namespace, console: Console) -> int:
    """Write one self-contained HTML page showing the episodes of a JSONL file."""
    from envkit.cli.view import ViewError, load_view_tokenizer, write_view

    try:
        tokenizer = load_view_tokenizer(args.tokenizer) if args.tokenizer else None
        path, count = write_view(args.episodes, args.output, tokenizer=tokenizer)
    except ViewError as error:
        raise UsageError(str(error)) from None
    size_kb = path.stat().st_size / 1024
    console.print(
        f"wrote {count} episodes to {path} ({size_kb:.0f} KB): open it in a browser", highlight=False, soft_wrap=True
    )
    return EXIT_OK


def cmd_init(args: argparse.Namespace, console: Console) -> int:
    """Write a new env module, its tests and a README snippet; never overwrite a file."""
    from envkit.cli.scaffold import ScaffoldError, write_scaffold

    try:
        names, written = write_scaffold(args.name, args.dir, tools=not args.no_tools)
    except ScaffoldError as error:
        raise UsageError(str(error)) from None
    module, base = written[0], "envkit.Env" if args.no_tools else "envkit.ToolEnv"
    console.print(f"created {names.class_name} ({base}):", highlight=False)
    for path in written:
        console.print(f"  {path}", highlight=False, soft_wrap=True)
    console.print(f"next: envkit validate {module}:{names.class_name}", highlight=False, soft_wrap=True)
    console.print(f"      pytest {written[1]}", highlight=False, soft_wrap=True)
    return EXIT_OK
