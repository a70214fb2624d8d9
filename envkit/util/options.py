"""One meaning for ``--config`` on the command line: a YAML file of the command's options.

``envkit play|validate|eval|sft|serve-env --config opts.yaml``: each key is a flag of that command (``max-turns`` or
``max_turns``, ``env`` for ENV), applied as the parser's defaults before the real parse, so the command line wins; an
``env:`` mapping sets environment variables (as in ``envkit train --config``, which TRL's own parser reads). The env's
constructor arguments are ``--env-config JSON`` (``--rl-env-config`` is the seed-style alias; in the YAML file,
``env_config`` may be a mapping, merged key by key under the command line's). The old ``--config JSON`` still works
for one release, with a one-line deprecation warning: a ``--config`` value that starts with ``{`` is read that way;
any other value is the path of an options file, read as YAML whatever its suffix (a JSON mapping is YAML too).

The other way round, :func:`as_flags` writes settings given as keywords as a command line (for a command run from
Python, e.g. ``envkit.adapters.trl.train.run(argv)``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envkit.util.text import one_line

ENV_CONFIG_NAMES = ("env_config", "rl_env_config")
"""``--env-config`` and its seed-style alias ``--rl-env-config``: one option under two names."""

JSON_CONFIG_DEPRECATION = "--config with JSON is deprecated; use --env-config"
"""The warning (one line on stderr) for ``--config '{...}'`` (constructor arguments, the meaning before YAML)."""

JSON_FLAGS = (*ENV_CONFIG_NAMES, "options")
"""Flags that take a JSON object: in a YAML file they may be written as a mapping."""


def file_value_dest(dest: str) -> str:
    """Where the namespace keeps a ``--config`` file's ``env_config``/``rl_env_config`` (merged under the command
    line's by the commands, not replaced by it)."""
    return f"_config_file_{dest}"


class AppendReplacingDefault(argparse._AppendAction):
    """``action="append"`` whose first command-line value replaces the default (a ``--config`` file's list) instead
    of adding to it; later values add to the command line's."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None) -> None:
        if getattr(namespace, self.dest, None) is self.default:
            setattr(namespace, self.dest, None)
        super().__call__(parser, namespace, values, option_string)


class OptionsFileError(ValueError):
    """A bad ``--config`` YAML file (unreadable, not a mapping, unknown key, bad value): one line, exit code 2."""


def is_options_file(value: str) -> bool:
    """Whether a ``--config`` value names a file of options (else it starts with ``{``: the deprecated JSON constructor
    arguments). The suffix does not decide: ``opts.txt`` or ``opts.json`` is read as YAML too, where guessing JSON
    text from it only said the path was not JSON."""
    return not value.strip().startswith("{")


def find_config(argv: Sequence[str]) -> tuple[int, int, str] | None:
    """``(start, stop, value)`` of the first ``--config VALUE`` / ``--config=VALUE`` in argv, or ``None``."""
    for index, item in enumerate(argv):
        if item == "--":
            return None
        if item == "--config" and index + 1 < len(argv):
            return index, index + 2, argv[index + 1]
        if item.startswith("--config="):
            return index, index + 1, item.split("=", 1)[1]
    return None


def load_options(path: str) -> dict[str, Any]:
    """The mapping in a ``--config`` YAML file; raises :class:`OptionsFileError` (one line)."""
    import yaml

    try:
        values = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise OptionsFileError(f"cannot read --config {path}: {getattr(error, 'strerror', None) or error}") from None
    except yaml.YAMLError as error:
        raise OptionsFileError(f"cannot read --config {path}: {one_line(error)}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise OptionsFileError(f"--config {path} must hold a YAML mapping of option names to values")
    return values


def apply_options_file(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """Apply ``--config FILE.yaml`` of argv's subcommand to that subcommand's parser; return argv without it.

    The file's keys become the subparser's defaults (``set_defaults``), so whatever the command line gives wins;
    options the file sets are no longer required on the command line. Commands without a ``--config`` option, and
    JSON values (the deprecated meaning, read later by the command), are left alone.
    """
    argv = list(argv)
    command = _subparser(parser, argv[0]) if argv else None
    if command is None or "--config" not in command._option_string_actions:
        return argv
    found = find_config(argv[1:])
    if found is None or not is_options_file(found[2]):
        return argv
    start, stop, path = found
    given = apply_options(command, load_options(path), source=f"--config {path}", command=argv[0])
    rest = argv[: start + 1] + argv[stop + 1 :]
    check_exclusive(command, given, rest[1:], source=f"--config {path}")
    return rest


def check_exclusive(
    parser: argparse.ArgumentParser, file_values: dict[str, Any], argv: Sequence[str], *, source: str
) -> None:
    """Refuse two options of one mutually exclusive group when the file gives one (or both): argparse checks a group
    on the command line only, so ``interactive: true`` in the file and ``--model DIR`` typed played the model
    without a word. ``file_values``: the options the file set to other than their defaults (dest → value), as
    :func:`apply_options` returns them."""
    for group in parser._mutually_exclusive_groups:
        given: dict[str, str] = {}
        for action in group._group_actions:
            flag = action.option_strings[-1] if action.option_strings else action.dest
            if action.dest in file_values:
                given.setdefault(action.dest, f"{action.dest} in {source}")
            if any(
                item == option or item.startswith(option + "=") for item in argv for option in action.option_strings
            ):
                given[action.dest] = flag
        if len(given) > 1:
            first, second = list(given.values())[:2]
            raise OptionsFileError(f"{first} and {second} are one or the other: give one")


def apply_options(
    parser: argparse.ArgumentParser, values: dict[str, Any], *, source: str, command: str
) -> dict[str, Any]:
    """Set ``values`` (option name → value) as ``parser``'s defaults and return them by dest (typed); raises
    :class:`OptionsFileError`."""
    actions = {
        action.dest: action
        for action in parser._actions
        if action.dest not in (argparse.SUPPRESS, "help", "config") and not isinstance(action, argparse._HelpAction)
    }
    environment = values.get("env") if isinstance(values.get("env"), dict) else None  # TRL's meaning: env vars
    options = {key: value for key, value in values.items() if not (key == "env" and environment is not None)}
    unknown = [str(key) for key in options if str(key).replace("-", "_") not in actions]
    if unknown:
        known = ", ".join(sorted(actions))
        raise OptionsFileError(f"unknown keys in {source}: {', '.join(unknown)} (envkit {command} options: {known})")
    defaults = {
        str(key).replace("-", "_"): _option_value(actions[str(key).replace("-", "_")], key, value, source)
        for key, value in options.items()
    }
    if environment is not None:
        os.environ.update({str(k): str(v) for k, v in environment.items()})
    for dest in defaults:
        actions[dest].required = False
    merged = {file_value_dest(dest): value for dest, value in defaults.items() if dest in ENV_CONFIG_NAMES}
    original = {dest: actions[dest].default for dest in defaults}
    parser.set_defaults(**defaults, **merged)
    return {dest: value for dest, value in defaults.items() if value != original[dest]}


def _option_value(action: argparse.Action, key: Any, value: Any, source: str) -> Any:
    """A YAML value as the option's parsed value (typed, checked against its choices)."""

    def bad(why: str) -> OptionsFileError:
        return OptionsFileError(f"{source}: {key}: {why}, got {value!r:.80}")

    if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
        if not isinstance(value, bool):  # a flag has no conversion of its own: "yes" is refused too
            raise bad("must be true or false")
        return value
    if action.dest in JSON_FLAGS and isinstance(value, dict):
        try:
            return json.dumps(value)
        except (TypeError, ValueError):  # YAML reads 2024-01-02 as a date, which no JSON object holds
            raise bad(
                "must hold JSON values only (text, numbers, true/false, null, lists, mappings): quote a date "
                "or time, e.g. '2024-01-02'"
            ) from None
    if isinstance(action, argparse._AppendAction):
        return [_typed(action, item, bad) for item in (value if isinstance(value, list) else [value])]
    return _typed(action, value, bad)


def _typed(action: argparse.Action, value: Any, bad: Any) -> Any:
    if value is None:  # an empty YAML value: the option's default when that is "none", else a mistake
        if action.default is None:
            return None
        raise bad(f"needs a value (an empty YAML value is null; leave the key out for the default, {action.default})")
    if isinstance(value, (dict, list)):
        raise bad("must be a single value")
    if action.type in (int, float) and (wanted := scalar_mismatch(action.type, value)):
        raise bad(f"must be {wanted}")
    if action.type is not None and callable(action.type):
        try:
            value = action.type(value if isinstance(value, str) else str(value))
        except (TypeError, ValueError, argparse.ArgumentTypeError):
            raise bad(f"invalid {getattr(action.type, '__name__', 'value')} value") from None
    elif not isinstance(value, str):
        value = str(value)
    if action.choices is not None and value not in action.choices:
        raise bad(f"must be one of {', '.join(map(str, action.choices))}")
    return value


def scalar_mismatch(kind: type, value: Any) -> str | None:
    """What a ``bool`` / ``int`` / ``float`` option wants when a YAML ``value`` is not one ("a whole number", …), or
    None when it fits. YAML values skip argparse's conversion (``num_generations: 2.5`` would reach the trainer as a
    float, ``json: 1`` would pass as true); a string is left to the option's own conversion (YAML reads ``5e-4`` as
    one). The one rule for every command's ``--config`` file (:mod:`envkit.adapters.trl.config` uses it too)."""
    if kind not in (bool, int, float) or isinstance(value, str):
        return None
    fits = (
        isinstance(value, bool)
        if kind is bool
        else isinstance(value, (int, float) if kind is float else int) and not isinstance(value, bool)
    )
    return None if fits else {bool: "true or false", int: "a whole number", float: "a number"}[kind]


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def as_flags(**settings: Any) -> list[str]:
    """A command line of ``--name value`` for each setting, in order (``max_steps=80`` → ``--max-steps 80``): a bool
    is ``true`` or ``false`` (the spelling of TRL's and transformers' flags), a dict, list or tuple JSON, ``None``
    leaves the flag out. The command's parser checks the names and values, as it does typed ones::

        envkit.adapters.trl.train.run(["--env", "arithmetic", *as_flags(model="out/sft", max_steps=80)])
    """
    argv: list[str] = []
    for name, value in settings.items():
        if value is None:
            continue
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, dict | list | tuple):
            text = json.dumps(value)
        else:
            text = str(value)
        argv += [f"--{name.replace('_', '-')}", text]
    return argv
