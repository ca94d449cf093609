"""``aten._scaled_grouped_mm`` on the simulated GPU's data: fp8 MoE experts in one kernel (G matrix products of fp8
operands with row-wise fp32 scales, torch's CUDA-only op, which this CPU build has no kernel for).

What it computes, as torch's CUDA kernel (ScaledBlas.cpp, row-wise scaling): out[i, j] = sa[i] sb[j] sum_k a[i, k]
b[k, j] in each group, accumulated in fp32 and written as bf16 (its only output dtype). Here: the operands widened to
fp32 and scaled first (the same products up to summation order), then torch's `_grouped_mm` on the CPU. Two forms,
those of an MoE layer: 2-D a (the routed tokens' rows, split among b's G matrices by `offs`; scale_a one a row,
scale_b [G, n]) and 3-D x 3-D (a batched product; scale_a [G, m]). Others, a bias or a result scale stop in one line.
Charged as one kernel by the compute model (its FLOPs at the GPU's fp8 rate, perfmodel/features.py).
"""

from __future__ import annotations

import torch

from phantora.runtime.simcuda.devices import NotSimulatedError

OP = torch.ops.aten._scaled_grouped_mm.default


def forward(
    mat_a: torch.Tensor,
    mat_b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    offs: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    scale_result: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """The grouped product of `mat_a` and `mat_b` with their row-wise scales, in `out_dtype` (bf16)."""
    if bias is not None or scale_result is not None:
        raise NotSimulatedError("torch._scaled_grouped_mm with a bias or a result scale is not simulated")
    if mat_b.dim() != 3 or mat_a.dim() not in (2, 3):
        raise NotSimulatedError(
            f"torch._scaled_grouped_mm of a {mat_a.dim()}-D and a {mat_b.dim()}-D operand is not simulated: only an "
            "MoE layer's forms are (2-D x 3-D with offs, 3-D x 3-D)"
        )
    if mat_a.is_meta:  # phantom mode: torch's meta function gives the output
        return OP(mat_a, mat_b, scale_a, scale_b, offs, out_dtype=out_dtype, use_fast_accum=use_fast_accum)
    groups, n = mat_b.shape[0], mat_b.shape[2]
    b = mat_b.float() * scale_b.float().reshape(groups, 1, n)
    rows = mat_a.shape[:-1]
    a = mat_a.float() * scale_a.float().reshape(*rows, 1)
    return torch._grouped_mm(a, b, offs).to(out_dtype or torch.bfloat16)
