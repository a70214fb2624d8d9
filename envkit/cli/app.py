"""The ``envkit`` command line: one subcommand per job (``envkit --help`` lists them). The parsers live here; the
subcommands' work in :mod:`envkit.cli.commands` (the short ones, and the helpers all share) and a module each for the
longer ones (:mod:`envkit.cli.evaluate`, :mod:`envkit.cli.serve`, :mod:`envkit.cli.play`, …)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

from rich.console import Console

from envkit.cli.commands import (
    ENV_ONLY_DEFAULTS,
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    UsageError,
    cmd_init,
    cmd_list,
    cmd_sft,
    cmd_validate,
    cmd_view,
    env_config_from_args,
    parse_json_object,
)
from envkit.cli.evaluate import cmd_eval
from envkit.cli.model import add_model_parser, cmd_model
from envkit.cli.play import add_play_parser, cmd_play
from envkit.cli.rft import add_rft_parser, cmd_rft
from envkit.cli.serve import cmd_serve, cmd_serve_env
from envkit.util.children import Terminated, sigterm_exits
from envkit.util.process_exit import exit_without_finalizing, in_several_processes
from envkit.util.threads import add_torch_threads_flag

__all__ = [
    "EXIT_FAIL",
    "EXIT_OK",
    "EXIT_USAGE",
    "UsageError",
    "build_parser",
    "console_main",
    "env_config_from_args",
    "main",
    "parse_json_object",
]


def _cmd_train(args: argparse.Namespace, console: Console) -> int:
    """``envkit train``: its flags (envkit's and every TRL GRPOConfig field) are read by
    :mod:`envkit.adapters.trl.config`."""
    from envkit.adapters.trl.train import main as train_main

    return train_main(args.train_argv)


COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace, Console], int]]] = {
    "list": ("list the registered environments", cmd_list),
    "play": (
        "play one episode of an env: its oracle plays (default), you do (--interactive) or a model (--model DIR)",
        cmd_play,
    ),
    "validate": ("check an environment offline for the bugs that wreck RL runs", cmd_validate),
    "eval": ("evaluate a model on an env: mean score, pass@k, pass^k, turns, tool errors", cmd_eval),
    "serve": ("serve a local model on an OpenAI-compatible /v1/completions endpoint", cmd_serve),
    "serve-env": (
        "serve an env over the OpenEnv protocol (WebSocket sessions, its tools as MCP tools)",
        cmd_serve_env,
    ),
    "sft": ("warm-start a model by supervised fine-tuning on the env's oracle demonstrations", cmd_sft),
    "rft": (
        "rejection-sampling fine-tuning: sample episodes, keep those scoring >= --threshold, fine-tune on them; repeat",
        cmd_rft,
    ),
    "train": (
        "train a model on an env with GRPO (TRL): `envkit train --help` for envkit's flags, --help-all for TRL's too",
        _cmd_train,
    ),
    "view": ("write one self-contained HTML page to look at the episodes of an `envkit eval --out` file", cmd_view),
    "init": ("start a new env: a working module, its tests and a README snippet", cmd_init),
    "model": (
        "get a model folder offline: `envkit model tiny DIR` (random, seconds) or `envkit model smollm2 DIR` (real)",
        cmd_model,
    ),
}


TASK_SEED_COMMANDS = ("play", "validate", "eval", "sft", "rft")
"""Commands whose ``--seed`` is a task seed (gymnasium's ``reset(seed=...)`` refuses negative ones)."""


def add_config_flag(parser: argparse.ArgumentParser) -> None:
    """``--config FILE.yaml``: the command's options as YAML (:mod:`envkit.util.options`; applied in :func:`main`)."""
    parser.add_argument(
        "--config",
        metavar="FILE.yaml",
        help="YAML file of this command's options (keys: flag names, e.g. seed: 3); the command line wins. "
        "(A JSON object here is the deprecated form of --env-config.)",
    )


def add_env_selection(parser: argparse.ArgumentParser, *, positional: bool = True) -> None:
    """ENV, --env-config, and the seed-style flags --rl-env-module/--rl-env-class/--rl-env-config."""
    if positional:
        parser.add_argument("env", nargs="?", help="registered name, package.module:Class or path/to/file.py:Class")
    parser.add_argument("--rl-env-module", help="module of a seed-style or envkit env class")
    parser.add_argument("--rl-env-class", help="class name in --rl-env-module")
    parser.add_argument("--env-config", help="JSON object of the env's constructor arguments")
    parser.add_argument("--rl-env-config", help="JSON object of constructor arguments (seed-style alias: --env-config)")


class CommandLineParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose mistakes are one line: :meth:`error` raises :class:`UsageError` naming the
    command's ``--help`` (:func:`main` prints it and returns 2) instead of printing the usage block and exiting the
    process. The subcommands' parsers are of this class too (``add_subparsers`` makes its parsers of the parent's
    class)."""

    def error(self, message: str) -> NoReturn:
        """Raise :class:`UsageError`: ``message (see PROG --help)``."""
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for all subcommands."""
    from envkit.util.options import AppendReplacingDefault

    parser = CommandLineParser(
        prog="envkit",
        description="Environments for multi-turn, tool-using LLM agents: validate, roll out, evaluate, train.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    listing = sub.add_parser("list", help=COMMANDS["list"][0], description=COMMANDS["list"][0])
    listing.add_argument("--names", action="store_true", help="only the names, one per line")
    add_play_parser(sub, COMMANDS["play"][0], add_env_selection, add_config_flag)
    validate = sub.add_parser("validate", help=COMMANDS["validate"][0], description=COMMANDS["validate"][0])
    add_env_selection(validate)
    validate.add_argument(
        "--episodes",
        type=int,
        default=ENV_ONLY_DEFAULTS["episodes"],
        help=f"seeds to check (default {ENV_ONLY_DEFAULTS['episodes']})",
    )
    validate.add_argument(
        "--seed", type=int, default=ENV_ONLY_DEFAULTS["seed"], help=f"first seed (default {ENV_ONLY_DEFAULTS['seed']})"
    )
    add_config_flag(validate)
    validate.add_argument(
        "--call-timeout",
        type=float,
        default=ENV_ONLY_DEFAULTS["call_timeout"],
        help="seconds one constructor/reset/step/score/oracle call may take before the env counts as hung "
        f"(default {ENV_ONLY_DEFAULTS['call_timeout']:g})",
    )
    validate.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="local tokenizer folder (the model's) whose chat template renders the opening prompt and every "
        "transcript played (default: envkit's bundled ChatML template)",
    )
    validate.add_argument("--json", action="store_true", help="print the report as JSON")
    validate.add_argument("--verbose", action="store_true", help="details of every finding; tracebacks on errors")

    evaluate = sub.add_parser("eval", help=COMMANDS["eval"][0], description=COMMANDS["eval"][0])
    add_env_selection(evaluate)
    add_config_flag(evaluate)
    evaluate.add_argument(
        "--model", required=True, help="local model folder (or the served model's name with a remote --backend)"
    )
    evaluate.add_argument("--tokenizer", help="tokenizer folder (default: --model)")
    from envkit.backends.registry import backend_names, backend_spec

    evaluate.add_argument(
        "--backend",
        choices=backend_names(),
        default="transformers",
        help="; ".join(f"{name}: {backend_spec(name).summary}" for name in backend_names()),
    )
    evaluate.add_argument(
        "--base-url",
        action=AppendReplacingDefault,  # the command line's servers replace a --config file's list
        help="the server of a remote --backend, e.g. http://127.0.0.1:8000 ($OPENAI_API_KEY is sent when set); "
        "several servers: repeat the flag or give a comma-separated list (each request goes to the least busy one, "
        "failed requests are retried)",
    )
    evaluate.add_argument("--served-model-name", help="model name the server knows (default: --model)")
    evaluate.add_argument("--tasks", type=int, default=32, help="task seeds to evaluate (default 32)")
    evaluate.add_argument("--samples", type=int, default=1, help="episodes per task, k of pass@k (default 1)")
    evaluate.add_argument("--seed", type=int, default=0, help="first task seed; also seeds sampling (default 0)")
    evaluate.add_argument("--out", help="write one JSON line per episode here, as each finishes")
    add_rollout_flags(evaluate)
    evaluate.add_argument(
        "--max-completion-tokens",
        type=int,
        help="cap on one episode's completion tokens (model + env tokens after the prompt), as envkit train's flag: "
        "evaluate a trained model under the budget it trained with (default: none)",
    )
    evaluate.add_argument(
        "--max-error-rate",
        type=float,
        default=0.5,
        help="exit 1, naming the first error, when more than this fraction of episodes failed (env raised or timed "
        "out, generation failed), as envkit train stops (default 0.5; 1 never fails)",
    )
    evaluate.add_argument("--json", action="store_true", help="print the metrics as JSON")
    add_torch_threads_flag(evaluate)

    sft = sub.add_parser("sft", help=COMMANDS["sft"][0], description=COMMANDS["sft"][0])
    add_env_selection(sft)
    add_config_flag(sft)
    sft.add_argument("--model", required=True, help="local model folder to fine-tune")
    sft.add_argument("--output-dir", required=True, help="where to save the fine-tuned model")
    sft.add_argument("--episodes", type=int, default=64, help="oracle episodes (task seeds) to learn from")
    sft.add_argument("--seed", type=int, default=0, help="first task seed (default 0)")
    sft.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    sft.add_argument("--learning-rate", type=float, default=3e-3, help="(default 3e-3, for tiny models)")
    sft.add_argument("--batch-size", type=int, default=8)
    add_torch_threads_flag(sft)
    add_rft_parser(sub, COMMANDS["rft"][0], add_env_selection, add_config_flag)
    # train's flags (envkit's TrainArguments and every field of TRL's GRPOConfig, --config read by TrlParser) are
    # parsed by envkit.adapters.trl.config: this parser hands them over as they are (train_argv), --help included.
    sub.add_parser("train", help=COMMANDS["train"][0], description=COMMANDS["train"][0], add_help=False)

    serve = sub.add_parser("serve", help=COMMANDS["serve"][0], description=COMMANDS["serve"][0])
    serve.add_argument("--model", required=True, help="local model folder")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--served-model-name", help="name clients use in requests (default: --model)")
    # The limits' defaults live in envkit.serving.openai (importing it here would import torch for `envkit --help`).
    serve.add_argument("--max-body-bytes", type=int, help="largest request body read (default 8 MiB)")
    serve.add_argument("--max-n", type=int, help="most completions per prompt (n) a request may ask (default 16)")
    serve.add_argument(
        "--max-tokens-limit", type=int, help="largest max_tokens a request may ask (default: the model's context)"
    )

    serve_env = sub.add_parser("serve-env", help=COMMANDS["serve-env"][0], description=COMMANDS["serve-env"][0])
    serve_env.add_argument("env", help="registered name, package.module:Class, path/to/file.py:Class or adapter spec")
    serve_env.add_argument("--host", default="127.0.0.1")
    serve_env.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    add_config_flag(serve_env)
    serve_env.add_argument("--env-config", help="JSON object of the env's constructor arguments")
    serve_env.add_argument(
        "--rl-env-config", help="JSON object of constructor arguments (seed-style alias: --env-config)"
    )
    serve_env.add_argument(
        "--max-sessions", type=int, default=64, help="concurrent sessions, one env each (default 64)"
    )
    serve_env.add_argument(
        "--session-timeout",
        type=float,
        default=300.0,
        help="close a session whose client sent nothing for this many seconds (default 300)",
    )
    serve_env.add_argument(
        "--max-message-bytes",
        type=int,
        default=4 * 1024 * 1024,
        help="largest incoming WebSocket message or HTTP body (default 4 MiB)",
    )
    serve_env.add_argument(
        "--step-timeout",
        type=float,
        default=20.0,
        help="seconds one env call (construct, reset, a turn, the end) may take; past it the session fails and its "
        "worker process is retired: a replacement starts, and it is killed once its other sessions end (default 20)",
    )
    serve_env.add_argument(
        "--env-processes",
        type=int,
        help="worker processes the sessions' envs run in (default: --max-sessions, at most max(4, 2 x cores)); a "
        "call stuck in C also stops the other sessions on its process",
    )
    serve_env.add_argument(
        "--cpu-limit",
        type=float,
        default=60.0,
        help="CPU seconds a worker process may use past the start of its latest call before the kernel ends it "
        "(RLIMIT_CPU: even a call stuck in C holding the GIL; default 60, 0: no limit)",
    )
    serve_env.add_argument(
        "--memory-limit",
        type=float,
        default=8.0,
        help="address space of each worker process in GiB (RLIMIT_AS: past it an allocation raises MemoryError in the "
        "env; default 8, at least 1, 0: no limit)",
    )
    oracle = serve_env.add_mutually_exclusive_group()
    oracle.add_argument(
        "--expose-oracle",
        action="store_true",
        help="put the env's oracle() in the session state, where any client can read the answer: for validating the "
        "served env (envkit validate openenv:ws://...), never for training or evaluating agents (off by default)",
    )
    oracle.add_argument(
        "--no-oracle", dest="expose_oracle", action="store_false", help="do not expose the oracle (the default)"
    )

    view = sub.add_parser("view", help=COMMANDS["view"][0], description=COMMANDS["view"][0])
    view.add_argument("episodes", metavar="EPISODES.jsonl", help="episodes, one JSON line each (envkit eval --out)")
    view.add_argument("-o", "--output", metavar="OUT.html", help="the page to write (default: EPISODES.html beside it)")
    view.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="local tokenizer folder (the model's): the token view shows each token's text, not its id",
    )

    init = sub.add_parser("init", help=COMMANDS["init"][0], description=COMMANDS["init"][0])
    init.add_argument("name", metavar="NAME", help="env name: kebab-case, snake_case or CamelCase (e.g. price-check)")
    init.add_argument("--dir", metavar="D", help="folder to write into (default: ./MODULE_NAME, created if missing)")
    init.add_argument("--no-tools", action="store_true", help="a plain envkit.Env (text turns) instead of a ToolEnv")

    add_model_parser(sub, COMMANDS["model"][0])
    return parser


def add_rollout_flags(parser: argparse.ArgumentParser) -> None:
    """Sampling and episode limits shared by eval and train."""
    parser.add_argument("--max-new-tokens", type=int, default=256, help="tokens per assistant turn (default 256)")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 disables top-k (default)")
    parser.add_argument("--max-turns", type=int, help="assistant turns per episode (default: the env's max_turns)")
    parser.add_argument("--max-episode-tokens", type=int, help="cap on prompt + completion tokens per episode")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=32,
        help="episodes in flight at once, and so envs alive at once (built, not yet closed), on every "
        "--env-workers kind: an openenv:/mcp: env asks its server for at most this many sessions (default 32)",
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=60.0,
        help="seconds one env call (construct, reset, step, score) may run; past it the episode ends with "
        "finish_reason=timeout (default 60)",
    )
    parser.add_argument(
        "--generate-timeout",
        type=float,
        default=1800.0,
        help="seconds one generation may take; past it the episode ends with an error, so a hung backend or server "
        "cannot stall the run (default 1800)",
    )
    parser.add_argument(
        "--env-workers",
        default="threads",
        metavar="{threads,processes,ray}",
        help="where envs live: threads (this process, default), processes (a few worker processes, each hosting many "
        "envs: a hung step is killed, a crash ends only the episodes on that process) or ray (Ray actors, the same "
        "way; the ray extra)",
    )
    parser.add_argument(
        "--ray-address",
        help="Ray cluster for --env-workers ray, e.g. auto or ray://HOST:10001 (default: start a local Ray instance)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``envkit`` command line ``argv`` (default: ``sys.argv[1:]``) and return its exit code; the process goes
    on (the console script and ``python -m envkit.cli`` end it through :func:`console_main`).

    While a command runs, SIGTERM ends it as Ctrl-C does (:func:`envkit.util.children.sigterm_exits`): its
    ``finally:`` blocks stop what it started (vLLM servers, env workers) and it returns 143."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    from envkit.util.options import OptionsFileError, apply_options_file

    try:
        argv = apply_options_file(parser, argv)  # --config FILE.yaml: the command's options, before the real parse
        args, unknown = parser.parse_known_args(argv)
        if args.command == "train":
            args.train_argv = unknown  # train's own parser reads them
        elif unknown:
            command = f"envkit {args.command}" if args.command else "envkit"
            raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (see {command} --help)")
    except (OptionsFileError, UsageError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    console = Console()
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    seed = getattr(args, "seed", None)
    if args.command in TASK_SEED_COMMANDS and isinstance(seed, int) and seed < 0:  # else a traceback from reset()
        print(
            f"error: --seed must be 0 or more (a task seed; gymnasium refuses negative seeds), got {seed}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        with sigterm_exits():
            return COMMANDS[args.command][1](args, console)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)  # one line, never wrapped
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Terminated as terminated:
        print("terminated", file=sys.stderr)
        return int(terminated.code or 143)


def console_main() -> NoReturn:
    """Entry point of the ``envkit`` console script and of ``python -m envkit.cli``: :func:`main`, then end the
    process with its exit code. One of several ``torch.distributed`` processes (``accelerate launch -m envkit.cli
    train …``) ends through :func:`envkit.util.process_exit.exit_without_finalizing`, since a normal exit can abort
    in interpreter finalization after every result was written. A reader that stops reading (``envkit list | head``)
    ends the command quietly with 141, as Unix tools end on SIGPIPE, instead of a BrokenPipeError traceback."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the interpreter's last flush succeeds
        code = 141
    if in_several_processes():
        exit_without_finalizing(code or 0)
    sys.exit(code)


def _version() -> str:
    from envkit import __version__

    return f"envkit {__version__}"


if __name__ == "__main__":
    sys.exit(main())
