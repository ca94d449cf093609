"""Op names: normalisation of aten names, the op-class of each op, and perfdb's names for the same ops."""

from __future__ import annotations

# Op classes, each with its own efficiency curve (see curves.py).
CLASSES = (
    "gemm",
    "attention_fwd",
    "attention_bwd",
    "elementwise",
    "reduction",
    "copy",
    "fill",
    "foreach",
    "memcpy_h2d",
    "memcpy_d2h",
    "noop",
)

# `_grouped_mm`: one kernel of G matrix products (an MoE layer's experts), timed as a batched product (features.py);
# `_scaled_grouped_mm` the same of fp8 operands with their scales
GEMM_OPS = {
    "mm",
    "addmm",
    "bmm",
    "baddbmm",
    "matmul",
    "linear",
    "_scaled_mm",
    "_grouped_mm",
    "_scaled_grouped_mm",
    "mv",
    "addmv",
    "dot",
}
ATTN_FWD_OPS = {
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_for_cpu",  # what a CPU (phantom) run dispatches to; same FLOPs
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward",
    "_efficient_attention_forward",
    "scaled_dot_product_attention",
}
ATTN_BWD_OPS = {f"{op}_backward" for op in ATTN_FWD_OPS}
REDUCTION_OPS = {
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "argmax",
    "argmin",
    "prod",
    "norm",
    "linalg_vector_norm",
    "var",
    "std",
    "var_mean",
    "std_mean",
    "any",
    "all",
    "cumsum",
    "_softmax",
    "_log_softmax",
    "softmax",
    "log_softmax",
    "_softmax_backward_data",
    "_log_softmax_backward_data",
    "_masked_softmax",
    "_masked_softmax_backward",
    "native_layer_norm",
    "native_layer_norm_backward",
    "_fused_rms_norm",
    "_fused_rms_norm_backward",
    "nll_loss_forward",
    "nll_loss_backward",
    "nll_loss2d_forward",
    "nll_loss2d_backward",
}
COPY_OPS = {
    "_to_copy",
    "copy_",
    "clone",
    "contiguous",
    "cat",
    "stack",
    "index_select",
    "gather",
    "embedding",
    "embedding_dense_backward",
    "index",
    "index_put_",
    "scatter",
    "scatter_add",
    "scatter_add_",
    "_unsafe_index",
    "repeat",
    "memcpy_d2d",
}
FILL_OPS = {"zeros_like", "ones_like", "full_like", "zeros", "ones", "full", "zero_", "fill_", "new_zeros", "new_full"}
# Metadata-only ops: no kernel runs.
VIEW_OPS = {
    "view",
    "_unsafe_view",
    "reshape",
    "t",
    "transpose",
    "permute",
    "expand",
    "slice",
    "select",
    "as_strided",
    "detach",
    "alias",
    "split",
    "split_with_sizes",
    "unsqueeze",
    "squeeze",
    "unbind",
    "chunk",
    "narrow",
    "view_as_real",
    "view_as_complex",
    "empty",
    "empty_like",
    "empty_strided",
    "lift_fresh",
    "_reshape_alias",
    "unflatten",
    "flatten",
}
HOST_COPY = {"memcpy_h2d": "memcpy_h2d", "memcpy_d2h": "memcpy_d2h"}

# perfdb op name -> aten op it measures (l40s/compute.csv); memcpy.csv kinds map to phantora::memcpy_*.
PERFDB_OPS = {
    "MM": "mm",
    "MatMul": "matmul",
    "BMM": "bmm",
    "BAddBMM": "baddbmm",
    "Linear": "linear",
    "SDPA": "_scaled_dot_product_flash_attention",
    "SDPABackward": "_scaled_dot_product_flash_attention_backward",
    "Softmax": "_softmax",
    "SoftmaxBackward": "_softmax_backward_data",
    "Sum": "sum",
    "Add": "add",
    "Add_": "add_",
    "Mul": "mul",
    "Mul_": "mul_",
    "MulScalar": "mul",
    "Div": "div",
    "DivScalar": "div",
    "Pow": "pow",
    "Where": "where",
    "WhereScalar": "where",
    "MaskedFill": "masked_fill",
    "MaskedFill_": "masked_fill_",
    "Dropout": "native_dropout",
    "NativeDropoutBackward": "native_dropout_backward",
    "ConvDType": "_to_copy",
    "ZerosLike": "zeros_like",
    "ForeachMulScalar_": "_foreach_mul_",
    "ForeachAddCMul_": "_foreach_addcmul_",
    "ForeachAddCDiv_": "_foreach_addcdiv_",
}
MEMCPY_KINDS = {"HostToDevice": "memcpy_h2d", "DeviceToHost": "memcpy_d2h", "DeviceToDevice": "memcpy_d2d"}


def base_name(op: str) -> str:
    """'aten::add_.Tensor', 'aten.add_.Tensor', 'add_' -> 'add_' (namespace and overload dropped)."""
    name = str(op).strip()
    for sep in ("::", "."):
        ns, found, rest = name.partition(sep)
        if found and ns in ("aten", "prims", "phantora", "torch", "c10d", "_c10d_functional"):
            name = rest
            break
    return name.split(".", 1)[0]


def canonical_op(op: str) -> str:
    """The lookup name of an op: 'aten::<base>' ('phantora::memcpy_*' for host copies)."""
    base = base_name(op)
    if base.startswith("memcpy_"):
        return f"phantora::{base}"
    return f"aten::{base}"


# Ops that run another op's kernel (so share its measured per-op factors): the fused masked softmax
# is a softmax kernel that skips masked elements.
SAME_KERNEL_AS = {
    "aten::_masked_softmax": "aten::_softmax",
    "aten::_masked_softmax_backward": "aten::_softmax_backward_data",
}


def is_efficient_attention(op: str) -> bool:
    """Is `op` the memory-efficient attention kernel (forward or backward)?"""
    return base_name(op).startswith(("_scaled_dot_product_efficient_attention", "_efficient_attention"))


def is_inplace(base: str) -> bool:
    """In-place aten ops end in a single underscore ('add_', '_foreach_mul_'), not '__and__'."""
    return base.endswith("_") and not base.endswith("__")


def op_class(op: str) -> str:
    """The op class of an aten op name. Unknown ops are treated as elementwise (memory-bound)."""
    base = base_name(op)
    if base in GEMM_OPS:
        return "gemm"
    if base in ATTN_FWD_OPS:
        return "attention_fwd"
    if base in ATTN_BWD_OPS:
        return "attention_bwd"
    if base.startswith("_foreach_"):
        return "foreach"
    if base in HOST_COPY:
        return HOST_COPY[base]
    if base in VIEW_OPS:
        return "noop"
    if base in REDUCTION_OPS:
        return "reduction"
    if base in COPY_OPS:
        return "copy"
    if base in FILL_OPS:
        return "fill"
    return "elementwise"
