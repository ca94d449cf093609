"""Bridge from a torch dispatch call (func, args, kwargs, out) to the compute model.

`call_of` is what the runtime's default model (`phantora.runtime.compute.Calibrated`, which adds
FLOP counting, the launch overhead and a per-shape cache) uses. `CalibratedModel(gpu)` is a bare
`op_time_ns(func, args, kwargs, out) -> int` (kernel time only, no cache), for tools and tests.
Tensor arguments are taken in argument order (lists flattened, as foreach ops take them); the
scalar arguments that change an op's cost become `extra`; the actual outputs are passed as
`out_shapes`/`out_dtypes` for memory-bound ops, a matrix product's operands' `strides` and `offsets` for GEMMs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from phantora.perfmodel.curves import Curves
from phantora.perfmodel.features import OpCall, make_call
from phantora.perfmodel.gpus import GpuSpec
from phantora.perfmodel.model import ComputeModel
from phantora.perfmodel.ops import op_class
from phantora.perfmodel.table import TimingTable

_MEMORY = {"elementwise", "reduction", "copy", "fill"}
# schema argument -> extra key, for the arguments that change what an op costs
_SCALARS = {
    "is_causal": "causal",
    "p": "p",
    "train": "train",
    "half_to_float": "half_to_float",
    "input_dtype": "input_dtype",
    "out_dtype": "out_dtype",
    "window_size_left": "window_left",  # FlashAttention's sliding window (simcuda/varlen.py passes it)
    "window_size_right": "window_right",
    "kept_pairs": "pairs",  # the (query, key) pairs a FlexAttention block mask keeps (runtime/flex_blocks.py)
    "flash_kernel": "kernel",  # "fa3": FlashAttention-3's forward (simcuda/varlen.py passes it), its own public fit
}


def _named_args(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    schema = getattr(func, "_schema", None)
    if schema is None:
        return dict(kwargs)
    named = {a.name: v for a, v in zip(schema.arguments, args, strict=False)}
    named.update(kwargs)
    return named


def _dtype_name(d: Any) -> str:
    return str(d).removeprefix("torch.")


def call_of(func: Any, args: tuple, kwargs: dict, out: Any) -> OpCall:
    """The OpCall of one dispatched aten op."""
    schema = getattr(func, "_schema", None)
    op = schema.name if schema is not None else str(func)
    tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    named = _named_args(func, args, kwargs)
    extra: dict[str, Any] = {}
    for arg, key in _SCALARS.items():
        value = named.get(arg)
        if value is not None:
            extra[key] = _dtype_name(value) if isinstance(value, torch.dtype) else value
    for key in ("window_left", "window_right"):  # an unbounded side (-1) is no window: the call's key stays as it was
        if extra.get(key, 0) < 0:
            del extra[key]
    cls = op_class(op)
    if cls == "foreach" and args and isinstance(args[0], (list, tuple)):
        extra["list_len"] = len(args[0])
    if cls == "copy" and isinstance(named.get("dtype"), torch.dtype):
        extra["dtype"] = _dtype_name(named["dtype"])
    if cls in _MEMORY:
        outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        if outs:
            extra["out_shapes"] = [list(t.shape) for t in outs]
            extra["out_dtypes"] = [_dtype_name(t.dtype) for t in outs]
    if cls == "gemm":  # the operands' layouts decide whether cuBLAS runs an unaligned kernel (gemm_layout.py)
        extra["strides"] = [list(t.stride()) for t in tensors]
        extra["offsets"] = [t.storage_offset() for t in tensors]
    if any(t.dtype == torch.float32 for t in tensors[:2]) and fp32_matmul_precision() != "highest":
        extra["tf32"] = True
    return make_call(op, [tuple(t.shape) for t in tensors], [_dtype_name(t.dtype) for t in tensors], extra)


class CalibratedModel:
    """The calibrated compute model behind the runtime's `op_time_ns(func, args, kwargs, out)` interface."""

    def __init__(self, gpu: str | GpuSpec, curves: Curves | None = None, table: TimingTable | None = None) -> None:
        self.model = ComputeModel(gpu, curves, table)
        self.gpu = self.model.gpu

    def op_time_ns(self, func: Any, args: tuple, kwargs: dict, out: Any) -> int:
        schema = getattr(func, "_schema", None)
        if getattr(func, "is_view", False) or (schema is not None and not schema.name.startswith("aten::")):
            return 0  # views, and profiler or other non-kernel namespaces
        return self.model.predict_call(call_of(func, args, kwargs, out))


_NEW_API_NAMES = {"ieee": "highest", "tf32": "high", "bf16": "medium"}


def fp32_matmul_precision() -> str:
    """The fp32 matmul precision as `torch.get_float32_matmul_precision()` names it ("highest": IEEE fp32, else TF32
    or lower). That getter refuses ("PyTorch is checking the matmul precision without a specific backend name")
    once a program set torch's newer per-backend API apart from it, as transformers' `enable_tf32` does
    (`torch.backends.fp32_precision = "tf32"`); CUDA's matmuls then follow `torch.backends.cuda.matmul.fp32_precision`
    ("none": its parent's, `torch.backends.fp32_precision`), which is read instead."""
    try:
        return torch._C._get_float32_matmul_precision()
    except RuntimeError:
        p = torch.backends.cuda.matmul.fp32_precision
        if p == "none":
            p = torch.backends.fp32_precision  # type: ignore[attr-defined]  # set on the module at import
        return _NEW_API_NAMES.get(p, "high")
