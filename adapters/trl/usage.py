"""The text of ``envkit train --help``: envkit's flags (each ``--rl-*`` flag with the GRPOConfig field it sets), then
the TRL GRPOConfig flags most runs touch, with the defaults a run really uses (``--help-all``: every GRPOConfig flag).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
from typing import Any

from envkit.adapters.trl.config import RL_TWINS, TrainArguments, envkit_defaults, train_parser_class
from envkit.adapters.trl.heldout import BEST_MODEL_METRIC
from envkit.adapters.trl.resume import SCRIPT_FIELDS
from envkit.util.text import one_line

ENV_CONFIG_ALIASES = {"rl_env_config": "env_config"}
"""envkit flags that are another name of an envkit flag (one setting in the help)."""

TRL_FLAGS_SHOWN = (
    "output_dir",
    "max_steps",
    "num_train_epochs",
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "save_strategy",
    "save_steps",
    "resume_from_checkpoint",
    "eval_strategy",
    "eval_steps",
    "load_best_model_at_end",
    "logging_steps",
    "report_to",
    "seed",
    "use_cpu",
    "bf16",
    "use_vllm",
    "vllm_mode",
    "disable_tqdm",
)
"""GRPOConfig fields ``envkit train --help`` lists (envkit sets the defaults of most): the rest is ``--help-all``."""

USAGE = (
    "envkit train ENV --model PATH [flags] [--config file.yaml]\n"
    "       envkit train --rl-env-module M --rl-env-class C --model PATH [flags]"
)


TRL_SHORT_HELP = {
    "output_dir": "where the adapter or model, log_history.json, eval_summary.json and reward_curve.png go",
    "max_steps": "training steps (overrides --num-train-epochs; -1: run the epochs)",
    "use_cpu": "train on the CPU (envkit's default when no GPU is visible)",
    "bf16": "bf16 mixed precision (envkit turns it off when no GPU is visible)",
    "save_steps": "save a checkpoint every N steps (with --save-strategy steps)",
    "eval_strategy": "evaluate during training (steps: every --eval-steps) on the --eval-tasks held-out tasks, through "
    "the same rollout; eval_envkit/* in the log",
    "eval_steps": "evaluate every N steps (with --eval-strategy steps; by default every --logging-steps)",
    "load_best_model_at_end": "end with the checkpoint of the best evaluation (by --metric-for-best-model; envkit's "
    f"default: {BEST_MODEL_METRIC}); needs --eval-strategy and a --save-strategy to match",
    "resume_from_checkpoint": "go on from a checkpoint-N folder (--save-strategy steps saves them), or `last`: the "
    "newest in --output-dir; its weights, optimizer, scheduler, RNG and data position come back",
}
"""One-line helps for :data:`TRL_FLAGS_SHOWN` whose first sentence in TRL says too little."""


METAVARS = {
    "model": "PATH",
    "env_config": "JSON",
    "rl_env_module": "MODULE",
    "rl_env_class": "CLASS",
    "vllm_server_base_url": "URL",
    "env_workers": "{threads,processes,ray}",
    "ray_address": "ADDRESS",
    "torch_threads": "{N,auto}",
    "output_dir": "DIR",
    "report_to": "NAME",
    "resume_from_checkpoint": "{DIR,last}",
}
"""Placeholders in the help for flags whose type says little (strings)."""


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help lines as written (each action's help already names its real default); one invocation per setting."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=40, width=120)

    def _format_action_invocation(self, action: argparse.Action) -> str:
        return getattr(action, "invocation", None) or super()._format_action_invocation(action)


def help_text(doc: str = "", full: bool = False) -> str:
    """``envkit train --help``: envkit's flags (a ``--rl-*`` flag and the GRPOConfig field it sets as one entry), then
    the TRL GRPOConfig flags most runs touch; ``full`` (``--help-all``) adds every other GRPOConfig flag. Each default
    shown is the one a run uses: envkit's over TRL's (:func:`envkit_defaults`), read from the parser ``parse`` uses.
    ``doc``: the train module's docstring (its first paragraph heads the help)."""
    from trl import GRPOConfig

    parser = train_parser_class()([TrainArguments, GRPOConfig], allow_abbrev=False)
    parser.set_defaults(**envkit_defaults(TrainArguments()))
    actions: dict[str, argparse.Action] = {}
    negations: dict[str, list[str]] = {}
    for action in parser._actions:
        if action.dest == "help":
            continue
        if action.nargs == 0 and action.dest in actions:  # HfArgumentParser's --no-X of a field that defaults to true
            negations[action.dest] = _dashed(action.option_strings)
        else:
            actions.setdefault(action.dest, action)
    envkit_fields = [f.name for f in dataclasses.fields(TrainArguments) if f.init]
    view = argparse.ArgumentParser(
        prog="envkit train",
        usage=USAGE,
        description=doc.split("\n\n", 1)[0],
        formatter_class=_HelpFormatter,
        add_help=False,
        allow_abbrev=False,
    )
    ours = view.add_argument_group("envkit flags (names joined by a comma are one setting)")
    aliases = {**{flag: twin for flag, twin in RL_TWINS.items()}, **ENV_CONFIG_ALIASES}
    own_help = {name: actions[name].help for name in envkit_fields}
    shown: set[str] = set()
    for name in envkit_fields:
        if name in ENV_CONFIG_ALIASES:
            continue
        if name in RL_TWINS:
            dest, names = RL_TWINS[name], [RL_TWINS[name], name]
        else:
            dest, names = name, [name, *(flag for flag, other in aliases.items() if other == name)]
        help_ = own_help[name] or ""
        if name == "env":
            help_ = f"the env to train on (the first argument, or --env ENV): {help_}"
        if name == "env_config":
            help_ = help_.replace(" (alias: --rl-env-config)", "")
        if name == "vllm_server_url":
            help_ += " (also sets --vllm-mode server)"
        options = [option for n in names for option in _dashed(actions[n].option_strings)]
        _show(ours, actions[dest], options, help_, negations.get(dest), name == "env")
        shown.update(names)
    trl_group = view.add_argument_group("TRL GRPOConfig flags (the ones most runs touch)")
    for name in TRL_FLAGS_SHOWN:
        action = actions[name]
        help_ = TRL_SHORT_HELP.get(name) or _first_sentence(action.help)
        _show(trl_group, action, _dashed(action.option_strings), help_, negations.get(name))
    shown.update(TRL_FLAGS_SHOWN)
    rest = [name for name in actions if name not in shown and name not in envkit_fields]
    if full:
        everything = view.add_argument_group("every other TRL GRPOConfig flag")
        for name in rest:
            action = actions[name]
            help_ = SCRIPT_FIELDS.get(name) or action.help or ""  # transformers leaves these to scripts: ours
            _show(everything, action, _dashed(action.option_strings), help_, negations.get(name))
    else:
        view.epilog = (
            f"{len(rest)} more TRL GRPOConfig flags (every field is a flag and a --config key): envkit train --help-all"
        )
    return view.format_help()


def _dashed(option_strings: list[str]) -> list[str]:
    """``--max-steps`` for ``--max_steps`` / ``--max-steps`` (HfArgumentParser accepts both spellings)."""
    dashed = [option for option in option_strings if "_" not in option]
    return dashed or list(option_strings)


def _show(
    group: Any,
    action: argparse.Action,
    options: list[str],
    help_: str,
    negation: list[str] | None = None,
    positional: bool = False,
) -> None:
    """One help entry: ``action`` under ``options``, its help ending with the default a run uses."""
    shown = copy.copy(action)
    shown.option_strings, shown.required = options, False
    kind = getattr(action.type, "__name__", "")
    metavar = (
        "ENV"
        if positional
        else METAVARS[action.dest]
        if action.dest in METAVARS
        else "{" + ",".join(map(str, action.choices)) + "}"
        if action.choices
        else {"int": "N", "float": "X", "string_to_bool": "BOOL"}.get(kind, "VALUE")
    )
    if action.nargs == "?":
        metavar = f"[{metavar}]"
    elif action.nargs in ("+", "*"):
        metavar = f"{metavar} [{metavar} ...]"
    shown.invocation = ", ".join(["ENV", *options] if positional else options) + (  # type: ignore[attr-defined]
        "" if action.nargs == 0 else f" {metavar}"
    )
    said = "default" in help_.lower() and action.dest in {f.name for f in dataclasses.fields(TrainArguments)}
    text = help_.rstrip()
    if negation:
        text += f" ({negation[0]} turns it off)"
    if action.dest == "model":
        text += " (required)"
    elif not said and action.nargs != 0 and action.default is not None:
        text += " (default: {})".format(str(action.default).replace("%", "%%"))
    shown.help = text  # argparse's own help text: "%" already written "%%" where meant
    group._add_action(shown)


def _first_sentence(text: str | None) -> str:
    text = one_line(text or "")
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]
