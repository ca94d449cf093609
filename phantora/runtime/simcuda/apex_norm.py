"""apex.normalization of the simulated apex (simapex.py): apex's fused LayerNorm and RMSNorm, as torch's own kernels.

apex's `fused_layer_norm_cuda` runs a norm as one forward kernel that also returns the row statistics (mean and
inverse standard deviation, fp32 for half inputs), and one backward kernel that reads them. torch has the same pair:
`aten.native_layer_norm` / `native_layer_norm_backward` and `aten._fused_rms_norm` / `_fused_rms_norm_backward`, so
each apex call is one op the compute model times as a norm kernel (torch has the RMSNorm backward for CUDA only:
the simulated GPU computes it as cuda_only.py says), with apex's numerics (the normalisation over the
trailing `normalized_shape` dimensions, eps inside the square root).

Names and signatures follow apex's `apex/normalization/fused_layer_norm.py` (the autograd Functions Megatron-core
probes with `inspect.getfullargspec(...forward)`, the `fused_*` functions and the modules). `memory_efficient`
(apex saves the output instead of the input) is accepted; the input is kept either way, so a simulated device's
memory holds the input where apex would hold the output (the same size).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.nn import init
from torch.nn.parameter import Parameter

from phantora.runtime.simcuda import cuda_only

Shape = Sequence[int]


def _autocast(*args: Any) -> tuple[Any, ...]:
    """apex casts its floating tensor arguments to the autocast dtype, then runs with autocast off."""
    if not torch.is_autocast_enabled("cuda"):
        return args
    dtype = torch.get_autocast_dtype("cuda")
    return tuple(a.to(dtype) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def _rms_backward(x: torch.Tensor) -> Callable[..., Any]:
    """torch's CUDA-only RMSNorm backward op on a (simulated) GPU, its kernel itself elsewhere (cuda_only.py)."""
    return cuda_only.RMS_NORM_BACKWARD if x.is_cuda else cuda_only.rms_norm_backward


def _mask(ctx: Any, n: int) -> list[bool]:
    return [bool(ctx.needs_input_grad[i]) for i in range(n)]


class FusedLayerNormAffineFunction(torch.autograd.Function):
    """LayerNorm with weight and bias: one forward kernel (output, mean, rstd), one backward kernel."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        normalized_shape: Shape,
        eps: float,
        memory_efficient: bool = False,
    ) -> torch.Tensor:
        x = input.contiguous()
        out, mean, rstd = torch.native_layer_norm(x, list(normalized_shape), weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.normalized_shape = list(normalized_shape)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, weight, bias, mean, rstd = ctx.saved_tensors
        dx, dw, db = torch.ops.aten.native_layer_norm_backward(
            grad.contiguous(), x, ctx.normalized_shape, mean, rstd, weight, bias, _mask(ctx, 3)
        )
        return dx, dw, db, None, None, None


class FusedLayerNormFunction(torch.autograd.Function):
    """LayerNorm without affine parameters."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, input: torch.Tensor, normalized_shape: Shape, eps: float, memory_efficient: bool = False
    ) -> torch.Tensor:
        x = input.contiguous()
        out, mean, rstd = torch.native_layer_norm(x, list(normalized_shape), None, None, eps)
        ctx.save_for_backward(x, mean, rstd)
        ctx.normalized_shape = list(normalized_shape)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, mean, rstd = ctx.saved_tensors
        dx, _, _ = torch.ops.aten.native_layer_norm_backward(
            grad.contiguous(), x, ctx.normalized_shape, mean, rstd, None, None, [True, False, False]
        )
        return dx, None, None, None


class FusedRMSNormAffineFunction(torch.autograd.Function):
    """RMSNorm with a weight: one forward kernel (output, rstd), one backward kernel."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        input: torch.Tensor,
        weight: torch.Tensor,
        normalized_shape: Shape,
        eps: float,
        memory_efficient: bool = False,
    ) -> torch.Tensor:
        x = input.contiguous()
        out, rstd = torch.ops.aten._fused_rms_norm(x, list(normalized_shape), weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        ctx.normalized_shape = list(normalized_shape)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, weight, rstd = ctx.saved_tensors
        dx, dw = _rms_backward(x)(grad.contiguous(), x, ctx.normalized_shape, rstd, weight, _mask(ctx, 2))
        return dx, dw, None, None, None


class FusedRMSNormFunction(torch.autograd.Function):
    """RMSNorm without a weight."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, input: torch.Tensor, normalized_shape: Shape, eps: float, memory_efficient: bool = False
    ) -> torch.Tensor:
        x = input.contiguous()
        out, rstd = torch.ops.aten._fused_rms_norm(x, list(normalized_shape), None, eps)
        ctx.save_for_backward(x, rstd)
        ctx.normalized_shape = list(normalized_shape)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        x, rstd = ctx.saved_tensors
        dx, _ = _rms_backward(x)(grad.contiguous(), x, ctx.normalized_shape, rstd, None, [True, False])
        return dx, None, None, None


def _run(fn: type[torch.autograd.Function], *args: Any) -> torch.Tensor:
    cast = _autocast(*args)
    with torch.autocast("cuda", enabled=False):
        out: torch.Tensor = fn.apply(*cast)
    return out


def fused_layer_norm_affine(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    normalized_shape: Shape,
    eps: float = 1e-6,
    memory_efficient: bool = False,
) -> torch.Tensor:
    """apex's functional LayerNorm with weight and bias."""
    return _run(FusedLayerNormAffineFunction, input, weight, bias, normalized_shape, eps, memory_efficient)


def fused_layer_norm(
    input: torch.Tensor, normalized_shape: Shape, eps: float = 1e-6, memory_efficient: bool = False
) -> torch.Tensor:
    """apex's functional LayerNorm without affine parameters."""
    return _run(FusedLayerNormFunction, input, normalized_shape, eps, memory_efficient)


def fused_rms_norm_affine(
    input: torch.Tensor,
    weight: torch.Tensor,
    normalized_shape: Shape,
    eps: float = 1e-6,
    memory_efficient: bool = False,
) -> torch.Tensor:
    """apex's functional RMSNorm with a weight."""
    return _run(FusedRMSNormAffineFunction, input, weight, normalized_shape, eps, memory_efficient)


def fused_rms_norm(
    input: torch.Tensor, normalized_shape: Shape, eps: float = 1e-6, memory_efficient: bool = False
) -> torch.Tensor:
    """apex's functional RMSNorm without a weight."""
    return _run(FusedRMSNormFunction, input, normalized_shape, eps, memory_efficient)


def _shape(normalized_shape: int | Shape) -> torch.Size:
    if isinstance(normalized_shape, numbers.Integral):
        return torch.Size((int(normalized_shape),))
    return torch.Size([int(n) for n in normalized_shape])  # type: ignore[union-attr]


class _FusedNorm(torch.nn.Module):
    """What apex's FusedLayerNorm and FusedRMSNorm share: the shape, eps, flags, a weight of ones (and, with `_bias`,
    a bias of zeros) if `elementwise_affine`; `_mixed`: the input is cast to the weight's dtype (apex's Mixed*)."""

    _bias = False
    _mixed = False

    def __init__(
        self,
        normalized_shape: int | Shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        memory_efficient: bool = False,
    ) -> None:
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps, self.elementwise_affine, self.memory_efficient = eps, elementwise_affine, memory_efficient
        self.weight: Parameter | None = self._param()
        if self._bias:
            self.bias: Parameter | None = self._param()
        self.reset_parameters()

    def _param(self) -> Parameter | None:
        return Parameter(torch.empty(self.normalized_shape)) if self.elementwise_affine else None

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self._bias and self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self._mixed:
            assert self.weight is not None
            input = input.to(self.weight.dtype)
        return self._norm(input)

    def _norm(self, input: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class FusedLayerNorm(_FusedNorm):
    """apex.normalization.FusedLayerNorm: weight ones and bias zeros if `elementwise_affine`."""

    _bias = True

    def _norm(self, input: torch.Tensor) -> torch.Tensor:
        if self.weight is None or self.bias is None:
            return fused_layer_norm(input, self.normalized_shape, self.eps, self.memory_efficient)
        return fused_layer_norm_affine(
            input, self.weight, self.bias, self.normalized_shape, self.eps, self.memory_efficient
        )


class FusedRMSNorm(_FusedNorm):
    """apex.normalization.FusedRMSNorm: weight ones if `elementwise_affine`."""

    def _norm(self, input: torch.Tensor) -> torch.Tensor:
        if self.weight is None:
            return fused_rms_norm(input, self.normalized_shape, self.eps, self.memory_efficient)
        return fused_rms_norm_affine(input, self.weight, self.normalized_shape, self.eps, self.memory_efficient)


def _mixed_init(
    self: _FusedNorm, normalized_shape: int | Shape, eps: float = 1e-5, *, memory_efficient: bool = False
) -> None:
    """apex's Mixed* constructors: always affine."""
    _FusedNorm.__init__(self, normalized_shape, eps, elementwise_affine=True, memory_efficient=memory_efficient)


class MixedFusedLayerNorm(FusedLayerNorm):
    """apex's LayerNorm whose output has the parameters' dtype (a half input normalised in fp32 weights' precision)."""

    _mixed = True
    __init__ = _mixed_init


class MixedFusedRMSNorm(FusedRMSNorm):
    """apex's RMSNorm whose output has the weight's dtype."""

    _mixed = True
    __init__ = _mixed_init


EXPORTS = [
    "FusedLayerNormAffineFunction",
    "FusedLayerNormFunction",
    "FusedRMSNormAffineFunction",
    "FusedRMSNormFunction",
    "fused_layer_norm_affine",
    "fused_layer_norm",
    "fused_rms_norm_affine",
    "fused_rms_norm",
    "FusedLayerNorm",
    "FusedRMSNorm",
    "MixedFusedLayerNorm",
    "MixedFusedRMSNorm",
]
