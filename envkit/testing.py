"""Small local models and tokenizers for tests, demos and benchmarks — built in seconds, nothing downloaded.

* :func:`build_tokenizer` trains a byte-level BPE tokenizer with ChatML special tokens and envkit's bundled
  tool-calling template (so everything runs in a clone without the real Qwen tokenizer files).
* :func:`load_shared_tokenizer` loads a real tokenizer from ``../shared/tokenizers`` when that folder exists.
* :func:`build_tiny_model` makes a randomly initialised Qwen2-architecture causal LM for a tokenizer.
* :func:`write_tiny_model` saves both to a folder (``envkit model tiny DIR``, or ``python -m envkit.testing``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>"]

_CORPUS = [
    "You are a helpful assistant. Use the tools to answer the user's question.",
    "The quick brown fox jumps over the lazy dog. 0123456789 + - * / = ( ) [ ] { } , . ; : ! ?",
    '{"name": "calculator", "arguments": {"expression": "12 * (3 + 4)"}}',
    '{"type": "function", "function": {"name": "search_hotels", "description": "Search hotels.", "parameters": '
    '{"type": "object", "properties": {"city": {"type": "string", "description": "City name"}}, '
    '"required": ["city"]}}}',
    "Hotel booking: check-in 2026-05-01, check-out 2026-05-04, 2 guests, double room, price per night 120 EUR.",
    "Error: invalid arguments for book_room: missing required argument 'hotel_id'. Available tools: none",
    "What is the capital of France? The capital is Paris. Guess a number between 1 and 100: higher, lower, correct.",
]


def shared_tokenizer_dir(name: str) -> Path | None:
    """``../shared/tokenizers/<name>`` beside the checkout (or under ``$ENVKIT_SHARED_DIR``), if present."""
    roots = [
        os.environ.get("ENVKIT_SHARED_DIR"),
        Path(__file__).resolve().parents[2] / "shared",
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


def build_tokenizer(
    save_dir: str | Path | None = None, *, vocab_size: int = 1024, extra_corpus: Iterable[str] = ()
) -> Any:
    """Train a small byte-level BPE chat tokenizer (ChatML specials, bundled tool template) in about a second.

    It splits text like Qwen2's tokenizer (same normalizer and pre-tokenizer, so numbers become single digits), so
    the ids are the same whether the saved files load as a plain fast tokenizer or, next to a Qwen2 model config, as
    a ``Qwen2Tokenizer``. With ``save_dir`` the tokenizer is saved there and reloaded.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    from envkit.chat import bundled_template

    backend = Tokenizer(models.BPE())
    # Exactly Qwen2's normalizer and pre-tokenizer: saved next to a Qwen2 model config, AutoTokenizer loads the files
    # as a Qwen2Tokenizer, which rebuilds these two; any other choice would change the token ids on reload.
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator([*_CORPUS, *extra_corpus] * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    tokenizer.add_tokens(ADDED_TOKENS)
    tokenizer.chat_template = bundled_template()
    if save_dir is not None:
        tokenizer.save_pretrained(str(save_dir))
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(save_dir))
    return tokenizer


def build_tiny_model(
    tokenizer: Any,
    save_dir: str | Path | None = None,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    max_position_embeddings: int = 4096,
    num_heads: int = 2,
    num_kv_heads: int = 1,
) -> Any:
    """A randomly initialised Qwen2-architecture causal LM sized to ``tokenizer`` (float32, eval mode).

    With the real Qwen vocabulary (151k tokens) the defaults give ~9.7M parameters; with :func:`build_tokenizer`'s,
    ~0.2M. With ``save_dir`` the model (and the tokenizer) are saved there for ``from_pretrained``.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True
    )
    if save_dir is not None:
        model.save_pretrained(str(save_dir))
        tokenizer.save_pretrained(str(save_dir))
    return model


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
    """Save a tokenizer and a tiny random Qwen2 model to ``out``; return ``(model, tokenizer)``.

    The tokenizer's BPE is trained on envkit's corpus plus the opening messages of 200 tasks of ``env`` (a registered
    name or ``module:Class``, built with ``env_config``), so the env's words are short token sequences; with
    ``shared_tokenizer`` the real Qwen2.5 tokenizer from ``../shared`` is used instead (``FileNotFoundError`` when it
    is absent). Unknown envs raise :class:`envkit.EnvSpecError`.
    """
    corpus: list[str] = []
    if env:
        import envkit

        instance = envkit.make(env, **(env_config or {}))
        corpus = [str(m.get("content") or "") for task in range(200) for m in instance.reset(seed=task)[0]]
    tokenizer = load_shared_tokenizer() if shared_tokenizer else build_tokenizer(extra_corpus=corpus)
    if tokenizer is None:
        raise FileNotFoundError("../shared/tokenizers/qwen2.5-instruct not found")
    model = build_tiny_model(tokenizer, out, hidden_size=hidden_size, num_layers=num_layers, seed=seed)
    return model, tokenizer


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
