"""The short ``envkit`` subcommands' work, and the helpers every command module shares: each ``cmd_*`` takes the
parsed arguments and a console and returns the exit code; user mistakes raise :class:`UsageError` (one line, exit
code 2). :mod:`envkit.cli.app` parses and dispatches."""

from __future__ import annotations

import argparse
import json
import math
import sys
import threading
from pathlib import Path
from typing import Any

from rich.console import Console

from envkit.util.install import install_command

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A user mistake (bad flag value, unknown env, missing file): printed as one line, exit code 2."""


def given_flags(args: argparse.Namespace, defaults: dict[str, Any]) -> list[str]:
    """The flags (``--max-turns``) among ``defaults`` (dest → the parser's default) that ``args`` gives another value
    than their default: the settings a user gave, for refusing those a mode ignores."""
    return ["--" + name.replace("_", "-") for name, default in defaults.items() if getattr(args, name) != default]


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


def output_folder(path: str, flag: str, *, model: str | None = None) -> None:
    """Check, before anything loads, that the output folder ``path`` of ``flag`` can be written to or created, and is
    not the ``model`` folder the run starts from; one line (:class:`UsageError`) when not."""
    from envkit.util.paths import OutputPathError, check_not_the_model, check_output_folder

    try:
        check_output_folder(path, flag)
        check_not_the_model(path, model, flag)
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


ENV_ONLY_DEFAULTS: dict[str, Any] = {"episodes": 8, "seed": 0, "call_timeout": 30.0}
"""``envkit validate``'s flags (with their defaults, the parser's) that drive an envkit env's episodes: a seed-style
class is validated on its ``build_dataset`` rows instead, so they are refused for one rather than ignored."""


def cmd_validate(args: argparse.Namespace, console: Console) -> int:
    """Run the offline checks; exit 0 (no FAIL), 1 (a FAIL) or 2 (the env cannot be loaded or built)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from envkit import validate

    cls, config, target = resolve_cli_target(args)
    if args.episodes < 2:
        raise UsageError("--episodes must be at least 2")
    if not 0 < args.call_timeout <= threading.TIMEOUT_MAX:  # inf: an OverflowError blamed on the env's constructor
        raise UsageError(f"--call-timeout must be a positive number of seconds, got {args.call_timeout:g}")
    tokenizer = _validation_tokenizer(args.tokenizer)
    seed_style = validate.is_seed_style(cls)
    if seed_style and (given := given_flags(args, ENV_ONLY_DEFAULTS)):
        raise UsageError(
            f"{given[0]} drives an envkit env's episodes; a seed-style class is validated on its build_dataset rows"
        )
    stderr = Console(stderr=True)
    with Progress(
        TextColumn("[bold]validate[/] {task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        disable=args.json or not stderr.is_terminal,  # else a bare newline on stderr when it ends (a log, a pipe)
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


def load_local_model(path: str, tokenizer: str | None = None) -> tuple[Any, Any]:
    """``(tokenizer, model)`` from a local folder, the tokenizer from ``tokenizer`` when given (a model folder need
    not hold one then); a missing or unreadable one is a :class:`UsageError`."""
    from envkit.models.loading import ModelLoadError, load_model, load_tokenizer

    try:
        return load_tokenizer(tokenizer or path), load_model(path)
    except ModelLoadError as error:
        raise UsageError(str(error)) from None


def set_torch_threads(args: argparse.Namespace, console: Console) -> None:
    """Apply --torch-threads before a model loads, printing the choice in one line; a bad value is a UsageError."""
    from envkit.util.threads import TorchThreadsError, apply_torch_threads

    try:
        apply_torch_threads(args.torch_threads, lambda line: console.print(line, style="dim", highlight=False))
    except TorchThreadsError as error:
        raise UsageError(str(error)) from None


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
    if not 0 < args.learning_rate < math.inf:  # inf trained to NaN weights and saved them, exit 0
        raise UsageError(f"--learning-rate must be a finite number above 0, got {args.learning_rate:g}")
    cls, config, target = resolve_cli_target(args)
    build_env(cls, config)
    set_torch_threads(args, console)
    output_folder(args.output_dir, "--output-dir", model=args.model)
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
