"""LoRA on a vLLM-CPU server at the cost of a matrix product: grouped kernels for vLLM's CPU punica ops.

vLLM-CPU (0.32) applies LoRA with PyTorch ops that gather one adapter matrix **per token**
(``lora_weights[token_lora_indices]``, then a batched matrix-vector product): a prefill of 24,000 tokens copies
24,000 rank × hidden matrices for every adapted layer. On the tiny models envkit trains on CPU this made a server
serving an adapter 2.3× slower than the same server serving the base model (2,270 vs 5,150 tokens/s,
``benchmarks/async_training.py``'s server with one core). The kernels here compute the same products per adapter
instead: the rows that name one adapter times that adapter's matrix, one matrix product per adapter in the batch
(usually one, two or three versions in flight). Rows with index ``-1`` (no adapter) get nothing added, which is what
the index means; vLLM-CPU's own ops read it as the last adapter slot (a base request batched with adapter requests
got another adapter's output: the mixing bug envkit avoids by never sending base traffic to a LoRA server).

It runs where the model runs, in vLLM's worker process: envkit starts its CPU servers with
``--worker-extension-cls envkit.adapters.vllm.cpu_lora.GroupedLoraKernels``, vLLM imports that class in every
worker, and the import installs the kernels (:func:`install`). The server's Python needs envkit installed.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from envkit.adapters.vllm.servers import GROUPED_LORA_LINE

_GATHERING_OPS = ("bgmv_shrink", "bgmv_expand", "bgmv_expand_slice", "sgmv_shrink", "sgmv_expand", "sgmv_expand_slice")


def _per_adapter(
    inputs: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``out[t] = inputs[t] @ weights[indices[t]].T`` for every row ``t`` (zero where ``indices[t] == -1``), one
    matrix product per distinct adapter instead of one gathered matrix per row."""
    inputs = inputs.to(dtype=dtype)
    rows = indices.shape[0]
    if rows == 0:
        return inputs.new_zeros((0, weights.shape[-2]))
    first = int(indices[0])
    if bool((indices == first).all()):
        if first < 0:
            return inputs.new_zeros((rows, weights.shape[-2]))
        matrix = weights[first].reshape(weights.shape[-2], weights.shape[-1]).to(dtype=dtype)
        return inputs[:rows] @ matrix.T
    out = inputs.new_zeros((rows, weights.shape[-2]))
    for index in torch.unique(indices).tolist():
        if index < 0:
            continue
        where = (indices == index).nonzero().squeeze(1)
        matrix = weights[index].reshape(weights.shape[-2], weights.shape[-1]).to(dtype=dtype)
        out[where] = inputs[where] @ matrix.T
    return out


def bgmv_shrink(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    scaling: float = 1.0,
) -> None:
    """vLLM's ``bgmv_shrink`` (``output[:, :r] = scaling * inputs @ A.T`` per row's adapter), grouped."""
    outputs = _per_adapter(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs


def bgmv_expand(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand`` (``output (+)= inputs @ B.T`` per row's adapter), grouped; vLLM's row and width
    handling kept as it is."""
    outputs = _per_adapter(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common_len = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_expand_slice(
    inputs: torch.Tensor,
    lora_b_weights: torch.Tensor,
    output_tensor: torch.Tensor,
    lora_indices_tensor: torch.Tensor,
    slice_offset: int,
    slice_size: int,
    add_inputs: bool = True,
) -> None:
    """vLLM's ``bgmv_expand_slice`` (the expand into ``output[:, offset:offset + size]``), grouped."""
    outputs = _per_adapter(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs


def _per_sequence(bgmv: Callable[..., None], name: str) -> Callable[..., None]:
    """vLLM's ``sgmv_*`` form of ``bgmv`` (prefill): adapter indices per sequence, expanded to rows; vLLM's
    positional arguments (``b_seq_start_loc, seq_len_tensor, lora_indices_tensor, batches, max_seq_length,
    token_nums``, then ``bgmv``'s own)."""

    def sgmv(
        inputs: torch.Tensor,
        weights: torch.Tensor,
        output_tensor: torch.Tensor,
        b_seq_start_loc: torch.Tensor,
        seq_len_tensor: torch.Tensor,
        lora_indices_tensor: torch.Tensor,
        batches: int,
        max_seq_length: int,
        token_nums: int,
        *rest: Any,
    ) -> None:
        rows = torch.repeat_interleave(lora_indices_tensor, seq_len_tensor)
        bgmv(inputs, weights, output_tensor, rows, *rest)

    sgmv.__name__ = sgmv.__qualname__ = name
    sgmv.__doc__ = f"vLLM's ``{name}``, grouped (see :func:`{bgmv.__name__}`)."
    return sgmv


sgmv_shrink = _per_sequence(bgmv_shrink, "sgmv_shrink")
sgmv_expand = _per_sequence(bgmv_expand, "sgmv_expand")
sgmv_expand_slice = _per_sequence(bgmv_expand_slice, "sgmv_expand_slice")


def install() -> bool:
    """Put these kernels in place of vLLM-CPU's LoRA ops in this process; ``False`` (nothing changed) where vLLM has
    no CPU punica wrapper or its ops are not the ones these replace (:func:`install_problem` says which)."""
    if install_problem() is not None:
        return False
    from vllm.lora.punica_wrapper import punica_cpu

    for name in _GATHERING_OPS:
        setattr(punica_cpu, name, globals()[name])
    return True


def install_problem() -> str | None:
    """Why :func:`install` cannot replace this vLLM's LoRA ops (``None``: it can)."""
    try:
        from vllm.lora.ops import torch_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except ImportError as error:
        return f"this vLLM has no CPU LoRA ops to replace ({error})"
    missing = [name for name in _GATHERING_OPS if not (hasattr(torch_ops, name) and hasattr(punica_cpu, name))]
    if missing:
        return f"this vLLM's CPU LoRA wrapper does not use the ops these replace (missing: {', '.join(missing)})"
    return None


INSTALLED = install()
"""Whether importing this module (in a vLLM worker: see the module docstring) replaced vLLM-CPU's LoRA ops."""
if INSTALLED:
    print(f"{GROUPED_LORA_LINE} (pid {os.getpid()})", file=sys.stderr, flush=True)
elif importlib.util.find_spec("vllm") is not None:
    # A vLLM worker's log says why; LocalServers reads the missing line back and notes it in the run's log. Without
    # vLLM this is no worker (the API reference's build imports every module): nothing to say.
    print(f"envkit: grouped LoRA kernels NOT installed: {install_problem()}", file=sys.stderr, flush=True)


class GroupedLoraKernels:
    """vLLM worker extension (``--worker-extension-cls``) whose import installs the grouped kernels.

    It adds one method to the worker, reachable through vLLM's ``collective_rpc``: whether the kernels are in place.
    """

    def envkit_grouped_lora(self) -> bool:
        """Whether this worker runs the grouped kernels."""
        from vllm.lora.punica_wrapper import punica_cpu

        return punica_cpu.bgmv_shrink is bgmv_shrink
