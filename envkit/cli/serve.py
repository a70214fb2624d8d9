"""``envkit serve`` (a local model over an OpenAI-compatible ``/v1/completions`` endpoint) and ``envkit serve-env``
(an envkit env over the OpenEnv protocol), each until interrupted."""

from __future__ import annotations

import argparse
import math
import sys

from rich.console import Console

from envkit.cli.commands import EXIT_OK, UsageError, check_counts, env_config_from_args, load_local_model
from envkit.util.install import install_command

MIN_MEMORY_LIMIT_GIB = 1.0
"""The smallest nonzero ``serve-env --memory-limit``: with 0.5 GiB of address space a worker process could not start
its threads (a ``MemoryError`` in a thread) and the server never came up, nor said why."""


def check_port(port: int) -> None:
    """Refuse, in one line, a ``--port`` that is no TCP port (0 picks a free one)."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port} is not a TCP port (0-65535; 0 picks a free one)")


def cmd_serve(args: argparse.Namespace, console: Console) -> int:
    """Serve a local model over an OpenAI-compatible /v1/completions endpoint until interrupted."""
    from envkit.serving.openai import make_server

    limits = {"max_body_bytes": args.max_body_bytes, "max_n": args.max_n, "max_tokens_limit": args.max_tokens_limit}
    check_counts({f"--{name.replace('_', '-')}": value for name, value in limits.items()})
    check_port(args.port)  # before the model loads (socketserver raised OverflowError after)
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
    check_port(args.port)
    if not args.step_timeout > 0:
        raise UsageError("--step-timeout must be a positive number of seconds")
    if args.env_processes is not None and args.env_processes < 1:
        raise UsageError("--env-processes must be at least 1")
    if not (0 <= args.cpu_limit < math.inf):  # inf, NaN: a worker's OverflowError / ValueError traceback
        raise UsageError(f"--cpu-limit must be 0 (no limit) or a number of CPU seconds, got {args.cpu_limit:g}")
    if not (args.memory_limit == 0 or MIN_MEMORY_LIMIT_GIB <= args.memory_limit < math.inf):
        raise UsageError(
            f"--memory-limit must be 0 (no limit) or at least {MIN_MEMORY_LIMIT_GIB:g} GiB (a worker's Python and the "
            f"env's imports take address space first; below it a worker could not start), got {args.memory_limit:g}"
        )
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
