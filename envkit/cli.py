"""The ``envkit`` command line: one subcommand per job (``envkit --help`` lists them)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from rich.console import Console

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """A user mistake (bad flag value, unknown env, missing file): printed as one line, exit code 2."""


def parse_json_object(text: str | None, flag: str) -> dict[str, Any]:
    """Parse a JSON-object flag value (``--config``/``--rl-env-config``) or raise :class:`UsageError`."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise UsageError(f"{flag} is not valid JSON ({error.msg} at position {error.pos}): {text}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag} must be a JSON object of constructor arguments, got {type(value).__name__}")
    return value


def _cmd_list(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    import envkit

    table = Table("name", "class", "gymnasium id", title="registered envs")
    from envkit.envs import BUILTINS

    for name, entry_point in sorted(envkit.registered().items()):
        table.add_row(name, entry_point, BUILTINS.get(name, ("", ""))[1])
    console.print(table)
    return EXIT_OK


def _cmd_play(args: argparse.Namespace, console: Console) -> int:
    """Run one episode with the env's oracle and print the transcript and score."""
    from envkit.messages import format_transcript

    env = _build_env(args.env, parse_json_object(args.config, "--config"))
    options = parse_json_object(args.options, "--options") or None
    try:
        messages, _ = env.reset(seed=args.seed, options=options)
    except ValueError as error:
        raise UsageError(f"reset(options={options}) failed: {error}") from None
    console.print(format_transcript(messages, max_chars=args.max_chars), markup=False, highlight=False)
    done = False
    while not done:
        action = env.oracle()
        if action is None:
            raise UsageError(f"{type(env).__name__} has no oracle(); `envkit play` needs one")
        new, _, terminated, truncated, _ = env.step(action)
        console.print(
            format_transcript([env.messages[-1 - len(new)], *new], max_chars=args.max_chars),
            markup=False,
            highlight=False,
        )
        done = terminated or truncated
    console.print(f"[bold]score {env.score():.3f}[/] after {env.turns} turns" + (" (truncated)" if truncated else ""))
    return EXIT_OK


def _build_env(spec: str, config: dict[str, Any]) -> Any:
    import envkit

    try:
        return envkit.make(spec, **config)
    except envkit.EnvSpecError as error:
        raise UsageError(str(error)) from None


COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace, Console], int]]] = {
    "list": ("list the registered environments", _cmd_list),
    "play": ("run one episode of an env with its oracle and print the transcript", _cmd_play),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for all subcommands."""
    parser = argparse.ArgumentParser(
        prog="envkit",
        description="Environments for multi-turn, tool-using LLM agents: validate, roll out, evaluate, train.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("list", help=COMMANDS["list"][0], description=COMMANDS["list"][0])
    play = sub.add_parser("play", help=COMMANDS["play"][0], description=COMMANDS["play"][0])
    play.add_argument("env", help="registered name, package.module:Class or path/to/file.py:Class")
    play.add_argument("--seed", type=int, default=0, help="task seed (default 0)")
    play.add_argument("--config", help="JSON object of constructor arguments")
    play.add_argument("--options", help='JSON object passed to reset(options=...), e.g. \'{"tier": "hard"}\'')
    play.add_argument("--max-chars", type=int, default=600, help="cut long messages in the printout (default 600)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``envkit`` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return COMMANDS[args.command][1](args, console)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)  # one line, never wrapped
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _version() -> str:
    from envkit import __version__

    return f"envkit {__version__}"


if __name__ == "__main__":
    sys.exit(main())
