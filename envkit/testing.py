"""Small local models and tokenizers for tests, demos and benchmarks — built in seconds, nothing downloaded.

* :func:`build_tokenizer`, :func:`build_tiny_model` (from :mod:`envkit.models.tiny`, the runtime home of the tiny
  builder behind ``envkit model tiny``).
* :func:`load_shared_tokenizer` loads a real tokenizer from ``../shared/tokenizers`` when that folder exists.
* :func:`write_tiny_model` saves a tokenizer and a tiny model to a folder (``python -m envkit.testing``), optionally
  on the real Qwen2.5 tokenizer from ``../shared``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from envkit.models import tiny as tiny_model
from envkit.models.tiny import ADDED_TOKENS, SPECIAL_TOKENS, build_tiny_model, build_tokenizer

__all__ = [
    "ADDED_TOKENS",
    "SPECIAL_TOKENS",
    "build_tiny_model",
    "build_tokenizer",
    "load_shared_tokenizer",
    "shared_tokenizer_dir",
    "write_tiny_model",
]


def shared_tokenizer_dir(name: str) -> Path | None:
    """``../shared/tokenizers/<name>`` beside the checkout (or under ``$ENVKIT_SHARED_DIR``), if present."""
    roots = [
        os.environ.get("ENVKIT_SHARED_DIR"),
        Path(__file__).resolve().parents[3] / "shared",
        Path.cwd().parent / "shared",
    ]
    for root in filter(None, roots):
        path = Path(root) / "tokenizers" / name
        if (path / "tokenizer_config.json").is_file():
            return path
    return None


def load_shared_tokenizer(name: str = "qwen2.5-instruct") -> Any | None:
    """The real tokenizer ``name`` (``"qwen2.5-instruct"`` or ``"qwen3"``) from ``../shared``, or ``None``."""
    path = shared_tokenizer_dir(name)
    if path is None:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def write_tiny_model(
    out: str | Path,
    *,
    env: str | None = None,
    env_config: dict[str, Any] | None = None,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    shared_tokenizer: bool = False,
) -> tuple[Any, Any]:
    """:func:`envkit.models.tiny.write_tiny_model`, with ``shared_tokenizer`` the real Qwen2.5 tokenizer from
    ``../shared`` (``FileNotFoundError`` when it is absent)."""
    tokenizer = None
    if shared_tokenizer:
        tokenizer = load_shared_tokenizer()
        if tokenizer is None:
            raise FileNotFoundError("../shared/tokenizers/qwen2.5-instruct not found")
    return tiny_model.write_tiny_model(
        out,
        env=env,
        env_config=env_config,
        hidden_size=hidden_size,
        num_layers=num_layers,
        seed=seed,
        tokenizer=tokenizer,
    )


def main(argv: list[str] | None = None) -> None:
    """``python -m envkit.testing --out DIR [--env NAME --config JSON]``: save a tokenizer and tiny model to DIR.

    :func:`write_tiny_model` from the command line; ``envkit model tiny DIR`` is the documented form.
    """
    import argparse
    import json

    parser = argparse.ArgumentParser(prog="python -m envkit.testing", description=main.__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to save the model and tokenizer in")
    parser.add_argument("--env", help="env whose texts the tokenizer learns from (registered name or module:Class)")
    parser.add_argument(
        "--env-config", "--config", dest="config", default="{}", help="JSON constructor arguments of --env"
    )
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--shared-tokenizer", action="store_true", help="use ../shared's real Qwen2.5 tokenizer")
    args = parser.parse_args(argv)
    try:
        model, tokenizer = write_tiny_model(
            args.out,
            env=args.env,
            env_config=json.loads(args.config),
            hidden_size=args.hidden_size,
            num_layers=args.layers,
            seed=args.seed,
            shared_tokenizer=args.shared_tokenizer,
        )
    except FileNotFoundError as error:
        raise SystemExit(f"error: {error}") from None
    size = sum(p.numel() for p in model.parameters())
    print(f"saved a {size:,}-parameter Qwen2 model and its tokenizer ({len(tokenizer)} tokens) to {args.out}")


if __name__ == "__main__":
    main()
