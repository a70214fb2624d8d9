"""``envkit play``: one episode of an env, played by its oracle (the default), by you (``--interactive``), or by a
model (``--model DIR``), with the transcript, the score and how the episode ended.

``--interactive`` (alias ``--human``) is Gymnasium's ``gymnasium.utils.play`` for a text env: you type each
assistant turn at the prompt and see the env's replies. A turn is one line:

* plain text: an assistant message;
* a tool call as JSON: ``{"name": "calculator", "arguments": {"expression": "2 + 3"}}`` (a list of them for several
  calls in one turn; OpenAI's ``{"type": "function", "function": {...}}`` form works too);
* a tool call as a call: ``calculator(expression="2 + 3")`` (several: ``a(x=1); b(y=2)``; positional arguments in
  the tool's parameter order). Parsed with :mod:`ast`: only literal values (numbers, strings, lists, dicts,
  ``True``/``False``/``None``), nothing is evaluated;
* a command: ``:oracle`` (the env's oracle takes this turn), ``:tools``, ``:say TEXT`` (TEXT as it is, even if it
  looks like a call), ``:help``, ``:quit``.

A line that cannot be read as a turn is one ``error:`` line and the prompt again; the env never sees it.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
import traceback
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from rich.console import Console

from envkit.cli.commands import (
    EXIT_FAIL,
    EXIT_OK,
    UsageError,
    build_env,
    check_counts,
    given_flags,
    load_local_model,
    parse_json_object,
    resolve_cli_target,
    sampling_from_flags,
    seed_style_as_env,
    set_torch_threads,
)
from envkit.util.threads import AUTO, add_torch_threads_flag

COMMANDS_HELP = (
    "type the assistant's turn: plain text, a tool call as JSON "
    '({"name": "calculator", "arguments": {"expression": "2 + 3"}}) or as a call (calculator(expression="2 + 3")); '
    ":oracle lets the oracle take this turn, :tools lists the tools, :say TEXT sends TEXT as it is, :quit stops"
)
"""What ``:help`` (and the start of an interactive episode) prints."""

_CALL_START = re.compile(r"[A-Za-z_]\w*\(")


class TurnError(ValueError):
    """A typed line that is not a turn: its message is the one line shown before the prompt comes back."""


MODEL_ONLY_DEFAULTS: dict[str, Any] = {
    "tokenizer": None,
    "max_new_tokens": 256,
    "temperature": 1.0,
    "max_turns": None,
    "torch_threads": AUTO,
}
"""The flags only a model playing reads, with their defaults (the parser's): given without ``--model``, where the
oracle or a person plays, they are refused instead of ignored."""


def add_play_parser(sub: Any, help_text: str, add_env_selection: Callable, add_config_flag: Callable) -> None:
    """``envkit play``'s parser, under the ``envkit`` subparsers ``sub`` (the shared flag helpers are passed in, as
    they live in :mod:`envkit.cli.app`)."""
    play = sub.add_parser("play", help=help_text, description=help_text)
    add_env_selection(play)
    play.add_argument("--seed", type=int, default=0, help="task seed (default 0)")
    add_config_flag(play)
    play.add_argument("--options", help='JSON object passed to reset(options=...), e.g. \'{"tier": "hard"}\'')
    play.add_argument("--max-chars", type=int, default=600, help="cut long messages in the printout (default 600)")
    who = play.add_mutually_exclusive_group()
    who.add_argument(
        "-i",
        "--interactive",
        "--human",
        action="store_true",
        help="you play: type each assistant turn (text, a tool call as JSON or name(arg=value)); :oracle, :quit, "
        ":help (as gymnasium.utils.play lets a person drive an env)",
    )
    who.add_argument("--model", metavar="DIR", help="a local model folder plays the episode (transformers backend)")
    play.add_argument("--tokenizer", metavar="DIR", help="tokenizer folder for --model (default: the model's)")
    play.add_argument(
        "--max-new-tokens",
        type=int,
        default=MODEL_ONLY_DEFAULTS["max_new_tokens"],
        help=f"--model: tokens per turn (default {MODEL_ONLY_DEFAULTS['max_new_tokens']})",
    )
    play.add_argument(
        "--temperature",
        type=float,
        default=MODEL_ONLY_DEFAULTS["temperature"],
        help=f"--model: sampling temperature (default {MODEL_ONLY_DEFAULTS['temperature']})",
    )
    play.add_argument("--max-turns", type=int, help="--model: assistant turns (default: the env's max_turns)")
    add_torch_threads_flag(play)


def cmd_play(args: argparse.Namespace, console: Console) -> int:
    """Play one episode (oracle, ``--interactive`` or ``--model``) and print the transcript, score and ending."""
    check_counts({"--max-chars": args.max_chars})  # a negative one cut every message from its end
    if args.model is not None:
        return _play_model(args, console)
    if given := given_flags(args, MODEL_ONLY_DEFAULTS):
        raise UsageError(f"{given[0]} is for a model playing (--model DIR); the oracle and --interactive ignore it")
    cls, config, _ = seed_style_as_env(*resolve_cli_target(args), tokenizer=None)
    env = build_env(cls, config)
    options = parse_json_object(args.options, "--options") or None
    try:
        messages, _ = env.reset(seed=args.seed, options=options)
    except ValueError as error:
        raise UsageError(f"reset(options={options}) failed: {error}") from None
    show = _printer(console, args.max_chars)
    show(messages)
    try:
        if args.interactive:
            return _play_interactive(env, console, show, sys.stdin)
        return _play_oracle(env, args, console, show)
    except EnvRaised as error:
        console.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
        return EXIT_FAIL


def _printer(console: Console, max_chars: int) -> Callable[[list[dict[str, Any]]], None]:
    from envkit.core.messages import format_transcript

    def show(messages: list[dict[str, Any]]) -> None:
        if messages:
            console.print(format_transcript(messages, max_chars=max_chars), markup=False, highlight=False)

    return show


def _play_oracle(env: Any, args: argparse.Namespace, console: Console, show: Callable) -> int:
    from envkit.adapters.trl.env_classes import SeedStyleEnv

    while not env.done:
        action = _call_env(env, "oracle")
        if action is None and isinstance(env, SeedStyleEnv):
            console.print(
                f"{env.seed_class.__name__} is seed-style: no oracle to play task {args.seed} with (row "
                f"{args.seed % len(env.rows)} of {len(env.rows)}, case_idx {env.case_idx}; tools: "
                f"{', '.join(env._tool_specs) or 'none'}). `envkit play --interactive` lets you play it, "
                "`envkit play --model DIR` a model.",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            return EXIT_OK
        if action is None:
            raise UsageError(
                f"{type(env).__name__} has no oracle(); play it yourself with --interactive, or a model with --model"
            )
        _step(env, action, show, console)
    _print_end(env, console)
    return EXIT_OK


class EnvRaised(Exception):
    """The env raised in ``step``, ``oracle`` or ``score`` while being played: an env bug, reported in one line with
    where it was raised; the episode cannot go on (exit code 1)."""

    def __init__(self, env: Any, method: str, error: Exception) -> None:
        frames = traceback.extract_tb(error.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        super().__init__(
            f"{type(env).__name__}.{method}() raised {type(error).__name__}: {error}{where}; the episode stops here "
            "(an env bug: `envkit validate` finds such faults with the input that caused them)"
        )


def _call_env(env: Any, method: str, *args: Any) -> Any:
    try:
        return getattr(env, method)(*args)
    except Exception as error:
        raise EnvRaised(env, method, error) from error


def _step(env: Any, action: dict[str, Any] | str, show: Callable, console: Console) -> None:
    """One turn: the action as the transcript shows it, then the env's replies (and a non-zero step reward)."""
    message = action if isinstance(action, dict) else {"role": "assistant", "content": action}
    new, reward, *_ = _call_env(env, "step", message)
    show([env.messages[-1 - len(new)], *new])
    if reward:
        console.print(f"(step reward {reward:g})", markup=False, highlight=False)


def _print_end(env: Any, console: Console) -> None:
    ending = env.ending.value if env.ending is not None else "not told"
    console.print(
        f"[bold]score {_call_env(env, 'score'):.3f}[/] after {env.turns} turns · ending: {ending}"
        + ("" if env.ending is None or env.ending.proper else " (truncated)"),
        highlight=False,
    )


# ---- --interactive -----------------------------------------------------------------------------------------------
def _play_interactive(env: Any, console: Console, show: Callable, stream: TextIO) -> int:
    """Read one turn per line from ``stream`` until the episode ends, ``:quit`` or the end of input."""
    tools = _tool_schemas(env)
    console.print(COMMANDS_HELP, markup=False, highlight=False, soft_wrap=True)
    if tools:
        console.print("tools: " + ", ".join(_signature(t) for t in tools), markup=False, highlight=False)
    lines = _lines(stream, console)
    while not env.done:
        line = next(lines, None)
        if line is None or line.strip() in (":quit", ":q", ":exit"):
            console.print(f"stopped after {env.turns} turns (the episode had not ended)", highlight=False)
            return EXIT_OK
        line = line.strip()
        if not line:
            continue
        if line in (":help", ":h", "?"):
            console.print(COMMANDS_HELP, markup=False, highlight=False, soft_wrap=True)
            continue
        if line == ":tools":
            console.print("\n".join(_signature(t) for t in tools) or "(no tools)", markup=False, highlight=False)
            continue
        try:
            action = _oracle_action(env) if line == ":oracle" else parse_turn(line, tools)
        except TurnError as error:
            console.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
            continue
        _step(env, action, show, console)
    _print_end(env, console)
    return EXIT_OK


def _lines(stream: TextIO, console: Console) -> Iterator[str]:
    """The typed lines, each after an ``agent>`` prompt (``input()`` when ``stream`` is the terminal's stdin, so
    line editing works)."""
    interactive = stream is sys.stdin and stream.isatty()
    while True:
        if interactive:
            try:
                yield input("agent> ")
            except EOFError:
                return
        else:
            console.print("agent> ", end="", markup=False, highlight=False)
            line = stream.readline()
            if not line:
                console.print()
                return
            console.print(line.rstrip("\n"), markup=False, highlight=False)  # a piped line shows as typed
            yield line


def _oracle_action(env: Any) -> dict[str, Any]:
    action = _call_env(env, "oracle")
    if action is None:
        raise TurnError(f"{type(env).__name__} has no oracle for this state; type the turn yourself")
    return action


def _tool_schemas(env: Any) -> list[dict[str, Any]]:
    """The env's tools as the model is offered them (what :func:`envkit.workers.base.reset_outcome` reads)."""
    return [t for t in getattr(env, "tools", None) or [] if isinstance(t, dict)]


def _function(schema: dict[str, Any]) -> dict[str, Any]:
    return schema.get("function", schema)


def _parameters(schema: dict[str, Any]) -> list[str]:
    properties = (_function(schema).get("parameters") or {}).get("properties") or {}
    return list(properties)


def _signature(schema: dict[str, Any]) -> str:
    return f"{_function(schema).get('name')}({', '.join(_parameters(schema))})"


def parse_turn(line: str, tools: list[dict[str, Any]]) -> dict[str, Any]:
    """One typed line as the assistant message :meth:`envkit.Env.step` takes.

    Args:
        line: What was typed: text, tool calls as JSON, tool calls as ``name(arg=value, ...)``, or ``:say TEXT``.
        tools: The env's tools as OpenAI-style schemas (``[]``: every line is text).

    Returns:
        ``{"role": "assistant", "content": ..., "tool_calls": [...]}`` (``tool_calls`` only for tool calls).

    Raises:
        TurnError: the line looks like a tool call but is not one (bad JSON, an unknown tool, a value that is not a
            literal); the message is one line that says what to type instead.
    """
    text = line.strip()
    if text.startswith(":say"):
        return {"role": "assistant", "content": text[4:].lstrip()}
    if text.startswith(":"):
        raise TurnError(f"unknown command {text.split()[0]} (:oracle, :tools, :say TEXT, :help, :quit)")
    if not tools:
        return {"role": "assistant", "content": text}
    names = {_function(t).get("name"): t for t in tools}
    if text[:1] in "{[":
        calls = _json_calls(text)
    elif _CALL_START.match(text) and text.rstrip(" ;").endswith(")"):
        calls = _syntax_calls(text, names)
    else:
        return {"role": "assistant", "content": text}
    for name, _ in calls:
        if name not in names:
            raise TurnError(
                f"no tool named {name!r} (tools: {', '.join(map(str, names))}); :say TEXT sends text as it is"
            )
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls],
    }


def _json_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    try:
        value = json.loads(text)
    except ValueError as error:
        raise TurnError(f'not valid JSON ({error}); a call is {{"name": ..., "arguments": {{...}}}}') from None
    calls = []
    for item in value if isinstance(value, list) else [value]:
        call = item.get("function", item) if isinstance(item, dict) else item
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise TurnError(
                'a JSON tool call is an object with a "name" (and "arguments"): {"name": ..., "arguments": {...}}'
            )
        arguments = call.get("arguments", {})
        if not isinstance(arguments, dict):
            raise TurnError(f'"arguments" of {call["name"]} must be a JSON object, got {json.dumps(arguments)}')
        calls.append((call["name"], arguments))
    if not calls:
        raise TurnError("an empty list of tool calls; type at least one")
    return calls


def _syntax_calls(text: str, tools: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    try:
        tree = ast.parse(text.strip(), mode="exec")
    except SyntaxError as error:
        raise TurnError(
            f"cannot read that call ({error.msg}); write name(arg=value, ...) with literal values"
        ) from None
    calls = []
    for statement in tree.body:
        call = statement.value if isinstance(statement, ast.Expr) else None
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
            raise TurnError("write tool calls as name(arg=value, ...), several separated by ';'")
        name = call.func.id
        arguments: dict[str, Any] = {}
        order = _parameters(tools[name]) if name in tools else []
        if call.args and len(call.args) > len(order):
            raise TurnError(
                f"{name} takes {len(order)} argument{'' if len(order) == 1 else 's'} ({', '.join(order)}); "
                "name them: arg=value"
            )
        for parameter, node in zip(order, call.args, strict=False):
            arguments[parameter] = _literal(name, parameter, node)
        for keyword in call.keywords:
            if keyword.arg is None:
                raise TurnError(f"{name}(**...) is not supported; name each argument: arg=value")
            arguments[keyword.arg] = _literal(name, keyword.arg, keyword.value)
        calls.append((name, arguments))
    return calls


def _literal(tool: str, parameter: str, node: ast.expr) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise TurnError(
            f"{tool}: {parameter}={ast.unparse(node)} is not a literal (a number, a quoted string, a list, a dict, "
            "True, False or None); nothing is evaluated"
        ) from None


# ---- --model -----------------------------------------------------------------------------------------------------
def _play_model(args: argparse.Namespace, console: Console) -> int:
    """One episode of ``--model`` through the rollout engine (the path ``envkit eval`` takes), printed as it goes."""
    from envkit.backends import BackendError, TransformersBackend
    from envkit.chat.render import TemplateError
    from envkit.rollout import RolloutEngine
    from envkit.workers import EnvFactory

    if args.options:
        raise UsageError("--options is not supported with --model (the engine resets with the task seed only)")
    check_counts({"--max-new-tokens": args.max_new_tokens, "--max-turns": args.max_turns})
    sampling = sampling_from_flags(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    cls, config, target = resolve_cli_target(args)
    cls, config, target = seed_style_as_env(cls, config, target, tokenizer=args.tokenizer or args.model)
    build_env(cls, config)  # a bad config fails here, in one line
    set_torch_threads(args, console)
    tokenizer, model = load_local_model(args.model, tokenizer=args.tokenizer)
    show = _printer(console, args.max_chars)
    shown = 0

    def on_turn(episode: Any) -> None:  # the messages so far (the last env reply), then what the model is doing
        nonlocal shown
        show(episode.messages[shown:])
        shown = len(episode.messages)
        console.print(f"(turn {episode.turns}: the model said {_model_tokens(episode)} tokens so far)", style="dim")

    engine = RolloutEngine(
        EnvFactory(target, config),
        TransformersBackend(model, tokenizer),
        tokenizer,
        max_turns=args.max_turns,
        concurrency=1,
    )
    try:
        (episode,) = engine.run([args.seed], 1, sampling, on_turn=on_turn)
    except (BackendError, TemplateError) as error:
        raise UsageError(str(error)) from None
    finally:
        engine.close()
    show(episode.messages[shown:])
    components = " · ".join(f"{k} {v:g}" for k, v in episode.score_components.items())
    console.print(
        f"[bold]score {episode.score:.3f}[/] after {episode.turns} turns · ending: {episode.finish_reason}"
        + (f" · {components}" if components else "")
        + (f" · error: {episode.error}" if episode.error else ""),
        highlight=False,
        soft_wrap=True,
    )
    return EXIT_OK


def _model_tokens(episode: Any) -> int:
    return sum(episode.env_mask)
