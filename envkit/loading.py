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
        raise ModelLoadError(f"cannot load a tokenizer from {path}: {type(error).__name__}: {error}") from None
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
        raise ModelLoadError(f"cannot load a model from {path}: {type(error).__name__}: {error}") from None
    return model.eval()


def _check_path(path: str) -> None:
    looks_local = path.startswith((".", "/", "~")) or Path(path).exists() or path.count("/") != 1
    if looks_local and not Path(path).expanduser().is_dir():
        raise ModelLoadError(f"model folder not found: {path}")
