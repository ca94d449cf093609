"""Features of one op call: its class, FLOPs, memory traffic and working set, from op name + shapes + dtypes.

Byte counts assume every input is read once and every output written once. With `aliased=True`
(how perfdb was recorded: operands of equal element count and dtype may share one buffer), a
buffer shared by several operands is read once.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from phantora.errors import InputError
from phantora.perfmodel.dtypes import dtype_bytes, normalize_dtype, promote
from phantora.perfmodel.gemm_layout import grid_bytes
from phantora.perfmodel.ops import base_name, canonical_op, is_inplace, op_class

Shape = tuple[int, ...]
# extra keys that help the model but do not name the call (strides and offsets: a matrix product's operand layouts)
HINT_KEYS = frozenset({"out_shapes", "out_dtypes", "tf32", "strides", "offsets"})

ELEMENTWISE_OPS = {
    "add", "sub", "rsub", "mul", "div", "pow", "neg", "abs", "exp", "exp2", "log", "log2", "log1p", "sqrt", "rsqrt",
    "sin", "cos", "sigmoid", "tanh", "relu", "gelu", "silu", "erf", "reciprocal", "sign", "clamp", "clamp_min",
    "clamp_max", "maximum", "minimum", "where", "masked_fill", "lerp", "addcmul", "addcdiv", "fmod", "remainder",
    "threshold_backward", "gelu_backward", "silu_backward", "sigmoid_backward", "tanh_backward", "native_dropout",
    "native_dropout_backward", "eq", "ne", "lt", "le", "gt", "ge", "logical_not", "logical_and", "logical_or",
    "bitwise_and", "bitwise_or", "bitwise_not", "isnan", "isinf", "nan_to_num", "floor", "ceil", "round", "trunc",
    "square", "mish", "softplus", "hardtanh", "leaky_relu", "elu", "triu", "tril", "bernoulli", "uniform",
    "normal", "exponential", "polar", "_local_scalar_dense",
}  # fmt: skip
_COMPARISONS = {"eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "logical_not", "logical_and", "logical_or"}
_MASK_OPS = {"where", "masked_fill", "native_dropout_backward"}  # their bool operand is a mask, not a value
# A fused masked softmax's mask is broadcast (causal or padding: one row or matrix for every head),
# so the GPU reads it from cache: only the value operands count as memory traffic.
_CACHED_MASK_OPS = {"_masked_softmax", "_masked_softmax_backward"}
_THREE_LIST_FOREACH = {"_foreach_addcmul", "_foreach_addcdiv"}
_FULL_REDUCE = {"sum", "mean", "amax", "amin", "max", "min", "prod", "norm", "linalg_vector_norm", "any", "all"}
# A reduction to one value of more elements than this is split across thread blocks, which costs about
# one more launch (partial results, then a final pass). Empirical: perfdb's Sum rows jump from ~1.8 us to
# ~4 us between 2 K and 8 K elements.
CROSS_BLOCK_ELEMENTS = 4096


@dataclass(frozen=True)
class OpCall:
    """One op call: canonical op name, input tensor shapes and dtypes (canonical), extra scalar arguments."""

    op: str
    shapes: tuple[Shape, ...]
    dtypes: tuple[str, ...]
    extra: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def key(self) -> tuple[str, tuple[Shape, ...], tuple[str, ...], str]:
        """Lookup key of a measured table: op, shapes, dtypes and the extra arguments (not the model
        hints in HINT_KEYS) as canonical JSON."""
        args = {k: v for k, v in self.extra.items() if k not in HINT_KEYS}
        return self.op, self.shapes, self.dtypes, json.dumps(args, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class OpFeatures:
    """What the curves need: class, FLOPs, DRAM traffic (bytes), compute dtype, working set and shape details.

    `dims` is (batch, m, n, k) for GEMMs and (batch*heads, q_len, kv_len, head_dim) for attention;
    `pairs` counts the (query, key) score pairs attention computes (after the causal mask); `bcast`
    marks an elementwise op that broadcasts a non-scalar operand (strided index math); `writes` is the
    part of `bytes` that is written; `grid` lists a GEMM's byte sizes that cuBLAS's fast kernels need on the
    16-byte grid (its operands' contiguous extents, leading dimensions and offsets: gemm_layout.py).
    `tensors` counts the tensors per list of a foreach op; `mixed` marks an elementwise op whose
    operands differ in dtype from its result (PyTorch's slower casting path).
    """

    op_class: str
    flops: int
    bytes: int
    dtype: str
    working_set: int = 0
    kernels: int = 1
    dims: tuple[int, ...] = ()
    tensors: int = 1
    mixed: bool = False
    op: str = ""
    pairs: int = 0
    bcast: bool = False
    writes: int = 0
    grid: tuple[int, ...] = ()


def make_call(op: str, shapes: list | tuple, dtypes: list | tuple, extra: dict | None = None) -> OpCall:
    """Validate and normalise user arguments into an OpCall (InputError on bad shapes or dtypes)."""
    if len(shapes) != len(dtypes):
        raise InputError(f"{op}: {len(shapes)} shapes but {len(dtypes)} dtypes", field="dtypes")
    norm_shapes = []
    for s in shapes:
        try:
            shape = tuple(int(d) for d in s)
        except (TypeError, ValueError):
            raise InputError(f"{op}: shape {s!r} is not a list of integers", field="shapes") from None
        if any(d < 0 for d in shape):
            raise InputError(f"{op}: negative dimension in shape {list(shape)}", field="shapes")
        norm_shapes.append(shape)
    norm_dtypes = tuple(normalize_dtype(d) for d in dtypes)
    return OpCall(canonical_op(op), tuple(norm_shapes), norm_dtypes, dict(extra or {}))


def numel(shape: Shape) -> int:
    return math.prod(shape)


def nbytes(shape: Shape, dtype: str) -> int:
    return numel(shape) * dtype_bytes(dtype)


def compute_features(call: OpCall, *, aliased: bool = False) -> OpFeatures:
    """Features of `call`. Raises InputError when the shapes do not fit the op."""
    cls = op_class(call.op)
    if cls == "gemm":
        return _gemm(call)
    if cls in ("attention_fwd", "attention_bwd"):
        return _attention(call, cls)
    if cls == "noop":
        return OpFeatures("noop", 0, 0, _first_dtype(call), op=call.op)
    if cls in ("memcpy_h2d", "memcpy_d2h"):
        n = sum(nbytes(s, d) for s, d in zip(call.shapes, call.dtypes, strict=True))
        return OpFeatures(cls, 0, n, "uint8", working_set=n, op=call.op, writes=n)
    if cls == "foreach":
        return _foreach(call, aliased)
    return _memory_bound(call, cls, aliased)


def _first_dtype(call: OpCall) -> str:
    return call.dtypes[0] if call.dtypes else "float32"


def _bad(call: OpCall, why: str) -> InputError:
    shapes = [list(s) for s in call.shapes]
    return InputError(f"{call.op}: {why} (shapes {shapes})", field="shapes")


# ---------------------------------------------------------------- GEMM


def gemm_dims(call: OpCall) -> tuple[int, int, int, int, int]:
    """(batch, m, n, k, extra_read_elements) of a matrix-product op; extra reads are bias/C operands."""
    base = base_name(call.op)
    s = call.shapes
    try:
        if base in ("mm", "_scaled_mm"):
            (m, k), (k2, n) = s[0], s[1]
            return _check_k(call, 1, m, n, k, k2, 0)
        if base == "addmm":
            (m, k), (k2, n) = s[1], s[2]
            return _check_k(call, 1, m, n, k, k2, numel(s[0]))
        if base == "bmm":
            (b, m, k), (b2, k2, n) = s[0], s[1]
            if b != b2:
                raise _bad(call, "batch sizes differ")
            return _check_k(call, b, m, n, k, k2, 0)
        if base == "baddbmm":
            (b, m, k), (_, k2, n) = s[1], s[2]
            return _check_k(call, b, m, n, k, k2, numel(s[0]))
        if base == "linear":
            x, w = s[0], s[1]
            n, k = w
            return _check_k(call, 1, numel(x[:-1]), n, x[-1], k, numel(s[2]) if len(s) > 2 else 0)
        if base in ("mv", "addmv"):
            a, v = (s[0], s[1]) if base == "mv" else (s[1], s[2])
            (m, k), (k2,) = a, v
            return _check_k(call, 1, m, 1, k, k2, numel(s[0]) if base == "addmv" else 0)
        if base == "dot":
            (k,), (k2,) = s[0], s[1]
            return _check_k(call, 1, 1, 1, k, k2, 0)
        if base == "matmul":
            return _matmul_dims(call, s[0], s[1])
        if base in _GROUPED:
            g, m, n, k, _ = grouped_mm_dims(call, grouped_operands(base, s))
            return g, m, n, k, 0
    except (ValueError, IndexError, TypeError):
        raise _bad(call, "shapes do not fit a matrix product") from None
    raise _bad(call, "not a matrix product")


_GROUPED = ("_grouped_mm", "_scaled_grouped_mm")


def grouped_operands(base: str, s: Sequence[Shape]) -> list[Shape]:
    """`_grouped_mm`'s shapes [a, b, offs?] of grouped product `base`'s: `_scaled_grouped_mm(a, b, scale_a, scale_b,
    offs?, ...)` (fp8 operands, their scales read beside them) has its `offs` after the two scales."""
    if base == "_scaled_grouped_mm":
        return [*s[:2], *s[4:5]]
    return list(s)


def grouped_mm_dims(call: OpCall, s: Sequence[Shape]) -> tuple[int, int, int, int, int]:
    """(groups, m, n, k, FLOPs) of `_grouped_mm(mat_a, mat_b, offs)`: its G products as G equal ones (m, n, k the
    mean group's, rounded up) and the FLOPs of all of them. The four forms of torch's meta function
    (`_create_grouped_mm_output_tensor`): 2-D x 3-D (an MoE forward: a's rows split by `offs` among b's G
    matrices), 3-D x 3-D (a batched product), 2-D x 2-D (the weight gradient: the shared k split by `offs`, one
    [m, n] output a group) and 3-D x 2-D (b's columns split by `offs`)."""
    a, b = s[0], s[1]
    offs = s[2] if len(s) > 2 and len(s[2]) == 1 else None
    if len(a) == 2 and len(b) == 3:
        (rows, k), (g, k2, n) = a, b
        _check_k(call, g, rows, n, k, k2, 0)
        return g, -(-rows // max(g, 1)), n, k, 2 * rows * k * n
    if len(a) == 3 and len(b) == 3:
        (g, m, k), (g2, k2, n) = a, b
        if g != g2:
            raise _bad(call, "group counts differ")
        _check_k(call, g, m, n, k, k2, 0)
        return g, m, n, k, 2 * g * m * n * k
    if offs is None:
        raise _bad(call, "a 2-D operand needs `offs`")
    g = offs[0]
    if len(a) == 2 and len(b) == 2:
        (m, k), (k2, n) = a, b
        _check_k(call, g, m, n, k, k2, 0)
        return g, m, n, -(-k // max(g, 1)), 2 * m * n * k
    if len(a) == 3 and len(b) == 2:
        (g2, m, k), (k2, cols) = a, b
        if g != g2:
            raise _bad(call, "group counts differ")
        _check_k(call, g, m, cols, k, k2, 0)
        return g, m, -(-cols // max(g, 1)), k, 2 * m * k * cols
    raise _bad(call, "operands must be 2-D or 3-D")


def _check_k(call: OpCall, b: int, m: int, n: int, k: int, k2: int, extra: int) -> tuple[int, int, int, int, int]:
    if k != k2:
        raise _bad(call, f"inner dimensions differ ({k} vs {k2})")
    return b, m, n, k, extra


def _matmul_dims(call: OpCall, a: Shape, b: Shape) -> tuple[int, int, int, int, int]:
    if len(a) == 0 or len(b) == 0:
        raise _bad(call, "matmul of a 0-dim tensor")
    if len(a) == 1 and len(b) == 1:
        return _check_k(call, 1, 1, 1, a[0], b[0], 0)
    if len(a) == 1:
        return _check_k(call, numel(b[:-2]), 1, b[-1], a[0], b[-2], 0)
    if len(b) == 1:
        return _check_k(call, 1, numel(a[:-1]), 1, a[-1], b[0], 0)
    if len(b) == 2:
        return _check_k(call, 1, numel(a[:-1]), b[1], a[-1], b[0], 0)
    batch = numel(np.broadcast_shapes(a[:-2], b[:-2]))
    return _check_k(call, batch, a[-2], b[-1], a[-1], b[-2], 0)


def grouped_mm_out(s: Sequence[Shape]) -> int:
    """Elements of `_grouped_mm`'s output (torch's meta function): [G, m, n] for 2-D x 2-D, [a0, n] for 2-D x 3-D,
    [m, cols] for 3-D x 2-D, [G, m, n] for 3-D x 3-D."""
    a, b = s[0], s[1]
    if len(a) == 2 and len(b) == 2:
        return s[2][0] * a[0] * b[1]
    if len(a) == 2:
        return a[0] * b[-1]
    if len(b) == 2:
        return a[1] * b[1]
    return a[0] * a[1] * b[-1]


def _gemm(call: OpCall) -> OpFeatures:
    b, m, n, k, extra = gemm_dims(call)
    base = base_name(call.op)
    ia, ib = (1, 2) if base in ("addmm", "baddbmm", "addmv") else (0, 1)
    da, db = call.dtypes[ia], call.dtypes[ib]
    if base in ("_scaled_mm", "_scaled_grouped_mm"):
        out_dtype = normalize_dtype(call.extra.get("out_dtype", "bfloat16"))
    elif base == "_grouped_mm" and call.extra.get("out_dtype"):
        out_dtype = normalize_dtype(call.extra["out_dtype"])
    else:
        out_dtype = da
    reads = nbytes(call.shapes[ia], da) + nbytes(call.shapes[ib], db) + extra * dtype_bytes(out_dtype)
    writes = b * m * n * dtype_bytes(out_dtype)
    flops = 2 * b * m * n * k + (b * m * n if extra else 0)
    if base in _GROUPED:  # the exact FLOPs and output of the ragged groups (b, m, n, k: the mean group's)
        shapes = grouped_operands(base, call.shapes)
        flops = grouped_mm_dims(call, shapes)[4]
        writes = grouped_mm_out(shapes) * dtype_bytes(out_dtype)
    grid = grid_bytes(base, call.shapes, call.dtypes, out_dtype, call.extra)
    return OpFeatures(
        "gemm", flops, reads + writes, da, reads + writes, dims=(b, m, n, k), op=call.op, writes=writes, grid=grid
    )


# ---------------------------------------------------------------- attention


def causal_pairs(q_len: int, kv_len: int) -> int:
    """(query, key) pairs a top-left causal mask keeps: row i sees keys 0..i (PyTorch's is_causal)."""
    if q_len <= kv_len:
        return q_len * (q_len + 1) // 2
    return kv_len * (kv_len + 1) // 2 + (q_len - kv_len) * kv_len


def window_pairs(q_len: int, kv_len: int, causal: bool, left: int | None, right: int | None) -> int:
    """(query, key) pairs FlashAttention's sliding window keeps: query i's diagonal key is i + kv_len - q_len (its
    masks align to the bottom right), and it sees `left` keys before it and `right` after (None or negative:
    unbounded; causal: none after)."""
    left = -1 if left is None else left
    right = -1 if right is None else right
    if causal:
        right = 0 if right < 0 else min(right, 0)
    total = 0
    for i in range(q_len):
        diag = i + kv_len - q_len
        lo = max(0, diag - left) if left >= 0 else 0
        hi = min(kv_len - 1, diag + right) if right >= 0 else kv_len - 1
        total += max(0, hi - lo + 1)
    return total


def _windowed(call: OpCall) -> bool:
    """Does the call carry a sliding window (FlashAttention's `window_size_left` / `_right`, one of them >= 0)?"""
    return any((v := call.extra.get(k)) is not None and v >= 0 for k in ("window_left", "window_right"))


def _attention(call: OpCall, cls: str) -> OpFeatures:
    base = base_name(call.op)
    first = 1 if cls == "attention_bwd" else 0  # backward: grad_out comes first
    try:
        q, k, v = call.shapes[first : first + 3]
        if base.startswith(("_flash_attention", "_efficient_attention")):  # (batch, seq, heads, dim)
            (bq, sq, h, d), (_, sk, _, _), (_, _, _, dv) = q, k, v
        else:  # (batch, heads, seq, dim)
            (bq, h, sq, d), (_, _, sk, _), (_, _, _, dv) = q, k, v
    except (ValueError, IndexError):
        raise _bad(call, "attention needs 4-D query, key and value") from None
    causal = bool(call.extra.get("causal"))
    if "pairs" in call.extra:  # a batch-head's pairs given (a FlexAttention block mask's: runtime/flex_blocks.py)
        pairs = call.extra["pairs"]
        if not isinstance(pairs, int) or not 0 <= pairs <= sq * sk:
            raise InputError(f"{call.op}: pairs {pairs!r} is not an integer in [0, {sq} x {sk}]", field="pairs")
    elif _windowed(call):
        pairs = window_pairs(sq, sk, causal, call.extra.get("window_left"), call.extra.get("window_right"))
    else:
        pairs = causal_pairs(sq, sk) if causal else sq * sk
    bh = bq * h
    if cls == "attention_fwd":
        flops = 2 * bh * pairs * (d + dv)
        out = bh * sq * dv * dtype_bytes(call.dtypes[first]) + bh * sq * 4  # output + fp32 logsumexp
        traffic = sum(nbytes(s, t) for s, t in zip(call.shapes[:3], call.dtypes[:3], strict=True)) + out
    else:
        flops = 2 * bh * pairs * (3 * d + 2 * dv)  # recompute QK^T, then dV, dP, dQ, dK
        reads = sum(nbytes(s, t) for s, t in zip(call.shapes[:6], call.dtypes[:6], strict=True))
        writes = sum(nbytes(s, t) for s, t in zip(call.shapes[1:4], call.dtypes[1:4], strict=True))
        traffic = reads + writes
    dims = (bh, sq, sk, d)
    return OpFeatures(cls, flops, traffic, call.dtypes[first], traffic, dims=dims, op=call.op, pairs=bh * pairs)


# ---------------------------------------------------------------- memory-bound ops


def _unique_bytes(tensors: list[tuple[Shape, str]], aliased: bool) -> int:
    """Bytes of distinct buffers: with aliasing, operands of equal element count and dtype are one buffer."""
    if not aliased:
        return sum(nbytes(s, d) for s, d in tensors)
    seen = {(numel(s), d) for s, d in tensors}
    return sum(n * dtype_bytes(d) for n, d in seen)


# nll_loss (cross-entropy's second half) touches one element a row. PyTorch's CUDA kernels
# (aten/src/ATen/native/cuda/Loss.cu): the forward reads each row's target and the input element it
# names; the backward zero-fills its [N, C] output (`grad_input.zero_()`), then writes one element a
# row. Neither reads the [N, C] input, which the backward takes only for its shape.
_NLL_FORWARD = frozenset({"nll_loss_forward", "nll_loss2d_forward"})
_NLL_BACKWARD = frozenset({"nll_loss_backward", "nll_loss2d_backward"})


def _nll_loss(call: OpCall, base: str) -> OpFeatures:
    """Features of nll_loss: the forward a gather of one element a row, the backward a fill of its output."""
    first = 0 if base in _NLL_FORWARD else 1  # the backward's grad_output comes first
    if len(call.shapes) < first + 2:
        raise _bad(call, "nll_loss needs (input, target)")
    shape, dtype = call.shapes[first], call.dtypes[first]
    rows = numel(call.shapes[first + 1])  # one target a row (a pixel for nll_loss2d)
    gathered = rows * (dtype_bytes(dtype) + dtype_bytes(call.dtypes[first + 1]))
    if base in _NLL_FORWARD:
        outs = _out_override(call) or [((), dtype), ((), dtype)]  # the loss and total_weight (reduced)
        writes = sum(nbytes(s, d) for s, d in outs)
        return OpFeatures("reduction", rows, gathered + writes, dtype, gathered + writes, op=call.op, writes=writes)
    writes = nbytes(shape, dtype)
    return OpFeatures("fill", numel(shape), writes + gathered, dtype, writes, kernels=2, op=call.op, writes=writes)


def _out_override(call: OpCall) -> list[tuple[Shape, str]] | None:
    shapes = call.extra.get("out_shapes")
    if shapes is None:
        return None
    dtypes = call.extra.get("out_dtypes") or [_first_dtype(call)] * len(shapes)
    if len(dtypes) != len(shapes):
        raise InputError(f"{call.op}: out_shapes and out_dtypes differ in length", field="out_dtypes")
    return [(tuple(int(x) for x in s), normalize_dtype(d)) for s, d in zip(shapes, dtypes, strict=True)]


def _memory_bound(call: OpCall, cls: str, aliased: bool) -> OpFeatures:
    base = base_name(call.op)
    if base in _NLL_FORWARD or base in _NLL_BACKWARD:
        return _nll_loss(call, base)
    stem = base.rstrip("_") if is_inplace(base) else base
    ins = list(zip(call.shapes, call.dtypes, strict=True))
    if not ins and _out_override(call) is None:
        return OpFeatures(cls, 0, 0, "float32", op=call.op)  # nothing known but the launch
    kernels, mixed, dtype = 1, False, _first_dtype(call)
    outs = _out_override(call)
    if outs is None:
        outs, mixed, dtype = _default_outputs(call, cls, stem, ins)
    if base == "native_dropout" and (call.extra.get("p", 0.5) == 0 or call.extra.get("train", True) is False):
        return OpFeatures("noop", 0, 0, dtype, op=call.op)
    read_ins = [] if cls == "fill" else ins[1:] if base == "copy_" else ins  # a fill only writes; copy_ skips dst
    if base in _CACHED_MASK_OPS:
        read_ins = [(s, d) for s, d in ins if d != "bool"]
    reads = _unique_bytes(read_ins, aliased)
    writes = sum(nbytes(s, d) for s, d in outs)
    working = reads if is_inplace(base) and read_ins and base != "copy_" else reads + writes
    if stem == "masked_fill" and not is_inplace(base):
        kernels = 2  # PyTorch clones, then fills in place: the clone adds a read and a write
        reads += nbytes(*ins[0])
        writes += nbytes(*ins[0])
    if cls == "reduction" and base in _FULL_REDUCE and sum(numel(s) for s, _ in outs) <= 1 and ins:
        if numel(ins[0][0]) > CROSS_BLOCK_ELEMENTS:
            kernels = 2  # reduced across several blocks: partial sums, then a final pass
    flops = max((numel(s) for s, _ in outs), default=0)
    bcast = cls == "elementwise" and any(0 < numel(s) < flops and len(s) > 0 for s, _ in ins)
    return OpFeatures(
        cls, flops, reads + writes, dtype, working, kernels, mixed=mixed, op=call.op, bcast=bcast, writes=writes
    )


def _default_outputs(
    call: OpCall, cls: str, stem: str, ins: list[tuple[Shape, str]]
) -> tuple[list[tuple[Shape, str]], bool, str]:
    """Outputs (shape, dtype) implied by the op, whether operands are cast, and the result dtype."""
    base = base_name(call.op)
    first_shape, first_dtype = ins[0]
    if cls == "fill":
        dtype = normalize_dtype(call.extra.get("dtype", first_dtype))
        return [(first_shape, dtype)], False, dtype
    if cls == "copy":
        return _copy_outputs(call, base, ins)
    if cls == "reduction":
        return _reduction_outputs(call, base, ins)
    # elementwise
    if is_inplace(base):
        out = [(first_shape, first_dtype)]
        values = [d for (s, d) in ins if not (stem in _MASK_OPS and d == "bool")]
        return out, any(d != first_dtype for d in values), first_dtype
    try:
        shape = tuple(np.broadcast_shapes(*[s for s, _ in ins]))
    except ValueError:
        if stem in ELEMENTWISE_OPS:
            raise _bad(call, "operands do not broadcast") from None
        shape = max((s for s, _ in ins), key=numel)  # an op without its own rule: assume the largest input
    value_ins = [(s, d) for s, d in ins if not (stem in _MASK_OPS and d == "bool")] or ins
    dtype = promote([d for _, d in value_ins], [len(s) for s, _ in value_ins])
    mixed = any(d != dtype for _, d in value_ins)
    out_dtype = "bool" if stem in _COMPARISONS else dtype
    outs = [(shape, out_dtype)]
    if base == "native_dropout":
        outs.append((shape, "bool"))  # the mask
    return outs, mixed, dtype


def _copy_outputs(call: OpCall, base: str, ins: list[tuple[Shape, str]]) -> tuple[list, bool, str]:
    shape, dtype = ins[0]
    if base == "_to_copy":
        to = normalize_dtype(call.extra.get("dtype", dtype))
        return [(shape, to)], False, dtype
    if base == "copy_":
        if len(ins) < 2:
            raise _bad(call, "copy_ needs (dst, src)")
        return [(shape, dtype)], False, dtype
    if base in ("cat", "stack"):
        return [((sum(numel(s) for s, _ in ins),), dtype)], False, dtype
    if base == "embedding":
        if len(ins) < 2 or len(shape) != 2:
            raise _bad(call, "embedding needs (weight[V, D], indices)")
        rows = numel(ins[1][0])
        return [((rows, shape[1]), dtype)], False, dtype
    return [(shape, dtype)], False, dtype


def _reduction_outputs(call: OpCall, base: str, ins: list[tuple[Shape, str]]) -> tuple[list, bool, str]:
    shape, dtype = ins[0]
    if base in ("_softmax", "_log_softmax", "softmax", "log_softmax"):
        out = "float32" if call.extra.get("half_to_float") else dtype
        return [(shape, out)], False, dtype
    if base in ("_softmax_backward_data", "_log_softmax_backward_data"):
        out = normalize_dtype(call.extra.get("input_dtype", dtype))
        return [(shape, out)], False, dtype
    if base in _CACHED_MASK_OPS:
        return [(shape, dtype)], False, dtype
    if base in ("native_layer_norm", "_fused_rms_norm"):
        feat = numel(ins[1][0]) if len(ins) > 1 else shape[-1] if shape else 1
        rows = numel(shape) // max(feat, 1)
        stats = 2 if base == "native_layer_norm" else 1
        return [(shape, dtype), ((rows * stats,), "float32")], False, dtype
    if base in ("native_layer_norm_backward", "_fused_rms_norm_backward"):
        outs = [(shape, dtype)] + [(s, d) for s, d in ins[5:7] if len(s) > 0]
        return outs, False, dtype
    return [((), dtype)], False, dtype


def _foreach(call: OpCall, aliased: bool) -> OpFeatures:
    base = base_name(call.op)
    stem = base.rstrip("_")
    total = len(call.shapes)
    n = call.extra.get("list_len")
    if n is None:
        n = total // 3 if stem in _THREE_LIST_FOREACH and total % 3 == 0 else total
    n = int(n)
    if n <= 0 or n > total:
        raise InputError(f"{call.op}: {total} tensors do not make lists of {n}", field="list_len")
    lists = total // n  # tensors after the lists (e.g. a 0-dim scalar tensor) are read once
    ins = list(zip(call.shapes, call.dtypes, strict=True))
    reads = _unique_bytes(ins[lists * n :], aliased)
    writes = 0
    for i in range(n):
        group = [ins[j * n + i] for j in range(lists)]
        reads += _unique_bytes(group, aliased)
        if stem != "_foreach_norm":
            writes += nbytes(*group[0])
    if stem == "_foreach_norm":
        writes = 4 * n
    working = _unique_bytes(ins, aliased) + (0 if is_inplace(base) else writes)
    dtype = call.dtypes[0] if call.dtypes else "float32"
    flops = sum(numel(s) for s, _ in ins[:n])
    return OpFeatures("foreach", flops, reads + writes, dtype, working, tensors=n, op=call.op, writes=writes)
