"""DeepSpeed's `quantizer` CUDA extension (`QuantizerBuilder().load()`) as torch ops: what ZeRO++'s quantized
weights (qwZ, `zero_quantized_weights`) call to quantize each parameter shard before its all-gather and to
dequantize the gathered one (DeepSpeed 0.19 `runtime/zero/partition_parameters.py`, `CUDAQuantizer`).

Group-wise integer quantization as the extension's kernels compute it (`csrc/includes/quantization_utils.h`,
`Params`): the input is split into `groups` equal runs of consecutive elements; symmetric: scale = 2^bits / (2 max
|x|) (1 when the group is all zeros), asymmetric: scale = 2^bits / (max - min) with offset (max + min) / 2; q =
round-half-even((x - offset) scale) clamped to [-2^(bits-1), 2^(bits-1) - 1]; the stored parameter is 1 / scale (then
the offset). Dequantization: q / scale + offset. 4-bit values are packed two to a byte, the even element in the high
nibble (its `PackedInt4` bit fields). The output is int8 and the parameters fp32 [groups, 1 or 2], as the extension's.
Each call is one kernel on a GPU: it first waits for the collectives still writing its inputs (a dequantize reads the
all-gather's output, which a GPU's stream order would wait for), its torch ops run uncharged, and it is charged once,
as an elementwise kernel reading its input and writing its output (the compute model's copy of the input to the
output's dtype and shape), under the name `deepspeed.quantize` / `deepspeed.dequantize`.

Not provided: `swizzle_quant` and `quantized_reduction`, the hierarchical all-to-all of ZeRO++'s quantized gradients
(qgZ, `zero_quantized_gradients`), whose swizzled layout is not reproduced: they stop in one line.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from phantora.runtime.simcuda import cuda_only
from phantora.runtime.simcuda.devices import NotSimulatedError

_COPY = torch.ops.aten._to_copy.default


class QuantizationType(enum.IntEnum):
    """The extension's `QuantizationType` (`quantize::Type`)."""

    Symmetric = 0
    Asymmetric = 1


def _check_bits(num_bits: int) -> None:
    if num_bits not in (4, 8):
        raise ValueError(f"DeepSpeed's quantizer takes 4 or 8 bits, got {num_bits}")


def _groups_of(x: torch.Tensor, groups: int) -> torch.Tensor:
    if groups <= 0 or x.numel() % groups:
        raise ValueError(f"DeepSpeed's quantizer: {x.numel()} elements do not split into {groups} groups")
    return x.reshape(groups, x.numel() // groups)


@torch.no_grad()
def quantize(input_vals: torch.Tensor, groups: int, num_bits: int, quant_type: Any) -> list[torch.Tensor]:
    """[int8 values (the last dimension halved for 4 bits), fp32 parameters [groups, 1 or 2]] of `input_vals`."""
    _check_bits(num_bits)
    x = _groups_of(input_vals.to(torch.float16), groups).float()  # the kernel reads fp16
    q_min, q_max = -(1 << (num_bits - 1)), (1 << (num_bits - 1)) - 1
    if QuantizationType(int(quant_type)) is QuantizationType.Symmetric:
        top = x.abs().amax(dim=1, keepdim=True)
        scale = torch.where(top == 0, torch.ones_like(top), (1 << num_bits) / (2 * top))
        params = 1 / scale
        q = torch.round(x * scale)
    else:
        hi, lo = x.amax(dim=1, keepdim=True), x.amin(dim=1, keepdim=True)
        scale = torch.where(hi == lo, torch.ones_like(hi), (1 << num_bits) / (hi - lo))
        offset = (hi + lo) / 2
        params = torch.cat([1 / scale, offset], dim=1)
        q = torch.round((x - offset) * scale)
    q = q.clamp(q_min, q_max).to(torch.int8).reshape(-1)
    if num_bits == 4:
        q = (q[0::2] << 4) | (q[1::2] & 0xF)
    shape = list(input_vals.shape)
    shape[-1] //= 8 // num_bits
    return [q.reshape(shape), params.contiguous()]


@torch.no_grad()
def _dequantize(
    quantized: torch.Tensor, params: torch.Tensor, groups: int, num_bits: int, quant_type: Any, dtype: torch.dtype
) -> torch.Tensor:
    _check_bits(num_bits)
    q = quantized.reshape(-1)
    if num_bits == 4:
        high, low = q >> 4, (q << 4) >> 4  # arithmetic shifts: signed nibbles
        q = torch.stack([high, low], dim=1).reshape(-1)
    p = params.reshape(groups, -1).float()
    x = _groups_of(q.float(), groups) * p[:, :1]
    if QuantizationType(int(quant_type)) is QuantizationType.Asymmetric:
        x = x + p[:, 1:2]
    shape = list(quantized.shape)
    shape[-1] *= 8 // num_bits
    return x.to(dtype).reshape(shape)


def dequantize(quantized: torch.Tensor, params: torch.Tensor, groups: int, num_bits: int, quant_type: Any) -> Any:
    """fp16 values of `quantized` (`quantize`'s output) with its parameters."""
    return _dequantize(quantized, params, groups, num_bits, quant_type, torch.float16)


def dequantize_fp32(quantized: torch.Tensor, params: torch.Tensor, groups: int, num_bits: int, quant_type: Any) -> Any:
    """fp32 values of `quantized` with its parameters."""
    return _dequantize(quantized, params, groups, num_bits, quant_type, torch.float32)


def _one_kernel(name: str, compute: Callable[..., Any]) -> Callable[..., Any]:
    """`compute` charged as one kernel `name` of its input's and its first output's bytes."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        s = cuda_only._current()
        if s is None:
            return compute(*args, **kwargs)
        cuda_only.join_inputs(
            s, args, kwargs
        )  # it reads its inputs: a collective writing one (ZeRO++'s gather) ends first
        with s.internal():  # its ops are the one kernel's parts
            out = compute(*args, **kwargs)
        first = out[0] if isinstance(out, list) else out
        if s.memory.enabled:
            s.memory.on_outputs(out, name)
        with s.internal():
            cost = s.model.cost(_COPY, (args[0],), {"dtype": first.dtype}, first)
        s.charge(name, cost)
        return out

    return kernel


def _not_provided(name: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotSimulatedError(
            f"DeepSpeed's quantizer kernel `{name}` (ZeRO++'s quantized gradients, `zero_quantized_gradients`) is not "
            "simulated; quantized weights (`zero_quantized_weights`) and hpZ (`zero_hpz_partition_size`) are: run "
            "without `zero_quantized_gradients`"
        )

    return refuse


MODULE = SimpleNamespace(
    quantize=_one_kernel("deepspeed.quantize", quantize),
    dequantize=_one_kernel("deepspeed.dequantize", dequantize),
    dequantize_fp32=_one_kernel("deepspeed.dequantize", dequantize_fp32),
    QuantizationType=QuantizationType,
    Symmetric=QuantizationType.Symmetric,
    Asymmetric=QuantizationType.Asymmetric,
    swizzle_quant=_not_provided("swizzle_quant"),
    quantized_reduction=_not_provided("quantized_reduction"),
)
