"""``envkit rft``: rejection-sampling fine-tuning from the command line (:mod:`envkit.adapters.trl.rft`).

Each round samples ``--episodes-per-round`` episodes of ENV (``--samples-per-task`` per task seed, new task seeds
each round from ``--seed``), keeps those scoring at least ``--threshold`` and fine-tunes ``--model`` on them for
``--steps-per-round`` steps with ``envkit sft``'s masked SFT; the model and tokenizer go to ``--output-dir`` (with
``rft_rounds.json``), as ``envkit sft`` saves them. ``--resume`` goes on from the last round a cut run finished (its
checkpoint in ``--output-dir``). Sampling runs on the model being trained (``--backend
transformers``, on-policy) or on a served model (``--backend openai --base-url URL``: rejection sampling from a
teacher).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console

from envkit.cli.commands import (
    EXIT_FAIL,
    EXIT_OK,
    UsageError,
    build_env,
    check_counts,
    check_max_error_rate,
    load_local_model,
    output_folder,
    resolve_cli_target,
    sampling_from_flags,
    set_torch_threads,
)


def add_rft_parser(sub: Any, help_text: str, add_env_selection: Any, add_config_flag: Any) -> None:
    """``envkit rft``'s parser, under the ``envkit`` subparsers ``sub``."""
    from envkit.util.threads import add_torch_threads_flag

    rft = sub.add_parser("rft", help=help_text, description=help_text)
    add_env_selection(rft)
    add_config_flag(rft)
    rft.add_argument("--model", required=True, help="local model folder to fine-tune")
    rft.add_argument("--output-dir", required=True, help="where to save the fine-tuned model")
    rft.add_argument("--rounds", type=int, default=4, help="sample-filter-fine-tune rounds (default 4)")
    rft.add_argument("--episodes-per-round", type=int, default=64, help="episodes sampled per round (default 64)")
    rft.add_argument("--samples-per-task", type=int, default=4, help="episodes per task seed (default 4)")
    rft.add_argument("--threshold", type=float, default=1.0, help="keep episodes scoring at least this (default 1.0)")
    rft.add_argument("--steps-per-round", type=int, default=50, help="optimizer steps per round (default 50)")
    rft.add_argument("--learning-rate", type=float, default=5e-4, help="(default 5e-4, constant)")
    rft.add_argument("--batch-size", type=int, default=8)
    rft.add_argument(
        "--accumulate",
        action="store_true",
        help="fine-tune on every episode kept so far (expert iteration), not only this round's",
    )
    rft.add_argument("--seed", type=int, default=0, help="first task seed; also seeds sampling and training")
    rft.add_argument("--temperature", type=float, default=1.0)
    rft.add_argument("--max-new-tokens", type=int, default=256, help="tokens per assistant turn (default 256)")
    rft.add_argument("--max-turns", type=int, help="assistant turns per episode (default: the env's max_turns)")
    rft.add_argument("--max-completion-tokens", type=int, help="cap on one episode's completion tokens")
    rft.add_argument(
        "--backend",
        choices=["transformers", "openai"],
        default="transformers",
        help="who samples: the model being trained (transformers, default) or a served model (openai)",
    )
    rft.add_argument("--base-url", help="OpenAI-compatible server of --backend openai, e.g. http://127.0.0.1:8000")
    rft.add_argument("--served-model-name", help="model name the server knows (default: --model)")
    rft.add_argument(
        "--max-error-rate",
        type=float,
        default=0.5,
        help="stop, naming the round and the first error, when more than this fraction of a round's episodes failed "
        "(env raised or timed out, generation failed), as envkit train stops (default 0.5; 1 never stops)",
    )
    rft.add_argument(
        "--resume",
        action="store_true",
        help="go on from the last round finished in --output-dir (a cut run's; same flags), or start at round 1",
    )
    add_torch_threads_flag(rft)


def cmd_rft(args: argparse.Namespace, console: Console) -> int:
    """Rejection-sampling fine-tuning of a local model on an env."""
    from envkit.adapters.trl.metrics import ErrorRateExceeded
    from envkit.adapters.trl.rft import RFTConfigError, check_settings, rejection_sampling_fine_tune, resume_point
    from envkit.backends import BackendError
    from envkit.chat.render import TemplateError

    cls, config, target = resolve_cli_target(args)
    build_env(cls, config)
    check_counts(
        {
            "--max-new-tokens": args.max_new_tokens,
            "--max-turns": args.max_turns,
            "--max-completion-tokens": args.max_completion_tokens,
        }
    )
    check_max_error_rate(args.max_error_rate)
    sampling = sampling_from_flags(temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=args.seed)
    tasks_per_round = max(1, args.episodes_per_round // max(1, args.samples_per_task))
    seeds = list(range(args.seed, args.seed + args.rounds * tasks_per_round))
    try:  # before the model loads: a bad flag costs a second, not a minute
        check_settings(
            seeds=seeds or [args.seed],
            rounds=args.rounds,
            episodes_per_round=args.episodes_per_round,
            samples_per_task=args.samples_per_task,
            steps_per_round=args.steps_per_round,
            threshold=args.threshold,
            learning_rate=args.learning_rate,
            batch_size=args.batch_size,
            seed=args.seed,
        )
        if args.resume:
            resume_point(args.output_dir)
    except RFTConfigError as error:
        raise UsageError(str(error)) from None
    backend_factory = _backend_factory(args)
    set_torch_threads(args, console)
    output_folder(args.output_dir, "--output-dir", model=args.model)
    tokenizer, model = load_local_model(args.model)
    try:
        records = rejection_sampling_fine_tune(
            model,
            tokenizer,
            lambda: cls(**config),
            seeds=seeds,
            output_dir=args.output_dir,
            rounds=args.rounds,
            episodes_per_round=args.episodes_per_round,
            samples_per_task=args.samples_per_task,
            threshold=args.threshold,
            steps_per_round=args.steps_per_round,
            learning_rate=args.learning_rate,
            batch_size=args.batch_size,
            accumulate=args.accumulate,
            sampling=sampling,
            max_turns=args.max_turns,
            max_completion_tokens=args.max_completion_tokens,
            backend_factory=backend_factory,
            seed=args.seed,
            progress=True,
            log=lambda text: console.print(text, highlight=False, soft_wrap=True),
            resume=args.resume,
            max_error_rate=args.max_error_rate,
        )
    except RFTConfigError as error:
        raise UsageError(str(error)) from None
    except ErrorRateExceeded as error:  # the rounds finished before it are checkpointed: --resume goes on from there
        print(f"\nerror: {error}", file=sys.stderr)  # on a line of its own: the sampling bar may be mid-line
        return EXIT_FAIL
    except (BackendError, TemplateError) as error:
        raise UsageError(str(error)) from None
    kept, sampled, failed = sum(r.kept for r in records), records[-1].env_episodes, sum(r.failed for r in records)
    failures = f", {failed} failed" if failed else ""
    console.print(
        f"rft on {target}: {len(records)} rounds, kept {kept} of {sampled} episodes (score >= {args.threshold:g}"
        f"{failures}); saved to {args.output_dir}",
        soft_wrap=True,
        highlight=False,
    )
    if not kept:
        console.print(
            f"warning: no episode scored {args.threshold:g} or more, so the model was not fine-tuned: warm-start it "
            "first (envkit sft) or lower --threshold",
            soft_wrap=True,
            highlight=False,
        )
        return EXIT_FAIL
    return EXIT_OK


def _backend_factory(args: argparse.Namespace) -> Any:
    """None (the trained model samples itself) or a factory of the served model's backend (``--backend openai``)."""
    if args.backend != "openai":
        for flag, value in (("--base-url", args.base_url), ("--served-model-name", args.served_model_name)):
            if value:
                raise UsageError(f"{flag} is for --backend openai (the default backend samples from --model itself)")
        return None
    from envkit.backends import BackendError, OpenAIBackend
    from envkit.backends.openai import parse_base_urls

    if not args.base_url:
        raise UsageError("--backend openai needs --base-url (e.g. http://127.0.0.1:8000)")
    try:
        backend = OpenAIBackend(parse_base_urls(args.base_url), args.served_model_name or args.model)
        backend.check()
    except (ValueError, BackendError) as error:
        raise UsageError(f"--base-url: {error}") from None
    return lambda _model: backend
