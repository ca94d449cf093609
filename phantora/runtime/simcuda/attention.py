"""The GPU's flash and memory-efficient attention kernels on the simulated device's data.

On a GPU, `F.scaled_dot_product_attention` runs ``aten._scaled_dot_product_flash_attention`` (and its
backward), and DTensor has a sharding rule for exactly those ops: a tensor-parallel attention on
DTensors runs as one flash kernel per rank on its heads. torch has that op for CUDA (and meta) only.
On a simulated-GPU tensor, tensor.py runs it as the CPU flash kernel on the data: the same values and
the same FLOPs (the compute model times the CPU op as the CUDA one), with the CUDA op's outputs.
The memory-efficient kernel (``_scaled_dot_product_efficient_attention``, which takes an additive bias) is
computed by the same CPU flash kernel, with the bias as its mask; cuda_only.py charges it as the efficient op.
Dropout is not applied to the data (the CPU flash kernel refuses dropout_p > 0): the data is computed with none, the
timed op keeps its dropout_p. So is the CPU flash op itself when a program's SDPA picks the flash kernel on the
simulated GPU (phantom_mode.py runs it; GPT-2's attention dropout of 0.1 stopped there with "Currently do not
support dropout > 0").
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
EFFICIENT = aten._scaled_dot_product_efficient_attention.default
EFFICIENT_BACKWARD = aten._scaled_dot_product_efficient_attention_backward.default
LSE_ALIGN = 32  # the efficient kernel's logsumexp rows, padded to a multiple of its 32-query tile


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
    out, logsumexp = _CPU_FLASH(query, key, value, 0.0, is_causal, scale=scale)
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
    grads = _CPU_FLASH_BACKWARD(grad_out, query, key, value, out, logsumexp, 0.0, is_causal, scale=scale)
    return grads[0], grads[1], grads[2]


def cpu_flash_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_scaled_dot_product_flash_attention_for_cpu`` on a simulated GPU's data: without dropout (module doc)."""
    return _CPU_FLASH(query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale)


def cpu_flash_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    *,
    attn_mask: torch.Tensor | None = None,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Its backward on the data, without dropout as its forward."""
    args = (grad_out, query, key, value, out, logsumexp, 0.0, is_causal)
    return _CPU_FLASH_BACKWARD(*args, attn_mask=attn_mask, scale=scale)


def efficient_forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: torch.Tensor | None,
    compute_log_sumexp: bool,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_scaled_dot_product_efficient_attention``'s outputs: (out, logsumexp padded to 32 rows or empty, seed,
    offset)."""
    mask = _bias_for_cpu(attn_bias, query)
    out, lse = _CPU_FLASH(query, key, value, 0.0, is_causal, attn_mask=mask, scale=scale)
    b, h, sq = query.size(0), query.size(1), query.size(2)
    rows = -(-sq // LSE_ALIGN) * LSE_ALIGN if compute_log_sumexp else 0
    logsumexp = torch.zeros(b, h, rows, dtype=torch.float32, device=query.device)
    if rows:
        logsumexp[..., :sq] = lse
    seed = torch.empty((), dtype=torch.int64, device=query.device)
    offset = torch.empty((), dtype=torch.int64, device=query.device)
    return out, logsumexp, seed, offset


def efficient_backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_bias: torch.Tensor | None,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    philox_seed: Any,
    philox_offset: Any,
    dropout_p: float,
    grad_input_mask: Any,
    is_causal: bool = False,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``_scaled_dot_product_efficient_attention_backward``'s gradients of query, key, value and, when
    ``grad_input_mask[3]`` asks (a bias that requires grad, which torch's choice lets the efficient kernel train),
    of the bias."""
    sq = query.size(2)
    lse = logsumexp[..., :sq].transpose(1, 2).contiguous().transpose(1, 2)  # the CPU kernel's (b, s, h) layout
    mask = _bias_for_cpu(attn_bias, query)
    grads = _CPU_FLASH_BACKWARD(grad_out, query, key, value, out, lse, 0.0, is_causal, attn_mask=mask, scale=scale)
    grad_bias = None
    if attn_bias is not None and len(grad_input_mask) > 3 and grad_input_mask[3]:
        grad_bias = _bias_grad(grad_out, query, key, value, attn_bias, out, is_causal, scale)
    return grads[0], grads[1], grads[2], grad_bias


def _bias_grad(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    bias: torch.Tensor,
    out: torch.Tensor,
    is_causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """d loss / d bias = dS = P * (dO V^T - rowsum(dO * O)), summed to the bias's (broadcast) shape; P the softmax
    of the scaled scores plus the bias (and the top-left causal mask). The seq x seq scores are materialised here,
    on the data only (uncharged), and only for a bias that trains."""
    acc = torch.float32
    s = scale if scale is not None else query.size(-1) ** -0.5
    scores = (query.to(acc) @ key.to(acc).transpose(-2, -1)) * s + bias.to(acc)
    if is_causal:
        sq, sk = query.size(-2), key.size(-2)
        hidden = torch.ones(sq, sk, dtype=torch.bool, device=query.device).triu(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    p = scores.softmax(-1)
    dp = grad_out.to(acc) @ value.to(acc).transpose(-2, -1)
    ds = p * (dp - (grad_out.to(acc) * out.to(acc)).sum(-1, keepdim=True))
    return ds.sum_to_size(bias.shape).to(bias.dtype)


def _bias_for_cpu(bias: torch.Tensor | None, query: torch.Tensor) -> torch.Tensor | None:
    """The additive bias as the CPU flash kernel takes a mask: 2-D or 4-D, in the query's dtype."""
    if bias is None:
        return None
    while bias.dim() > 4:
        bias = bias.squeeze(0)
    if bias.dim() not in (2, 4):
        bias = bias.reshape(*([1] * (4 - bias.dim())), *bias.shape)
    return bias.to(query.dtype)


KERNELS: dict[Any, Callable[..., Any]] = {
    FLASH: flash_forward,
    FLASH_BACKWARD: flash_backward,
    _CPU_FLASH: cpu_flash_forward,
    _CPU_FLASH_BACKWARD: cpu_flash_backward,
}
"""The CUDA-only ops and how they run on the data of a simulated-GPU tensor (on meta data too, so that real
and phantom mode charge the same op)."""
