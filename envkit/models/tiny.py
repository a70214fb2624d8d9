"""Tiny local models and tokenizers, built in seconds with nothing downloaded: ``envkit model tiny DIR``.

* :func:`build_tokenizer` trains a byte-level BPE tokenizer with ChatML special tokens and envkit's bundled
  tool-calling template.
* :func:`build_tiny_model` makes a randomly initialised Qwen2-architecture causal LM for a tokenizer.
* :func:`write_tiny_model` saves both to a folder.

They have learned nothing: for trying the pipeline end to end (and for envkit's tests, demos and benchmarks, which
reach them through the test helpers), not for results.
"""

from __future__ import annotations

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

    from envkit.chat.render import bundled_template

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
    tokenizer: Any = None,
) -> tuple[Any, Any]:
    """Save a tokenizer and a tiny random Qwen2 model to ``out``; return ``(model, tokenizer)``.

    The tokenizer's BPE is trained on envkit's corpus plus the opening messages of 200 tasks of ``env`` (a registered
    name or ``module:Class``, built with ``env_config``), so the env's words are short token sequences; a given
    ``tokenizer`` is used as it is instead. Unknown envs raise :class:`envkit.EnvSpecError`.
    """
    if tokenizer is None:
        corpus: list[str] = []
        if env:
            from envkit.registry import make

            instance = make(env, **(env_config or {}))
            corpus = [str(m.get("content") or "") for task in range(200) for m in instance.reset(seed=task)[0]]
        tokenizer = build_tokenizer(extra_corpus=corpus)
    model = build_tiny_model(tokenizer, out, hidden_size=hidden_size, num_layers=num_layers, seed=seed)
    return model, tokenizer
