"""Tensor-core GEMMs whose operands are off the 16-byte grid: cuBLAS's unaligned kernels.

cuBLAS's fast tensor-core kernels load every operand row with 16-byte vector loads, so each operand's contiguous
extent, leading dimension and base pointer must be a multiple of 16 bytes (8 bf16/fp16 elements, 4 TF32, 16 fp8):
cuBLAS docs 2.1.11 "Tensor Core Usage". Which sizes those are depends on how the operands lie in memory
(gemm_layout.py, as `OpFeatures.grid`): for a linear layer, its hidden sizes (k and n), never its token count. A GEMM
with one of them off the grid (GPT-2's vocabulary of 50,257, say, in the output layer's forward and both gradients)
runs an `align1`/`align2` kernel instead: element-wise loads, slower at the same shape. The curves are fitted on
aligned shapes only (every GEMM row of perfdb and of the public data is aligned), so an unaligned GEMM gets their time
divided by UNALIGNED_EFF.

UNALIGNED_EFF is a published per-kernel measurement: pytorch/pytorch issue #181718 (2026-04-28) times
bf16 square matmuls on an RTX 4090 (Ada, the L40S's architecture) with the kernel each one ran; the
aligned N=2040 (`ampere_bf16_s1688gemm_bf16_128x128_ldg8...`) at 155.9 TFLOP/s against the four
odd N's that ran `cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1` (2055, 2057, 2071, 2073:
115.6, 106.8, 110.9, 112.0 TFLOP/s), mean 111.3: 0.714 of the aligned rate.

Products with m or n = 1 are matrix-vector kernels, which do not use the tensor-core tiles: never penalised. Plain
fp32 (no TF32) runs SIMT kernels, whose loads do not need 16 bytes: never penalised.
"""

from __future__ import annotations

from phantora.perfmodel.dtypes import dtype_bytes
from phantora.perfmodel.features import OpFeatures

VECTOR_BYTES = 16  # the width of the tensor-core kernels' global loads
UNALIGNED_EFF = 111.3 / 155.9  # pytorch#181718: align1 kernels' mean TFLOP/s / the aligned kernel's
_TENSOR_CORE_16BIT = frozenset({"bfloat16", "float16"})


def grid_elements(dtype: str, tf32: bool = False) -> int:
    """Elements in VECTOR_BYTES for a tensor-core GEMM of `dtype` (0: the GEMM does not run on tensor cores)."""
    if dtype in _TENSOR_CORE_16BIT or dtype.startswith("float8"):
        return VECTOR_BYTES // dtype_bytes(dtype)
    if dtype == "float32" and tf32:
        return VECTOR_BYTES // 4
    return 0


def is_unaligned_gemm(f: OpFeatures, tf32: bool = False) -> bool:
    """True for a tensor-core GEMM (class gemm, m and n > 1) with an operand's contiguous extent, leading dimension
    or offset (`f.grid`, bytes) not a multiple of 16 bytes."""
    if f.op_class != "gemm" or len(f.dims) != 4:
        return False
    _, m, n, _ = f.dims
    if grid_elements(f.dtype, tf32) == 0 or m <= 1 or n <= 1:
        return False
    return any(b % VECTOR_BYTES for b in f.grid)


def unaligned_factor(f: OpFeatures, tf32: bool = False) -> float:
    """Time multiplier of a GEMM: 1 / UNALIGNED_EFF when it runs an unaligned kernel, else 1."""
    return 1.0 / UNALIGNED_EFF if is_unaligned_gemm(f, tf32) else 1.0
