"""The GPU's flash-attention kernels on the simulated device's data.

On a GPU, `F.scaled_dot_product_attention` runs ``aten._scaled_dot_product_flash_attention`` (and its
backward), and DTensor has a sharding rule for exactly those ops: a tensor-parallel attention on
DTensors runs as one flash kernel per rank on its heads. torch has that op for CUDA (and meta) only.
On a simulated-GPU tensor, tensor.py runs it as the CPU flash kernel on the data: the same values and
the same FLOPs (the compute model times the CPU op as the CUDA one), with the CUDA op's outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

aten = torch.ops.aten
FLASH = aten._scaled_dot_product_flash_attention.default
FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_backward.default
_CPU_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
_CPU_FLASH_BACKWARD = aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def flash_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
) -> tuple[Any, ...]:
    """``_scaled_dot_product_flash_attention``'s nine outputs, computed by the CPU flash kernel."""
    out, logsumexp = _CPU_FLASH(query, key, value, dropout_p, is_causal, scale=scale)
    seed = torch.empty(2, dtype=torch.uint64, device=query.device)  # Philox seed and offset: no dropout state
    offset = torch.empty((), dtype=torch.uint64, device=query.device)
    debug_mask = torch.empty(0, dtype=query.dtype, device=query.device)
    return out, logsumexp, None, None, query.size(2), key.size(2), seed, offset, debug_mask


def flash_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    cum_seq_q: Any,
    cum_seq_k: Any,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    philox_seed: Any,
    philox_offset: Any,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_scaled_dot_product_flash_attention_backward``'s gradients, computed by the CPU flash kernel."""
    grads = _CPU_FLASH_BACKWARD(grad_out, query, key, value, out, logsumexp, dropout_p, is_causal, scale=scale)
    return grads[0], grads[1], grads[2]


KERNELS: dict[Any, Callable[..., Any]] = {FLASH: flash_forward, FLASH_BACKWARD: flash_backward}
"""The CUDA-only ops and how they run on the data of a simulated-GPU tensor (on meta data too, so that real
and phantom mode charge the same op)."""
