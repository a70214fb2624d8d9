"""Shared fixtures: real tokenizers from ../shared (skipped when absent), a locally trained one, tiny models."""

from __future__ import annotations

from pathlib import Path

import pytest

from envkit.testing import build_tiny_model, build_tokenizer, load_shared_tokenizer

SHARED_MISSING = "../shared/tokenizers not present (a clone outside the envkit workspace): real-tokenizer test skipped"


@pytest.fixture(scope="session")
def qwen25_tokenizer():
    """The real Qwen2.5-Instruct tokenizer (151,665 tokens, the real tool-calling template)."""
    tokenizer = load_shared_tokenizer("qwen2.5-instruct")
    if tokenizer is None:
        pytest.skip(SHARED_MISSING)
    return tokenizer


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The real Qwen3 tokenizer (its template is not prefix-preserving)."""
    tokenizer = load_shared_tokenizer("qwen3")
    if tokenizer is None:
        pytest.skip(SHARED_MISSING)
    return tokenizer


@pytest.fixture(scope="session")
def local_tokenizer_dir(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer trained here, saved and reloadable (runs without ../shared)."""
    path = tmp_path_factory.mktemp("local-tokenizer")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def local_tokenizer(local_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(local_tokenizer_dir))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, local_tokenizer) -> Path:
    """A tiny random Qwen2-architecture model on the local tokenizer, saved with it."""
    path = tmp_path_factory.mktemp("tiny-model")
    build_tiny_model(local_tokenizer, path)
    return path


@pytest.fixture(params=["local", "qwen2.5"])
def any_tokenizer(request, local_tokenizer):
    """Each test using it runs on the local tokenizer and on the real Qwen2.5 one."""
    if request.param == "local":
        return local_tokenizer
    return request.getfixturevalue("qwen25_tokenizer")


@pytest.fixture(autouse=True)
def _no_progress_bar_outlives_its_test():
    """Close progress bars a test left open (e.g. a trainer that was never closed): tqdm positions every new bar
    below the open ones, so one left over moves the cursor in a later test's captured output."""
    yield
    from tqdm.std import tqdm

    for bar in list(getattr(tqdm, "_instances", ())):
        bar.close()
