"""Which kernel `F.scaled_dot_product_attention` runs on the simulated GPU: torch's CUDA choice, made here.

A CUDA build picks the backend in ``aten/src/ATen/native/transformers/cuda/sdp_utils.cpp`` (`select_sdp_backend`):
it walks torch's priority order (flash, efficient, math, cudnn by default; `sdpa_kernel(..., set_priority=True)`
reorders it) and takes the first backend whose flag is on (`torch.backends.cuda.*_sdp_enabled`, set by the
`sdpa_kernel` / `sdp_kernel` contexts) and whose constraints hold for these inputs on this GPU. A CPU build has
no such choice for a CUDA tensor, so the simulated GPU makes it with the constraints below (from that file and
``sdp_utils_cpp.h``, dense inputs):

- all fused kernels: 4-D query, key and value; no zero sequence length; last-dim stride 1; equal batch sizes;
  equal head counts, or (flash and cudnn only: efficient is built without grouped-query support,
  `check_batch_size_and_num_heads_dense<false>`, and torch's sdpa docs say GQA runs on flash and math) with
  ``enable_gqa`` key/value heads equal and dividing the query's;
- flash: no attn_mask; equal head dims <= 256; sm80..sm121; fp16/bf16; ``is_causal`` only with equal query and
  key lengths; on sm86/89/120/121 with grad, head dim <= 192 (or > 224 without dropout);
- efficient (memory-efficient, CUTLASS): sm50..sm121; fp16/fp32 (and bf16 on sm80+); q and k head dims equal,
  q and v head dims divisible by the GEMM alignment (sm80+: 8 for 16-bit, 4 for fp32) and storage offsets aligned
  to it; masks allowed;
- cudnn: its flag; not under deterministic algorithms; fp16/bf16; sm80..sm121; dropout a multiple of 1/16;
  head dims multiples of 8 and <= 128 (the simulated toolkit's cuDNN 9.1.0); batch and heads <= 65535;
  key length != 1; a 2-D or 4-D broadcastable mask. cuDNN goes first only with cuDNN > 9.15.1 on sm90/sm100,
  which the simulated toolkit is not, so it stays last;
- math: its flag.

None allowed: torch's own errors ("No available kernel. Aborting execution." after one warning per backend, or
"No viable backend ..." when every flag is off). Nested tensors are not modelled (they take torch's own path).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch

FLASH, EFFICIENT, MATH, CUDNN = "flash", "efficient", "math", "cudnn"
_BY_ENUM = {0: MATH, 1: FLASH, 2: EFFICIENT, 3: CUDNN}  # at::SDPBackend's values (overrideable: 4, never here)
CUDNN_MAX_HEAD_DIM = 128  # cuDNN < 9.22 (sdp_utils.cpp check_cudnn_tensor_shapes)
NO_KERNEL = "No available kernel. Aborting execution."
NO_BACKEND = (
    "No viable backend for scaled_dot_product_attention was found. "
    "This is likely due to turning off both the math kernel and the fused kernels."
)


@dataclass(frozen=True)
class SdpParams:
    """The inputs torch's choice reads (`sdp::sdp_params`)."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None
    dropout: float
    is_causal: bool
    enable_gqa: bool


def choose(p: SdpParams, capability: tuple[int, int]) -> str:
    """The backend torch's CUDA build runs for `p` on a GPU of compute `capability`; raises RuntimeError with torch's
    text when none is allowed."""
    enabled = _enabled()
    if not any(enabled.values()):
        raise RuntimeError(NO_BACKEND)
    for backend in _order():
        if backend == MATH:
            if enabled[MATH]:
                return MATH
        elif enabled[backend] and not _reasons(backend, p, capability):
            return backend
    for backend, name in ((EFFICIENT, "Memory efficient"), (FLASH, "Flash attention"), (CUDNN, "cuDNN attention")):
        why = "; ".join(_reasons(backend, p, capability) or ["allowed but ranked after a disabled math"])
        if not enabled[backend]:
            why = f"{name} has been runtime disabled."
        warnings.warn(f"{name} kernel not used because: {why}", stacklevel=3)
    raise RuntimeError(NO_KERNEL)


def _enabled() -> dict[str, bool]:
    cuda = torch.backends.cuda
    return {
        FLASH: cuda.flash_sdp_enabled(),
        EFFICIENT: cuda.mem_efficient_sdp_enabled(),
        MATH: cuda.math_sdp_enabled(),
        CUDNN: cuda.cudnn_sdp_enabled(),
    }


def _order() -> list[str]:
    return [_BY_ENUM[i] for i in torch._C._get_sdp_priority_order() if i in _BY_ENUM]


def _reasons(backend: str, p: SdpParams, capability: tuple[int, int]) -> list[str]:
    """Why `backend` cannot run `p` (empty: it can)."""
    if p.query.is_nested or p.key.is_nested or p.value.is_nested:
        return ["nested tensors are not modelled"]
    if not p.query.dim() == p.key.dim() == p.value.dim() == 4:
        return ["All fused kernels requires query, key and value to be 4 dimensional"]
    out = _dense(p, ignore_singleton=backend != EFFICIENT, gqa=backend != EFFICIENT)
    if backend == FLASH:
        out += _flash(p, capability)
    elif backend == EFFICIENT:
        out += _efficient(p, capability)
    else:
        out += _cudnn(p, capability)
    return out


def _dense(p: SdpParams, *, ignore_singleton: bool, gqa: bool) -> list[str]:
    q, k, v = p.query, p.key, p.value
    out = []
    if q.size(-2) == 0 or k.size(-2) == 0:
        out.append("All fused kernels do not support zero seq_len_q or seq_len_kv.")
    strides_ok = q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1
    if not (strides_ok or (ignore_singleton and q.size(-1) == 1)):
        out.append("All fused kernels require the last dimension of the input to have stride 1.")
    if not q.size(0) == k.size(0) == v.size(0):
        out.append("For dense inputs, both fused kernels require query, key and value to have the same batch_size.")
    hq, hk, hv = q.size(-3), k.size(-3), v.size(-3)
    if p.enable_gqa and gqa:
        if hk != hv or hq % hk:
            out.append("grouped query attention needs key/value heads equal and dividing the query's")
    elif not hq == hk == hv:
        out.append("For dense input, both fused kernels require query, key and value to have the same num_heads.")
    return out


def _half(p: SdpParams, capability: tuple[int, int]) -> list[str]:
    allowed = (torch.float16, torch.bfloat16) if capability >= (8, 0) else (torch.float16,)
    return _dtypes(p, allowed)


def _dtypes(p: SdpParams, allowed: tuple[torch.dtype, ...]) -> list[str]:
    dt = p.query.dtype
    if dt == p.key.dtype == p.value.dtype and dt in allowed:
        return []
    return [f"Expected query, key and value to all be of dtype: {{{', '.join(map(str, allowed))}}}. Got {dt}"]


def _flash(p: SdpParams, capability: tuple[int, int]) -> list[str]:
    out = []
    if p.attn_mask is not None:
        out.append("Flash Attention does not support non-null attn_mask.")
    dq, dk, dv = p.query.size(-1), p.key.size(-1), p.value.size(-1)
    if not (dq == dk == dv and dq <= 256):
        out.append("Flash attention requires q,k,v to have the same last dimension and to be <= 256.")
    if not (8, 0) <= capability <= (12, 1):
        out.append("Flash attention only supports gpu architectures in the range [sm80, sm121].")
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (p.query, p.key, p.value))
    narrow = (8, 6) <= capability <= (8, 9) or (12, 0) <= capability <= (12, 1)
    if grad and narrow and not (dq <= 192 or (p.dropout == 0.0 and dq > 224)):
        out.append("Flash attention currently doesn't support training with head_dim in (192, 224] on this gpu.")
    if p.is_causal and p.query.size(-2) != p.key.size(-2):
        out.append("Flash attention does not support the is_causal flag when seqlen_q != seqlen_k.")
    return out + _half(p, capability)


def gemm_alignment(dtype: torch.dtype, capability: tuple[int, int]) -> int:
    """Elements a CUTLASS GEMM of the efficient kernel needs the head dim (and offsets) aligned to
    (sdp_utils.cpp `minimum_gemm_alignment`)."""
    half = dtype in (torch.float16, torch.bfloat16)
    tensor_cores = capability >= (8, 0) or (capability >= (7, 0) and half)
    align = 4 if capability >= (8, 0) else 1
    return max(align, 128 // (16 if half else 32)) if tensor_cores else align


def _efficient(p: SdpParams, capability: tuple[int, int]) -> list[str]:
    out = []
    if not (5, 0) <= capability <= (12, 1):
        out.append("Mem Efficient Attention only supports gpu architectures in the range [sm50, sm121].")
    align = gemm_alignment(p.query.dtype, capability)
    dq, dk, dv = p.query.size(-1), p.key.size(-1), p.value.size(-1)
    if not (dq == dk and dq % align == 0 and dq > 0 and dv % align == 0 and dv > 0):
        out.append(f"Mem efficient attention requires last dimension of inputs to be divisible by {align}.")
    offsets = [t.storage_offset() for t in (p.query, p.key, p.value) if t.numel()]
    if capability >= (8, 0) and any(o % align for o in offsets):
        out.append("Mem efficient attention on sm80 or newer requires aligned q, k, and v storage offsets.")
    allowed = (torch.float16, torch.float32, torch.bfloat16) if capability >= (8, 0) else (torch.float16, torch.float32)
    return out + _dtypes(p, allowed)


def _cudnn(p: SdpParams, capability: tuple[int, int]) -> list[str]:
    out = []
    if torch.are_deterministic_algorithms_enabled() and not torch.is_deterministic_algorithms_warn_only_enabled():
        out.append("cuDNN SDPA is not deterministic.")
    if not (8, 0) <= capability <= (12, 1):
        out.append("cuDNN MHA only supports gpu architectures in the range [sm80, sm121].")
    if p.dropout * 16.0 != int(p.dropout * 16.0):
        out.append("cuDNN dropout probability resolution is limited to 1/16.")
    if not _mask_shape_ok(p):
        out.append("Please use the 2d or 4d attn mask shapes.")
    q, k, v = p.query, p.key, p.value
    if q.size(0) > 65535 or q.size(1) > 65535:
        out.append("cuDNN SDPA does not support batch size or num_heads greater than 65535.")
    if q.size(-1) > CUDNN_MAX_HEAD_DIM or v.size(-1) > CUDNN_MAX_HEAD_DIM:
        out.append(f"head_dim should be no more than {CUDNN_MAX_HEAD_DIM}")
    if q.size(-1) % 8 or v.size(-1) % 8:
        out.append("head_dim should be a multiple of 8")
    if k.size(-2) == 1:
        out.append("cudnn SDPA does not support key/value sequence length 1.")
    if p.dropout != 0.0 and q.size(-2) == 1:
        out.append("cudnn SDPA does not support query sequence length 1 with dropout.")
    return out + _half(p, capability)


def _mask_shape_ok(p: SdpParams) -> bool:
    m = p.attn_mask
    if m is None:
        return True
    if m.requires_grad:
        return False
    b, h, sq, sk = p.query.size(0), p.query.size(1), p.query.size(2), p.key.size(2)
    if m.size(-2) not in (sq, 1) or m.size(-1) not in (sk, 1):
        return False
    return m.dim() == 2 or (m.dim() == 4 and m.size(0) in (1, b) and m.size(1) in (1, h))
