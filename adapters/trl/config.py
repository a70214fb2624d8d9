"""The flags of ``envkit train``: envkit's :class:`TrainArguments` and TRL's ``GRPOConfig``, parsed by TrlParser.

``--config file.yaml`` is read by TRL's own parser (``TrlParser.parse_args_and_config``): its keys set any field of
either dataclass (``max_steps: 200``, ``rl_num_generations: 8``; ``max-steps`` works too), the command line wins, and
an ``env:`` mapping sets environment variables as in TRL's scripts. ``env:`` as a string is envkit's ``--env`` (the env
to train on). Unknown keys, unreadable files and bad values are one line (:class:`TrainUsageError`, exit code 2).
The ``--help`` text is :mod:`envkit.adapters.trl.usage`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import tempfile
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envkit.registry import ENV_CONFIG_NAMES
from envkit.util.text import one_line
from envkit.util.threads import AUTO, TORCH_THREADS_HELP


class TrainUsageError(ValueError):
    """A user mistake in the train command (printed as one line, exit code 2)."""


@dataclass
class TrainArguments:
    """envkit's flags for ``envkit train`` (the rest come from TRL's GRPOConfig)."""

    model: str = field(default="", metadata={"help": "local model folder (hub ids work where a hub is reachable)"})
    env: str | None = field(default=None, metadata={"help": "registered name, package.module:Class or file.py:Class"})
    env_config: str | None = field(
        default=None, metadata={"help": "JSON object of the env's constructor arguments (alias: --rl-env-config)"}
    )
    rl_env_module: str | None = field(default=None, metadata={"help": "module of the env class (seed-style flags)"})
    rl_env_class: str | None = field(default=None, metadata={"help": "env class name in --rl-env-module"})
    rl_env_config: str | None = field(
        default=None, metadata={"help": "JSON object of constructor arguments (seed-style alias of --env-config)"}
    )
    rl_num_generations: int = field(default=4, metadata={"help": "completions per prompt (GRPO group size)"})
    rl_kl_coef: float | None = field(
        default=None,
        metadata={
            "help": "KL coefficient β; with --async 0 (AsyncGRPO has no KL term, so a non-zero β is refused there)"
        },
    )
    rl_clip_range: float = field(default=0.2, metadata={"help": "PPO clip range ε"})
    rl_max_new_tokens: int = field(
        default=128, metadata={"help": "tokens per assistant turn (sets max_completion_length, which is per turn here)"}
    )
    rl_top_k: int = field(default=0, metadata={"help": "top-k sampling (0 = off, TRL's default)"})
    rl_top_p: float = field(default=1.0, metadata={"help": "top-p sampling"})
    rl_temperature: float = field(default=1.0, metadata={"help": "sampling temperature"})
    vllm_server_url: str | None = field(
        default=None,
        metadata={
            "help": "URL of a running `trl vllm-serve` server; with --async: vLLM server URL(s), comma-separated"
        },
    )
    vllm_server_gpus: int | None = field(
        default=None,
        metadata={
            "help": "with --async --vllm-servers K: GPUs the local servers take, the machine's last ones, K or a "
            "multiple (default: one per server); training keeps the rest"
        },
    )
    max_turns: int | None = field(default=None, metadata={"help": "assistant turns per episode (default: the env's)"})
    max_episode_tokens: int | None = field(default=None, metadata={"help": "cap on prompt + completion tokens"})
    max_completion_tokens: int | None = field(
        default=None,
        metadata={
            "help": "cap on one episode's completion tokens (model + env tokens after the prompt): the sequence TRL "
            "back-propagates through, so what bounds its memory. Default: 4 x max_completion_length (the per-turn "
            "budget), i.e. 512 at the default 128 tokens per turn, TRL's own default completion length"
        },
    )
    max_error_rate: float = field(
        default=0.5,
        metadata={
            "help": "stop training when more than this fraction of one step's episodes fail (env raised or timed out, "
            "generation failed, score_episode raised or left [0, 1]); their share is logged as envkit/error_rate"
        },
    )
    concurrency: int = field(
        default=32,
        metadata={
            "help": "episodes in flight, and so envs alive, at once per training process, on every --env-workers kind"
        },
    )
    step_timeout: float = field(
        default=60.0,
        metadata={
            "help": "seconds one env call (construct, reset, step, score) may run; past it the episode ends with "
            "finish_reason=timeout and carries no gradient"
        },
    )
    generate_timeout: float = field(
        default=1800.0,
        metadata={
            "help": "seconds one generation may take; past it the episode ends with an error (counted in "
            "envkit/error_rate), so a hung vLLM engine or server cannot stall training"
        },
    )
    env_workers: str = field(
        default="threads",
        metadata={
            "help": "where envs live: threads (default), processes (a few worker processes, each hosting many envs: "
            "a hung step is killed, a crash ends only the episodes on that process) or ray (Ray actors, the same "
            "way; the ray extra)"
        },
    )
    ray_address: str | None = field(
        default=None, metadata={"help": "Ray cluster for --env-workers ray (default: a local Ray instance)"}
    )
    train_tasks: int = field(default=512, metadata={"help": "training task seeds 0 … N-1"})
    eval_tasks: int | None = field(
        default=None,
        metadata={
            "help": "held-out tasks evaluated before and after training (0 = skip). Default: 32 for envkit envs, 0 for "
            "seed-style classes (whose eval plays build_dataset's rows, the training tasks themselves)"
        },
    )
    eval_samples: int = field(default=1, metadata={"help": "episodes per held-out task"})
    no_lora: bool = field(default=False, metadata={"help": "full fine-tuning instead of LoRA"})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA alpha"})
    lora_dropout: float = field(default=0.0, metadata={"help": "LoRA dropout"})
    lora_target_modules: list[str] | None = field(default=None, metadata={"help": "LoRA modules (default: all-linear)"})
    merge: bool = field(default=False, metadata={"help": "also save the LoRA-merged model in OUTPUT_DIR/merged"})
    verify_vllm_sync: bool = field(
        default=True,
        metadata={
            "help": "with --use-vllm colocate: after training, check that vLLM's logprobs are the trained model's"
        },
    )
    async_grpo: bool = field(
        default=False,
        metadata={
            "help": "(alias --async) train asynchronously with TRL's AsyncGRPOTrainer: generation on vLLM servers "
            "(--vllm-server-url or --vllm-servers) with the LoRA adapter hot-swapped after every step, overlapping "
            "training; any number of training processes (accelerate launch)"
        },
    )
    max_staleness: int = field(
        default=2,
        metadata={
            "help": "with --async: policy versions a sample may lag behind the one it trains. 2 (default) lets the "
            "servers generate the next step while this one trains (samples train 1-2 versions old, the importance "
            "ratio against the adapter that generated them corrects for it; each server holds 4 adapters); 1 "
            "generates each step's samples while the trainer waits (on-policy on the servers, no overlap)"
        },
    )
    vllm_servers: int = field(
        default=0, metadata={"help": "with --async: start this many local vLLM servers (stopped at the end)"}
    )
    vllm_python: str | None = field(
        default=None, metadata={"help": "with --vllm-servers: the Python with vLLM installed (default: this one)"}
    )
    adapter_dir: str | None = field(
        default=None,
        metadata={
            "help": "with --async: where adapters are saved, readable by every server (default OUTPUT_DIR/adapters)"
        },
    )
    print_server_command: bool = field(
        default=False,
        metadata={
            "help": "with --async: print the command that starts one vLLM server for this run (on each server "
            "machine), then exit"
        },
    )
    torch_threads: str = field(default=AUTO, metadata={"help": TORCH_THREADS_HELP})
    max_completion_tokens_given: int | None = field(default=None, init=False, repr=False)
    """``--max-completion-tokens`` as the user gave it (``None``: not given; the field itself gets a default)."""
    grpo_fields_given: frozenset[str] = field(default=frozenset(), init=False, repr=False)
    """The GRPOConfig fields the command line or the ``--config`` file set (a ``--rl-*`` flag sets its twin): what
    ``--async`` checks for settings it cannot honour."""


ASYNC_ONLY_FLAGS = (
    "max_staleness",
    "vllm_servers",
    "vllm_python",
    "vllm_server_gpus",
    "adapter_dir",
    "print_server_command",
)
"""TrainArguments fields only ``--async`` reads: without ``--async``, a value other than the default is refused
(:func:`check_async_only_flags`) instead of doing nothing (``--print-server-command`` trained instead of printing)."""


def changed_fields(settings: Any, names: Iterable[str]) -> list[str]:
    """The fields among ``names`` (in their order) of the dataclass instance ``settings`` whose value is not the
    field's default: the settings a user gave."""
    defaults = {f.name: f.default for f in dataclasses.fields(type(settings))}
    return [name for name in names if getattr(settings, name) != defaults[name]]


def check_async_only_flags(args: TrainArguments, config: Any) -> None:
    """Refuse, in one line, settings that a run without ``--async`` would ignore: those of :data:`ASYNC_ONLY_FLAGS`,
    and ``--vllm-server-url`` without ``--use-vllm`` (it trained locally, never asking the server)."""
    if args.async_grpo:
        return
    given = ["--" + name.replace("_", "-") for name in changed_fields(args, ASYNC_ONLY_FLAGS)]
    if given:
        raise TrainUsageError(
            f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --async only: add --async, or drop "
            f"{'it' if len(given) == 1 else 'them'}"
        )
    if args.vllm_server_url and not config.use_vllm:
        raise TrainUsageError(
            "--vllm-server-url: generation goes to a vLLM server with --async (envkit's servers) or --use-vllm "
            "(TRL's server mode); without either the run would train locally, never asking it: add one, or drop it"
        )


LORA_FLAGS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "merge")
"""The :class:`TrainArguments` fields that shape the LoRA adapter: refused with ``--no-lora``, which ignored them."""


SYNC_BETA = 0.1
"""envkit's default KL coefficient β without ``--async`` (``--async``: 0, AsyncGRPO has no KL term)."""


RL_TWINS = {
    "rl_num_generations": "num_generations",
    "rl_kl_coef": "beta",
    "rl_clip_range": "epsilon",
    "rl_temperature": "temperature",
    "rl_top_k": "top_k",
    "rl_top_p": "top_p",
    "rl_max_new_tokens": "max_completion_length",
    "vllm_server_url": "vllm_server_base_url",
}
"""Seed-style flags and the GRPOConfig field each sets: typed on the command line, the flag beats the field in the YAML
file (the field typed on the command line too still wins)."""


def episode_limits(args: TrainArguments) -> dict[str, Any]:
    """The engine's episode limits from ``args`` (turns, token budgets, concurrency, deadlines): the keyword arguments
    every engine of a training run takes, the rollout's and the held-out eval's alike."""
    return {
        "max_turns": args.max_turns,
        "max_episode_tokens": args.max_episode_tokens,
        "max_completion_tokens": args.max_completion_tokens,
        "concurrency": args.concurrency,
        "step_timeout_s": args.step_timeout,
        "generate_timeout_s": args.generate_timeout,
    }


def training_record(args: TrainArguments, config: Any, *, seed_style: bool = False) -> dict[str, Any]:
    """What ``eval_summary.json`` keeps of how the model trained (its ``training`` entry), so that ``envkit eval`` of
    the saved model can say when it scores training tasks or gives other budgets: the training task seeds
    (0 … ``train_tasks`` - 1; ``None`` for a seed-style class, which trains on all of its build_dataset rows, and
    whose task seed ``s`` plays row ``s % rows``: every seed is a training task), the tokens per assistant turn, the
    episode's completion budget and the turn cap."""
    return {
        "train_tasks": None if seed_style else args.train_tasks,
        "max_new_tokens": int(config.max_completion_length),
        "max_completion_tokens": args.max_completion_tokens,
        "max_turns": args.max_turns,
    }


def train_parser_class() -> type:
    """``trl.TrlParser`` with one-line errors (no usage dump, no SystemExit) and ``max-steps`` YAML keys accepted."""
    from trl import TrlParser

    class Parser(TrlParser):
        def error(self, message: str) -> None:  # type: ignore[override]
            raise TrainUsageError(f"{message} (see envkit train --help)")

        def set_defaults_with_config(self, **kwargs: Any) -> list[str]:
            dests = {action.dest for action in self._actions}
            return super().set_defaults_with_config(
                **{(k.replace("-", "_") if k.replace("-", "_") in dests else k): v for k, v in kwargs.items()}
            )

    return Parser


def parse(argv: list[str]) -> tuple[TrainArguments, Any]:
    """``(TrainArguments, GRPOConfig)`` from the command line and ``--config file.yaml``; raises TrainUsageError."""
    from trl import GRPOConfig

    argv = ["--async_grpo" if item == "--async" else item for item in _split_equals(list(argv))]
    argv = _positional_env(argv, GRPOConfig)
    argv, cleanup, path, values = _prepare_config(argv)
    try:
        return _parse(argv, GRPOConfig, path, values)
    finally:
        if cleanup is not None:
            cleanup()


def _parse(
    argv: list[str], grpo_config: type, path: str | None = None, values: dict[str, Any] | None = None
) -> tuple[TrainArguments, Any]:
    """``path``: the ``--config`` file as the user named it (for messages); ``values``: the mapping in it."""
    parser_class = train_parser_class()
    values = {str(key).replace("-", "_"): value for key, value in (values or {}).items()}
    _check_file_types(values, path, grpo_config)
    typed = _typed_on_command_line(parser_class, [TrainArguments, grpo_config], argv)
    # First pass, envkit's flags alone: the seed-style --rl-* values are the defaults of GRPOConfig fields.
    try:
        args, from_file, _ = parser_class(TrainArguments, allow_abbrev=False).parse_args_and_config(
            argv, return_remaining_strings=True, separate_remaining_strings=True
        )
    except TrainUsageError:
        raise
    except (ValueError, TypeError) as error:  # TrlParser's own checks of the file (not a mapping, `env:` not one)
        raise TrainUsageError(f"--config {path}: {_first_line(error)}") from None
    except OSError as error:
        raise TrainUsageError(f"cannot read --config {path}: {getattr(error, 'strerror', None) or error}") from None
    theirs = {f.name for f in dataclasses.fields(grpo_config)}
    unknown = [k for k in (key.removeprefix("--") for key in from_file[0::2]) if k.replace("-", "_") not in theirs]
    if unknown:
        raise TrainUsageError(
            f"unknown keys in --config {path}: {', '.join(unknown)} (keys are envkit train flags: TrainArguments and "
            "GRPOConfig fields, see envkit train --help)"
        )
    defaults = envkit_defaults(args)
    # Second pass, both dataclasses: envkit's defaults < the YAML file < the command line. A --rl-* flag typed on the
    # command line types its twin too (unless the twin is typed there), so it beats the twin in the file.
    twins = [
        item
        for flag, twin in RL_TWINS.items()
        if flag in typed and twin not in typed
        for item in (f"--{twin}", str(getattr(args, flag)))
    ]
    if "vllm_server_url" in typed and "vllm_mode" not in typed:
        twins += ["--vllm_mode", "server"]
    parser = parser_class([TrainArguments, grpo_config], allow_abbrev=False)
    parser.set_defaults(**defaults)
    try:
        args, config, _, leftover = parser.parse_args_and_config(
            [*twins, *argv], return_remaining_strings=True, separate_remaining_strings=True
        )
    except TrainUsageError:
        raise
    except (ValueError, TypeError) as error:  # GRPOConfig's own checks, e.g. batch size vs num_generations
        raise TrainUsageError(_config_error(error)) from None
    except ZeroDivisionError:  # GRPOConfig divides by num_generations before its own check of it
        raise TrainUsageError(
            "--rl-num-generations (--num-generations) must be at least 2, got 0: GRPO compares each episode with the "
            "others of its group"
        ) from None
    except OSError as error:
        raise TrainUsageError(f"cannot read --config {path}: {getattr(error, 'strerror', None) or error}") from None
    if leftover:
        raise TrainUsageError(f"unknown arguments: {' '.join(leftover)} (see envkit train --help)")
    from envkit.registry import EnvSpecError, merge_env_config

    try:  # the file's mapping and the command line's JSON: one rule for every command
        args.env_config = merge_env_config(
            {name: getattr(args, name) for name in ENV_CONFIG_NAMES if name in typed},
            {name: values.get(name) for name in ENV_CONFIG_NAMES},
        )
    except EnvSpecError as error:
        raise TrainUsageError(str(error)) from None
    args.rl_env_config = None
    given = typed | set(values) | {twin for flag, twin in RL_TWINS.items() if flag in typed or flag in values}
    args.grpo_fields_given = frozenset(given & {f.name for f in dataclasses.fields(grpo_config)})
    args.max_completion_tokens_given = args.max_completion_tokens
    if args.max_completion_tokens is None and config.max_completion_length:
        from envkit.adapters.trl import COMPLETION_BUDGET_TURNS

        args.max_completion_tokens = COMPLETION_BUDGET_TURNS * int(config.max_completion_length)
    for flag, value in (("--step-timeout", args.step_timeout), ("--generate-timeout", args.generate_timeout)):
        if not value > 0:
            raise TrainUsageError(f"{flag} must be a positive number of seconds, got {value:g}")
    if not 0.0 <= args.max_error_rate <= 1.0:
        raise TrainUsageError(f"--max-error-rate must be between 0 and 1, got {args.max_error_rate}")
    check_ranges(args, config)
    check_report_to(config.report_to)
    return args, config


def check_ranges(args: TrainArguments, config: Any) -> None:
    """Refuse, in one line, counts below 1 and sampling or optimizer settings out of range, which would otherwise
    train on nothing (``--train-tasks 0``) or by epochs (``--max-steps 0``), raise deep inside after the model loaded
    (``--concurrency 0``, ``--lora-r 0``, a batch size of 0, a LoRA dropout of 2, a negative learning rate) or train
    as something else (a negative temperature divides TRL's logits by it; top-p 2 is off)."""
    for flag, count in (
        ("--train-tasks", args.train_tasks),
        ("--concurrency", args.concurrency),
        ("--max-turns", args.max_turns),
        ("--max-episode-tokens", args.max_episode_tokens),
        ("--max-completion-tokens", args.max_completion_tokens),
        ("--lora-r", None if args.no_lora else args.lora_r),
        ("--per-device-train-batch-size", config.per_device_train_batch_size),
        ("--gradient-accumulation-steps", config.gradient_accumulation_steps),
        ("--rl-max-new-tokens (--max-completion-length)", config.max_completion_length),
        ("--eval-samples", args.eval_samples),
    ):
        if count is not None and count < 1:  # None: not given (the env's, no limit) or not used
            raise TrainUsageError(f"{flag} must be at least 1, got {count}")
    if args.no_lora and (given := changed_fields(args, LORA_FLAGS)):
        flags = ", ".join("--" + name.replace("_", "-") for name in given)
        raise TrainUsageError(f"{flags}: LoRA settings, and --no-lora trains the whole model: drop one or the other")
    if not 0 <= config.seed < 2**32:  # numpy's and accelerate's set_seed raise past the model load otherwise
        raise TrainUsageError(f"--seed must be 0 to {2**32 - 1}, got {config.seed}")
    if config.max_steps == 0 or config.max_steps < -1:  # transformers reads any max_steps <= 0 as "by epochs"
        raise TrainUsageError(
            f"--max-steps must be at least 1 (or -1: train for --num-train-epochs), got {config.max_steps}"
        )
    if not args.no_lora and not 0 <= args.lora_dropout < 1:
        raise TrainUsageError(f"--lora-dropout must be at least 0 and below 1, got {args.lora_dropout:g}")
    if not 0 < config.learning_rate < math.inf:  # inf trained to NaN weights and saved them, exit 0
        raise TrainUsageError(f"--learning-rate must be a finite number above 0, got {config.learning_rate:g}")
    if not args.no_lora and not args.lora_alpha > 0:
        raise TrainUsageError(f"--lora-alpha must be above 0, got {args.lora_alpha}")
    for flag, value, zero_allowed, wanted in (
        ("--rl-clip-range (--epsilon)", config.epsilon, False, "above 0"),
        ("--epsilon-high", config.epsilon_high, False, "above 0"),
        ("--rl-kl-coef (--beta)", config.beta, True, "0 (no KL term) or more"),
        ("--max-grad-norm", config.max_grad_norm, True, "0 (no clipping) or more"),
        ("--weight-decay", config.weight_decay, True, "0 or more"),
    ):
        if value is not None and not (math.isfinite(value) and (value >= 0 if zero_allowed else value > 0)):
            raise TrainUsageError(f"{flag} must be a finite number {wanted}, got {value:g}")
    check_sampling_ranges(config)


def check_sampling_ranges(config: Any) -> None:
    """Refuse, in one line naming the flag (and its ``--rl-*`` twin), a GRPOConfig sampling field out of the range
    :class:`~envkit.backends.SamplingParams` holds it to; the fields checked are those the two share, so a sampling
    field either gains is checked without an edit here. The temperature must also be above 0: TRL divides the
    policy's logits by it to score the sampled tokens."""
    from envkit.backends import SAMPLING_RANGES, SamplingParams, SamplingRangeError

    twin_of = {field: "--" + flag.replace("_", "-") for flag, field in RL_TWINS.items()}

    def flag(field: str) -> str:
        name = "--" + field.replace("_", "-")
        return f"{name} ({twin_of[field]})" if field in twin_of else name

    if not config.temperature > 0:
        raise TrainUsageError(f"{flag('temperature')} must be above 0, got {config.temperature:g}")
    shared = {name: getattr(config, name) for name in SAMPLING_RANGES if hasattr(config, name)}
    try:
        SamplingParams(**shared)
    except SamplingRangeError as error:
        raise TrainUsageError(f"{flag(error.field)} {error.requirement}") from None


def envkit_defaults(args: TrainArguments) -> dict[str, Any]:
    """The GRPOConfig defaults envkit sets over TRL's, given envkit's flags (the ``--rl-*`` twins set their field's):
    what parsing starts from and what ``envkit train --help`` shows."""
    import torch

    generations = args.rl_num_generations
    defaults: dict[str, Any] = {
        "output_dir": "runs/envkit-train",
        "learning_rate": 1e-5,
        "num_generations": generations,
        "beta": args.rl_kl_coef if args.rl_kl_coef is not None else 0.0 if args.async_grpo else SYNC_BETA,
        "epsilon": args.rl_clip_range,
        "temperature": args.rl_temperature,
        "top_k": args.rl_top_k,
        "top_p": args.rl_top_p,
        "max_completion_length": args.rl_max_new_tokens,
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "no",
        "per_device_train_batch_size": max(generations, 8 // generations * generations) if generations > 0 else 8,
    }
    if args.vllm_server_url:
        defaults.update(vllm_server_base_url=args.vllm_server_url, vllm_mode="server")
    if not torch.cuda.is_available():
        defaults.update(use_cpu=True, bf16=False)
    return defaults


BOOLEAN_WORDS = frozenset({"true", "false", "yes", "no", "t", "f", "y", "n", "1", "0"})
"""What HfArgumentParser's ``string_to_bool`` reads: a ``--flag`` of a boolean field takes the next argument only
when it is one of these."""


def _positional_env(argv: list[str], grpo_config: type) -> list[str]:
    """``envkit train ENV ...`` as ``--env ENV``, as ``play``/``validate``/``eval``/``sft`` take the env: ENV is the
    first argument that is neither a flag nor a flag's value. ``ENV`` and ``--env`` both given is one line."""
    options = train_parser_class()([TrainArguments, grpo_config], allow_abbrev=False)._option_string_actions
    index = 0
    while index < len(argv):
        item = argv[index]
        if item == "--":
            break
        if not item.startswith("-") or item == "-":
            env_flags = [a for a in argv if a == "--env" or a.startswith("--env=")]
            if env_flags:
                raise TrainUsageError(f"the env is given twice ({item} and --env): give ENV or --env ENV, not both")
            return [*argv[:index], "--env", item, *argv[index + 1 :]]
        action = options.get(item.split("=", 1)[0])
        index += 1
        if "=" in item or (action is not None and action.nargs == 0):
            continue
        nargs = None if action is None else action.nargs
        if nargs in ("+", "*"):
            while index < len(argv) and not argv[index].startswith("-"):
                index += 1
        elif nargs == "?":
            boolean = getattr(getattr(action, "type", None), "__name__", "") == "string_to_bool"
            if index < len(argv) and not argv[index].startswith("-"):
                index += not boolean or argv[index].lower() in BOOLEAN_WORDS
        elif index < len(argv):  # one value (an unknown flag's next argument too: it is reported with it)
            index += not (action is None and argv[index].startswith("-"))
    return argv


def _typed_on_command_line(parser_class: type, dataclass_types: list[type], argv: list[str]) -> set[str]:
    """The fields argv itself sets (not the ``--config`` file, not a default)."""
    parser = parser_class(dataclass_types, allow_abbrev=False)
    for action in parser._actions:
        action.default, action.required = argparse.SUPPRESS, False
    if "--config" in argv:
        index = argv.index("--config")
        argv = [*argv[:index], *argv[index + 2 :]]
    namespace, _ = parser.parse_known_args(argv)
    return set(vars(namespace))


def _check_file_types(values: dict[str, Any], path: str | None, grpo_config: type) -> None:
    """Refuse, in one line, YAML values of the wrong shape: a list or mapping for a single-valued field, an
    ``env_config`` that is neither a mapping nor a JSON string."""
    hints = {**typing.get_type_hints(TrainArguments), **typing.get_type_hints(grpo_config)}
    for name, value in values.items():
        if name in ENV_CONFIG_NAMES:
            if value is not None and not isinstance(value, (dict, str)):
                raise TrainUsageError(
                    f"--config {path}: {name} must be a mapping of the env's constructor arguments, got {value!r:.80}"
                )
        elif name != "env" and name in hints and isinstance(value, (dict, list)) and not _takes_many(hints[name]):
            raise TrainUsageError(f"--config {path}: {name}: must be a single value, got {value!r:.80}")
        elif name != "env" and name in hints and (wanted := _scalar_mismatch(hints[name], value)):
            raise TrainUsageError(f"--config {path}: {name} must be {wanted}, got {value!r:.80}")


def _scalar_mismatch(hint: Any, value: Any) -> str | None:
    """:func:`envkit.util.options.scalar_mismatch` for a field's type hint (``int``, ``float | None``, …)."""
    from envkit.util.options import scalar_mismatch

    args = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    kinds = [a for a in args if a is not type(None)]
    if len(kinds) != 1 or (value is None and type(None) in args):
        return None
    return scalar_mismatch(kinds[0], value)


def _takes_many(hint: Any) -> bool:
    """Whether a field's type takes a list or a mapping."""
    if hint in (list, dict, Any):
        return True
    origin = typing.get_origin(hint)
    if origin in (list, dict):
        return True
    return origin in (typing.Union, types.UnionType) and any(_takes_many(arg) for arg in typing.get_args(hint))


def _split_equals(argv: list[str]) -> list[str]:
    """``--config=FILE`` as ``--config FILE`` (TrlParser looks for the bare flag)."""
    out: list[str] = []
    for item in argv:
        out.extend(item.split("=", 1) if item.startswith("--config=") else [item])
    return out


def _prepare_config(argv: list[str]) -> tuple[list[str], Any, str | None, dict[str, Any] | None]:
    """Check ``--config FILE`` before TrlParser opens it; ``env: NAME`` (a string) becomes ``--env NAME``.

    TrlParser reads ``env:`` as a mapping of environment variables; envkit's ``env`` flag is the env to train on. A
    string there is the latter: the file is handed to TrlParser without it (a temporary copy) and ``--env NAME`` goes
    before the command line's flags, so a ``--env`` given there still wins. ``~`` in FILE is expanded. Returns argv,
    a cleanup or ``None``, FILE as the user named it (for messages) and the mapping in it.
    """
    if "--config" not in argv:
        return argv, None, None, None
    index = argv.index("--config")
    if index + 1 >= len(argv) or argv[index + 1].startswith("--"):
        raise TrainUsageError("--config needs a YAML file of envkit train flags")
    path = argv[index + 1]
    argv = [*argv[:index], "--config", os.path.expanduser(path), *argv[index + 2 :]]
    import yaml

    try:
        values = yaml.safe_load(Path(path).expanduser().read_text())
    except (OSError, UnicodeDecodeError) as error:
        hint = (
            " (--config takes a YAML file of flags; the env's constructor arguments go in --env-config JSON)"
            if path.lstrip().startswith("{")
            else ""
        )
        reason = getattr(error, "strerror", None) or error
        raise TrainUsageError(f"cannot read --config {path}: {reason}{hint}") from None
    except yaml.YAMLError as error:
        raise TrainUsageError(f"cannot read --config {path}: {one_line(error)}") from None
    if not isinstance(values, dict):
        raise TrainUsageError(f"--config {path} must hold a YAML mapping of flag names to values")
    if not isinstance(values.get("env"), str):
        return argv, None, path, values
    env = values.pop("env")
    handle, copy = tempfile.mkstemp(prefix="envkit-train-", suffix=".yaml")
    with os.fdopen(handle, "w") as file:
        yaml.safe_dump(values, file)
    rest = [*argv[:index], "--config", copy, *argv[index + 2 :]]
    return ["--env", env, *rest], lambda: Path(copy).unlink(missing_ok=True), path, values


REPORTING_INTEGRATIONS = {
    "tensorboard": "tensorboard",
    "wandb": "wandb",
    "mlflow": "mlflow",
    "comet_ml": "comet_ml",
    "neptune": "neptune",
    "clearml": "clearml",
    "dvclive": "dvclive",
    "trackio": "trackio",
    "swanlab": "swanlab",
    "codecarbon": "codecarbon",
}
"""``--report-to`` names that transformers can tell are installed, and the pip package of each."""


def check_report_to(report_to: Any) -> None:
    """Refuse, in one line, a ``--report-to`` integration that is unknown or not installed (transformers would raise
    a traceback when the trainer is built)."""
    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    available = None
    for name in names:
        if name in ("none", "all"):
            continue
        if name not in INTEGRATION_TO_CALLBACK:
            raise TrainUsageError(
                f"--report-to {name}: unknown integration (transformers knows {', '.join(INTEGRATION_TO_CALLBACK)})"
            )
        if name in REPORTING_INTEGRATIONS:
            available = get_available_reporting_integrations() if available is None else available
            if name not in available:
                raise TrainUsageError(
                    f"--report-to {name}: {name} is not installed (pip install {REPORTING_INTEGRATIONS[name]})"
                )


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _config_error(error: Exception) -> str:
    text = _first_line(error)
    if "divisible" in text or "num_generations" in text:
        return f"batch size not compatible with the number of generations: {text}"
    return f"invalid training configuration: {text}"
