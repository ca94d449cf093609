"""Compute models: one aten op -> simulated GPU duration in integer ns (and its FLOPs, for MFU).

- `Calibrated` (the default of `phantora run`): the kernel time of `phantora.perfmodel` (per-op-class
  efficiency curves fitted on measured timings; a measured table entry for exactly this op, shapes
  and dtypes takes priority) plus the launch overhead. Cached per (op, argument shapes and dtypes).
- `Roofline` (`--compute-model roofline`): max(flops / peak(dtype), bytes / mem_bw) + launch
  overhead, where flops come from the formulas registered in `torch.utils.flop_counter` (matmuls,
  convolutions, attention) and bytes are the sizes of the op's input and output tensors.

Both count FLOPs the same way (the roofline's), read only shapes and dtypes (so meta tensors work),
and charge nothing for ops that launch no kernel (views, allocation, metadata). `build_model` makes
one from the run's options; `op_time_ns` is the single entry point of the installed model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from phantora.errors import InputError
from phantora.perfmodel.alignment import VECTOR_BYTES
from phantora.perfmodel.gemm_layout import contiguous_strides
from phantora.perfmodel.gpus import GpuSpec, get_gpu
from phantora.rank_options import COMPUTE_MODELS, DEFAULT_LAUNCH_NS
from phantora.runtime import precision

aten = torch.ops.aten


DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.float64: "fp64",
    torch.int8: "int8",
    torch.uint8: "uint8",
}
FP8_DTYPE_NAMES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
for _name in FP8_DTYPE_NAMES:
    if hasattr(torch, _name):
        DTYPE_NAMES[getattr(torch, _name)] = "fp8"

# CPU kernels that have the same FLOPs as a GPU kernel with a registered formula.
_FLOP_ALIASES: dict[Any, Any] = {
    aten._scaled_dot_product_flash_attention_for_cpu: aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: aten._scaled_dot_product_flash_attention_backward,
}


def _grouped_mm_flops(mat_a: torch.Tensor, mat_b: torch.Tensor, offs: Any = None, *_: Any, **__: Any) -> int:
    """FLOPs of `_grouped_mm`, which torch.utils.flop_counter has no formula for: its groups' products."""
    from phantora.perfmodel.features import grouped_mm_dims, make_call

    shapes = [tuple(mat_a.shape), tuple(mat_b.shape)] + ([tuple(offs.shape)] if offs is not None else [])
    call = make_call("aten::_grouped_mm", shapes, ["bfloat16"] * len(shapes))
    return grouped_mm_dims(call, call.shapes)[4]


def _scaled_grouped_mm_flops(
    mat_a: torch.Tensor, mat_b: torch.Tensor, scale_a: Any, scale_b: Any, offs: Any = None, *_: Any, **__: Any
) -> int:
    """FLOPs of `_scaled_grouped_mm` (fp8 operands, their scales applied in the same kernel): `_grouped_mm`'s."""
    return _grouped_mm_flops(mat_a, mat_b, offs)


# Ops torch.utils.flop_counter has no formula for, with phantora's.
_OWN_FORMULAS: dict[Any, Any] = {
    aten._grouped_mm: _grouped_mm_flops,
    aten._scaled_grouped_mm: _scaled_grouped_mm_flops,
}

# Kernels whose fp32 products run as three TF32 tensor-core products (GpuSpec.fast_f32_peak).
_FAST_F32 = {
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
}

# Ops that launch no kernel on a GPU: allocation and metadata only.
_NO_KERNEL = {
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "detach",
    "alias",
    "lift_fresh",
    "set_",
    "resize_",
    "_unsafe_view",
    "_reshape_alias",
    "_has_compatible_shallow_copy_type",
    "is_same_size",
    "record_stream",
}
# Ops that launch a tiny kernel or a sync: charged the launch overhead only.
_LAUNCH_ONLY = {"_local_scalar_dense", "scalar_tensor", "_assert_async", "_foobar"}
# Gathers that read only the rows they output (plus the index), not the whole source.
_GATHERS = {"embedding", "index_select", "gather", "index"}


# How the calibrated model charges an op it cannot describe (listed in results.json's untimed_kernels).
ROOFLINE_FALLBACK = (
    "roofline: its FLOPs (torch's formula, if it has one) at the GPU's peak or its bytes at HBM bandwidth, + launch"
)


@dataclass(frozen=True, slots=True)
class OpCost:
    """The roofline terms of one op, its charged time and the tier that timed its kernel."""

    flops: int
    nbytes: int
    dtype: str  # compute dtype of the FLOPs ('' when the op has none)
    ns: int  # kernel time + launch overhead (0: no kernel)
    tier: str = "roofline"  # measured | public | l40s | curves | roofline | estimate (phantora.perfmodel.pubfit.TIERS)


def kept_flops(flops: int, kept: float, of: float) -> int:
    """An attention kernel's FLOPs when its mask keeps `kept` of the causal kernel's `of` (query, key) pairs or
    blocks: torch's formula counts every pair of the causal kernel, so that count times the kept share (a sliding
    window's in simcuda/varlen.py, a FlexAttention block mask's in flex_blocks.py)."""
    return round(flops * kept / of)


def tensors_in(x: Any, out: list[torch.Tensor] | None = None) -> list[torch.Tensor]:
    """The tensors in nested tuples, lists and dicts (a fast, tensor-only tree flatten)."""
    if out is None:
        out = []
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for item in x:
            if isinstance(item, torch.Tensor):
                out.append(item)
            elif isinstance(item, (list, tuple, dict)):
                tensors_in(item, out)
    elif isinstance(x, dict):
        for item in x.values():
            tensors_in(item, out)
    return out


def _nbytes(x: Any) -> int:
    return sum(t.numel() * t.element_size() for t in tensors_in(x))


def _first_dtype(args: Any) -> str:
    for t in tensors_in(args):
        if t.is_floating_point():
            name = DTYPE_NAMES.get(t.dtype, "fp32")
            if name == "fp32" and precision.matmul_precision() != "highest":
                return "tf32"
            return name
    return "fp32"


# kinds of op, decided once per OpOverload
_FREE, _LAUNCH, _GATHER, _PLAIN, _NLL_FORWARD, _NLL_BACKWARD = 0, 1, 2, 3, 4, 5
# nll_loss touches one element a row (aten/src/ATen/native/cuda/Loss.cu, LossNLL.cpp on the host): the forward
# gathers it, the backward zero-fills its output and scatters it; neither reads the [N, C] input
_NLL = {"nll_loss_forward": _NLL_FORWARD, "nll_loss2d_forward": _NLL_FORWARD}
_NLL |= {"nll_loss_backward": _NLL_BACKWARD, "nll_loss2d_backward": _NLL_BACKWARD}


_INFO: dict[int, tuple[int, Any]] = {}  # id(OpOverload) -> info; OpOverloads live as long as torch


def _op_info(func: Any) -> tuple[int, Any]:
    info = _INFO.get(id(func))
    if info is None:
        info = _INFO[id(func)] = _classify(func)
    return info


def _classify(func: Any) -> tuple[int, Any]:
    """(kind, FLOP formula or None) of an op."""
    packet = getattr(func, "overloadpacket", func)
    name = getattr(packet, "__name__", "")
    if getattr(func, "is_view", False) or name in _NO_KERNEL:
        return _FREE, None
    if name in _LAUNCH_ONLY:
        return _LAUNCH, None
    formula = _OWN_FORMULAS.get(packet) or flop_registry.get(_FLOP_ALIASES.get(packet, packet))
    return (_GATHER if name in _GATHERS else _NLL.get(name, _PLAIN)), formula


def op_flops(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs of one op from torch.utils.flop_counter's formulas; 0 when it has none."""
    formula = _op_info(func)[1]
    if formula is None:
        return 0
    try:
        return int(formula(*args, **kwargs, out_val=out))
    except (AssertionError, TypeError, ValueError, IndexError, RuntimeError):
        return 0


def op_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes an op moves through GPU memory: its inputs and outputs (gathers read only what they output)."""
    kind = _op_info(func)[0]
    if kind == _GATHER:
        return _nbytes(args[1:]) + _nbytes(kwargs) + 2 * _nbytes(out)
    if kind in (_NLL_FORWARD, _NLL_BACKWARD):
        return _nll_bytes(kind, args, kwargs, out)
    return _nbytes(args) + _nbytes(kwargs) + _nbytes(out)


def _nll_bytes(kind: int, args: tuple, kwargs: dict, out: Any) -> int:
    """nll_loss's bytes: a row's target, its class weight (if any) and the element it names (read by the forward,
    written by the backward's scatter), and the outputs (the backward's a zero-fill of [N, C]); the backward also
    reads its grad_output and total_weight. Arguments as aten's schema: (self, target, weight, reduction,
    ignore_index), the backward's after grad_output and with total_weight last."""
    names = ("self", "target", "weight", "reduction", "ignore_index", "total_weight")
    first = 0 if kind == _NLL_FORWARD else 1
    got = dict(zip(names, args[first:], strict=False)) | {k: v for k, v in kwargs.items() if k in names}
    x, target, weight = got.get("self"), got.get("target"), got.get("weight")
    if not isinstance(x, torch.Tensor) or not isinstance(target, torch.Tensor):
        return _nbytes(args) + _nbytes(kwargs) + _nbytes(out)  # not aten's schema: count everything
    a_row = target.element_size() + x.element_size()
    if isinstance(weight, torch.Tensor):
        a_row += weight.element_size()
    total = target.numel() * a_row + _nbytes(out)
    if kind == _NLL_BACKWARD:
        total += _nbytes(args[0] if args else kwargs.get("grad_output")) + _nbytes(got.get("total_weight"))
    return total


def _sig(x: Any) -> Any:
    """Cache-key part of an argument: tensors by (shape, dtype), never by value (meta tensors have
    none); floats only by whether they are 0 (dropout p = 0 launches no kernel), so a learning rate
    that changes every step does not defeat the cache; other scalars as they are."""
    t = type(x)
    if t is int or t is bool or x is None:
        return x
    if t is float:
        return x == 0.0
    if isinstance(x, torch.Tensor):
        return (x.shape, x.dtype)
    if t is list or t is tuple or isinstance(x, (list, tuple)):
        return tuple([_sig(item) for item in x])
    if isinstance(x, float):
        return x == 0.0
    return x


_OP_OVERLOAD = torch._ops.OpOverload


def cache_key(func: Any, args: tuple, kwargs: dict, out: Any) -> tuple:
    """What an op's cost depends on: the op, its arguments' and outputs' shapes and dtypes, its other
    scalars, and the fp32 matmul precision (TF32). It may hold an unhashable argument. An aten op is
    keyed by its id (it lives as long as torch; hashing an OpOverload runs Python)."""
    op = id(func) if type(func) is _OP_OVERLOAD else func
    return (op, _sig(args), _sig(tuple(kwargs.items())) if kwargs else (), _sig(out), precision.matmul_precision())


_LAYOUT_BOUND: dict[int, bool] = {}  # id(OpOverload) -> is a matrix product (its cost depends on its operands' layout)


def layout_bound(func: Any) -> bool:
    """Whether the calibrated model's time of `func` depends on its operands' strides and offsets: an aten matrix
    product (cuBLAS's unaligned kernels, perfmodel/gemm_layout.py). Decided once per op."""
    got = _LAYOUT_BOUND.get(id(func))
    if got is None:
        from phantora.perfmodel.ops import op_class

        schema = getattr(func, "_schema", None)
        got = _LAYOUT_BOUND[id(func)] = schema is not None and op_class(schema.name) == "gemm"
    return got


_TENSOR_CORE = {torch.bfloat16, torch.float16} | {getattr(torch, n) for n in FP8_DTYPE_NAMES if hasattr(torch, n)}


def layout_matters(args: tuple) -> bool:
    """Whether a matrix product on `args` runs on tensor cores (16-bit, fp8, or fp32 as TF32), whose fast kernels need
    aligned operands; plain fp32 runs SIMT kernels, whatever the layout (perfmodel/alignment.py)."""
    for t in args:
        if isinstance(t, torch.Tensor):
            if t.dtype in _TENSOR_CORE or (t.dtype is torch.float32 and precision.matmul_precision() != "highest"):
                return True
    return False


def layout_part(t: torch.Tensor) -> tuple | None:
    """What the simulated GPU's fast path adds to the (shape, dtype) of a matrix product's operand `t` in its cache
    key: None when `t` lies as a contiguous tensor of its shape (gemm_layout.contiguous_strides) at a storage offset
    on the 16-byte grid, else (its strides, its offset modulo VECTOR_BYTES elements). The calibrated model reads an
    operand's layout only through its strides and whether offset * itemsize is a multiple of VECTOR_BYTES
    (gemm_layout.py, alignment.py), which the offset modulo VECTOR_BYTES elements decides for any itemsize."""
    strides, offset = t.stride(), t.storage_offset() % VECTOR_BYTES
    if offset or strides != contiguous_strides(t.shape):
        return strides, offset
    return None


def layout_sig(args: tuple, kwargs: dict) -> tuple:
    """The strides and storage offsets of an op's tensor arguments (the cache-key part of a layout-bound op)."""
    sig = [(t.stride(), t.storage_offset()) for t in args if isinstance(t, torch.Tensor)]
    if kwargs or len(sig) < len(args):  # tensors in keywords or in lists (rare for a matrix product)
        sig = [(t.stride(), t.storage_offset()) for t in tensors_in((args, kwargs))]
    return tuple(sig)


class Roofline:
    """Roofline model of one GPU."""

    kind = "roofline"
    by_layout = False  # whether a matrix product's cost depends on its operands' layout (the calibrated model's does)

    def __init__(self, gpu: GpuSpec, launch_ns: int = DEFAULT_LAUNCH_NS) -> None:
        self.gpu = gpu
        self.launch_ns = int(launch_ns)
        self._free = OpCost(0, 0, "", 0)
        self._launch = OpCost(0, 0, "", self.launch_ns)
        self._cache: dict[tuple, OpCost] = {}
        self.keyed: dict[tuple, OpCost] = {}  # cost_for's cache (the simulated GPU's fast path reads it directly)

    def cost(self, func: Any, args: tuple, kwargs: dict, out: Any) -> OpCost:
        """FLOPs, bytes and duration of one op (cached per `cache_key`)."""
        if _op_info(func)[0] == _FREE:
            return self._free
        key = cache_key(func, args, kwargs, out)
        if self.by_layout and layout_bound(func) and layout_matters(args):
            key = (key, layout_sig(args, kwargs))
        return self._cached(key, func, args, kwargs, out)

    def _cached(self, key: tuple, func: Any, args: tuple, kwargs: dict, out: Any) -> OpCost:
        """`compute`, cached in `_cache` under `key` (none for an unhashable argument)."""
        try:
            cost = self._cache.get(key)
        except TypeError:  # an unhashable argument: no caching
            return self.compute(func, args, kwargs, out)
        if cost is None:
            cost = self._cache[key] = self.compute(func, args, kwargs, out)
        return cost

    def cost_keyed(self, key: tuple, func: Any, args: tuple, kwargs: dict, out: Any) -> OpCost:
        """`cost`, cached in `keyed` under `key`, which holds everything the cost depends on: the simulated GPU's
        fast path makes it while it unwraps the arguments (`cache_key`'s information, and for a matrix product under
        a model `by_layout` its operands' `layout_part`s), and reads `keyed` first."""
        try:
            cost = self.keyed.get(key)
        except TypeError:  # an unhashable argument
            return self.cost(func, args, kwargs, out)
        if cost is None:
            cost = self.keyed[key] = self.cost(func, args, kwargs, out)
        return cost

    def cost_for(self, key: tuple, func: Any, args: tuple, kwargs: dict, out: Any) -> OpCost:
        """`cost`, cached under `key`, which the caller made with the information of `cache_key` alone. A
        tensor-core matrix product is cached with its operands' layout and never under `key` alone (`cost_keyed`'s
        cache, which the fast path reads first)."""
        if self.by_layout and layout_bound(func) and layout_matters(args):
            return self._cached((key, layout_sig(args, kwargs)), func, args, kwargs, out)
        return self.cost_keyed(key, func, args, kwargs, out)

    def compute(self, func: Any, args: tuple, kwargs: dict, out: Any) -> OpCost:
        """`cost` without the cache."""
        kind, formula = _op_info(func)
        if kind == _FREE:
            return self._free
        if kind == _LAUNCH:
            return self._launch
        flops = op_flops(func, args, kwargs, out) if formula is not None else 0
        nbytes = op_bytes(func, args, kwargs, out)
        dtype = _first_dtype(args) if flops else ""
        peak = self.gpu.fast_f32_peak() if dtype == "fp32" and func in _FAST_F32 else self.gpu.peak(dtype)
        seconds = max(flops / peak if flops else 0.0, nbytes / self.gpu.mem_bw)
        return OpCost(flops, nbytes, dtype, math.ceil(seconds * 1e9) + self.launch_ns)

    def op_time_ns(self, func: Any, args: tuple, kwargs: dict, out: Any) -> int:
        return self.cost(func, args, kwargs, out).ns


class Calibrated(Roofline):
    """The calibrated model (`phantora.perfmodel`) behind the roofline's interface.

    Time: the perfmodel's kernel time (a measured table entry for exactly this call, else the
    efficiency curves) plus `launch_ns` for every op that launches a kernel. FLOPs, bytes and the
    FLOP dtype: the roofline's counting, so MFU means the same under both models. Costs are cached
    per `cache_key`, a matrix product's with its operands' strides and offsets (`layout_sig`). Ops the
    perfmodel cannot describe (another namespace, shapes it does not know) get the roofline's time;
    `fallbacks` counts them by op name.
    """

    kind = "calibrated"
    by_layout = True

    def __init__(
        self,
        gpu: GpuSpec,
        launch_ns: int = DEFAULT_LAUNCH_NS,
        *,
        curves: Any = None,
        table: Any = None,
        public: bool = True,
    ) -> None:
        from phantora.perfmodel.model import ComputeModel

        super().__init__(gpu, launch_ns)
        self.model = ComputeModel(gpu, curves, table, public=public)
        self.fallbacks: dict[str, int] = {}

    def compute(self, func: Any, args: tuple, kwargs: dict, out: Any) -> OpCost:
        """`cost` without the cache."""
        from phantora.perfmodel.torch_adapter import call_of

        if _op_info(func)[0] == _FREE:
            return self._free
        base = super().compute(func, args, kwargs, out)
        schema = getattr(func, "_schema", None)
        namespace = schema.name.partition("::")[0] if schema is not None else ""
        if namespace == "profiler":
            return self._free
        if namespace == "aten":
            try:
                ns, tier = self.model.timed_call(call_of(func, args, kwargs, out))
            except InputError as exc:
                if exc.field == "dtype":  # e.g. an fp8 matmul on a GPU without fp8 tensor cores
                    raise
            else:
                return OpCost(base.flops, base.nbytes, base.dtype, ns + self.launch_ns if ns else 0, tier)
        name = schema.name if schema is not None else str(func)
        self.fallbacks[name] = self.fallbacks.get(name, 0) + 1
        return base


def build_model(
    kind: str = COMPUTE_MODELS[0],
    gpu: GpuSpec | str = "h100",
    launch_ns: int = DEFAULT_LAUNCH_NS,
    *,
    perf_tables: tuple[str | Path, ...] | list[str | Path] = (),
    curves: str | None = None,
    public: bool = True,
) -> Roofline:
    """The compute model of a run: 'calibrated' (with optional measured tables and curves file; `public=False`
    leaves the public per-GPU fit out) or 'roofline'.

    Raises InputError naming the file when a table or the curves cannot be read."""
    gpu = get_gpu(gpu) if isinstance(gpu, str) else gpu
    if kind == "roofline":
        if perf_tables or curves:
            raise InputError("--perf-table and --curves need --compute-model calibrated", field="compute_model")
        return Roofline(gpu, launch_ns)
    if kind == "calibrated":
        from phantora.perfmodel.model import load_inputs

        fitted, table = load_inputs(perf_tables, curves)
        return Calibrated(gpu, launch_ns, curves=fitted, table=table, public=public)
    raise InputError(f"must be one of {', '.join(COMPUTE_MODELS)}, got {kind!r}", field="compute_model")


_model: Roofline = Roofline(get_gpu("h100"))


def set_model(model: Roofline) -> None:
    """Install the model that `op_time_ns` uses in this process."""
    global _model
    _model = model


def get_model() -> Roofline:
    return _model


def op_time_ns(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Simulated duration of one aten op on the current GPU model, in integer ns."""
    return _model.op_time_ns(func, args, kwargs, out)
