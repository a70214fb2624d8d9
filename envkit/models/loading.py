"""Load a local model and tokenizer for ``envkit eval`` / ``serve`` / ``train``, with errors a user can act on."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class ModelLoadError(ValueError):
    """The model or tokenizer cannot be loaded; the message says why."""


def load_tokenizer(path: str) -> Any:
    """The tokenizer saved at ``path`` (a local folder; hub ids work where a hub is reachable)."""
    from transformers import AutoTokenizer

    _check_path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as error:
        raise ModelLoadError(f"cannot load a tokenizer from {_where(path)}: {_why(error)}") from None
    if not tokenizer.chat_template:
        raise ModelLoadError(f"the tokenizer at {path} has no chat template; envkit renders conversations with it")
    return tokenizer


def load_model(path: str, *, dtype: str = "float32") -> Any:
    """The causal LM saved at ``path``, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    _check_path(path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except Exception as error:
        raise ModelLoadError(f"cannot load a model from {_where(path)}: {_why(error)}") from None
    return model.eval()


def _where(path: str) -> str:
    """``path`` as the error names it: a name that is no folder here was looked up as a hub id."""
    return path if Path(path).expanduser().is_dir() else f"{path} (no such folder here; tried as a hub model id)"


def _why(error: Exception) -> str:
    """What ``from_pretrained`` raised, on one line (its messages run over several)."""
    from envkit.util.text import one_line

    return one_line(f"{type(error).__name__}: {error}", 300)


def _check_path(path: str) -> None:
    looks_local = path.startswith((".", "/", "~")) or Path(path).exists() or path.count("/") != 1
    if looks_local and not Path(path).expanduser().is_dir():
        raise ModelLoadError(f"model folder not found: {path}")


def check_saved_tokenizer(tokenizer: Any, path: str, sample: str) -> None:
    """Raise :class:`ModelLoadError` when the tokenizer saved at ``path`` encodes ``sample`` unlike ``tokenizer``.

    ``AutoTokenizer`` may load saved files as a model-specific class (next to a Qwen2 config, a ``Qwen2Tokenizer``
    that rebuilds Qwen's own pre-tokenizer), so a model trained with one tokenizer object could be trained on and
    evaluated with different ids after a reload — silently. This check makes that loud.
    """
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(path)
    before = tokenizer(sample, add_special_tokens=False)["input_ids"]
    after = reloaded(sample, add_special_tokens=False)["input_ids"]
    if before != after:
        at = next(
            (i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b), min(len(before), len(after))
        )
        pieces = [
            tokenizer.convert_ids_to_tokens(before[at : at + 3]),
            reloaded.convert_ids_to_tokens(after[at : at + 3]),
        ]
        raise ModelLoadError(
            f"the tokenizer saved to {path} reloads as {type(reloaded).__name__} and encodes text differently "
            f"(from token {at}: {pieces[0]} before saving, {pieces[1]} after), so the saved model would see other "
            "token ids than it was trained on; save a tokenizer whose normalizer and pre-tokenizer survive the reload"
        )
