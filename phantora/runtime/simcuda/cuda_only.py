"""The CUDA-only ops a simulated-GPU tensor runs, and the kernels that compute them on its data.

torch has some ops for CUDA (and meta) only. On a simulated-GPU tensor, tensor.py runs each as the function here on
the tensor's data (CPU in real mode, meta in phantom mode), and the compute model charges the CUDA op once, as the
one kernel a GPU launches:

- flash and memory-efficient attention and their backwards (attention.py; the efficient ones through `one_kernel`);
- ``aten._fused_rms_norm`` and its backward ``aten._fused_rms_norm_backward``: torch's RMSNorm (``torch.nn.RMSNorm``,
  ``F.rms_norm``) and the simulated apex's (apex_norm.py). A CUDA build runs each as one kernel: ``rms_norm`` calls
  ``_fused_rms_norm`` (torch's layer_norm.cpp; a complex or channels-last input, or a weight whose dtype differs from
  the input's, takes the composite instead), whose autograd saves rstd for ``_fused_rms_norm_backward``. On this CPU
  build ``_fused_rms_norm`` has no CUDA kernel, so autograd would decompose it into its composite ops;
  `register_fused_rms_norm` gives it one, so a simulated-GPU tensor takes the CUDA path: autograd records the fused
  backward and the forward reaches the device as the one op. Each is computed here from its closed form by several
  torch ops that run uncharged, and charged once, as the one kernel (`one_kernel`). That CUDA kernel is torch 2.9's:
  modelling an older torch (PHANTORA_TORCH_VERSION, torch_release.py), RMSNorm is charged as the composite it ran;
- packed (variable-length) flash attention, ``aten._flash_attention_forward`` / ``_backward`` with sequence lengths,
  and `varlen_attn`'s custom ops around them (varlen.py);
- the simulated FlashAttention packages' forward and backward (flash_kernels.py, simflash.py);
- the LSTM and GRU cells' fused kernels and their backwards (lstm_cell.py);
- ``aten._scaled_grouped_mm``, fp8 MoE experts in one kernel (scaled_grouped.py).

`HALF_TO_FLOAT` below are ops the CPU has, but not with an fp16 input to an fp32 output in one kernel (a softmax).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from phantora.runtime.simcuda import attention, flash_kernels, lstm_cell, scaled_grouped, torch_release, varlen
from phantora.runtime.simcuda.devices import NotSimulatedError

RMS_NORM = torch.ops.aten._fused_rms_norm.default
RMS_NORM_BACKWARD = torch.ops.aten._fused_rms_norm_backward.default
_LIBRARY: list[torch.library.Library] = []  # the CUDA kernel of `_fused_rms_norm`, once registered


def _no_session() -> Any:
    """No session: outside a phantora run, or before session.py is imported."""
    return None


_current: Callable[[], Any] = _no_session  # the rank's session, once session.py says where it is (`use_session`)


def use_session(current: Callable[[], Any]) -> None:
    """Where `one_kernel` finds the rank's session: session.py hands over its `current` when it is imported (this
    module sits below it: session -> memory -> simcuda.tensor -> cuda_only, so it may not import session)."""
    global _current
    _current = current


def rms_norm(
    input: torch.Tensor, normalized_shape: Sequence[int], weight: torch.Tensor | None = None, eps: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """y = x * rstd * w and rstd = (mean(x^2) + eps)^(-1/2) over the trailing `normalized_shape` dims, computed in
    fp32 for half inputs; y in the input's dtype, rstd in the accumulation dtype with the normalised dims kept as 1
    (the shapes of torch's meta kernel). eps None: the accumulation dtype's machine epsilon, as torch's."""
    dims = tuple(range(input.dim() - len(normalized_shape), input.dim()))
    acc = lstm_cell.accumulation(input.dtype)
    x = input.to(acc)
    eps = torch.finfo(acc).eps if eps is None else eps
    rstd = torch.rsqrt(x.pow(2).mean(dims, keepdim=True) + eps)
    y = x * rstd
    if weight is not None:
        y = y * weight
    return y.to(input.dtype).contiguous(), rstd.contiguous()


def register_fused_rms_norm(version: tuple[int, int] | None = None) -> bool:
    """Give ``aten._fused_rms_norm`` a CUDA kernel (`rms_norm`) if torch `version` (default: the modelled one,
    PHANTORA_TORCH_VERSION, torch_release.py) has one, as its CUDA build does: autograd on a simulated-GPU tensor then
    records the op with its fused backward instead of decomposing it. An older torch's takes none (any given before
    is withdrawn), so its RMSNorm runs as the composite's ops. A simulated-GPU tensor never reaches this kernel (its
    Python key comes first and runs `KERNELS`); CPU tensors keep torch's composite. Returns whether it is given."""
    if not torch_release.fuses_rms_norm(torch_release.modelled() if version is None else version):
        while _LIBRARY:
            _LIBRARY.pop()._destroy()
        return False
    if not _LIBRARY:
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("_fused_rms_norm", rms_norm, "CUDA")
        _LIBRARY.append(lib)
    return True


def rms_norm_backward(
    grad: torch.Tensor,
    input: torch.Tensor,
    normalized_shape: Sequence[int],
    rstd: torch.Tensor,
    weight: torch.Tensor | None,
    output_mask: Sequence[bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Gradients of y = x * rstd * w, rstd = (mean(x^2) + eps)^(-1/2) over the trailing `normalized_shape` dims:
    dx = rstd * (g w - x rstd^2 mean(g w x)), dw = sum over the leading dims of g x rstd (in fp32 for half inputs)."""
    dims = tuple(range(input.dim() - len(normalized_shape), input.dim()))
    lead = input.shape[: input.dim() - len(normalized_shape)]
    acc = lstm_cell.accumulation(input.dtype)
    x, g = input.to(acc), grad.to(acc)
    r = rstd.to(acc).reshape(*lead, *([1] * len(normalized_shape)))
    gw = g * weight.to(acc) if weight is not None else g
    dx = dw = None
    if output_mask[0]:
        dx = (r * (gw - x * r * r * (gw * x).mean(dims, keepdim=True))).to(input.dtype)
    if output_mask[1] and weight is not None:
        dw = (g * x * r).sum(tuple(range(len(lead)))).to(weight.dtype)
    return dx, dw


def join_inputs(s: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    """Session `s` waits for the collectives in flight on the memory of a tensor among `args` and `kwargs` (a
    simulated-GPU tensor's data or a plain one, in lists too), as a GPU's stream order makes a kernel wait: the
    internal ops of a one-kernel op skip the wait that each op of the program takes (dispatch.py), so it is taken
    here, once, before them."""
    if s.by_storage:
        s.join_tensors(getattr(x, "elem", x) for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor))


def one_kernel(func: Any, compute: Callable[..., Any], cost: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """`compute` (several torch ops on the data) charged as the single kernel `func`: it first waits for the
    collectives still writing or reading its tensors (`join_inputs`), its ops run as the session's own (uncharged),
    then `func` is charged by the compute model (or `cost(model, func, args, kwargs, out)`) and its outputs counted
    in device memory."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        s = _current()
        if s is None:
            return compute(*args, **kwargs)
        join_inputs(s, args, kwargs)
        with s.internal():
            out = compute(*args, **kwargs)
        if s.memory.enabled:
            s.memory.on_outputs(out, func)
        if cost is None:
            charged = s.model.cost(func, args, kwargs, out)
        else:
            with s.internal():  # what it reads of the arguments (their values) is no kernel
                charged = cost(s.model, func, args, kwargs, out)
        s.charge(str(func.overloadpacket), charged)
        return out

    return kernel


SOFTMAX = torch.ops.aten._softmax.default
LOG_SOFTMAX = torch.ops.aten._log_softmax.default
SOFTMAX_BACKWARD = torch.ops.aten._softmax_backward_data.default
LOG_SOFTMAX_BACKWARD = torch.ops.aten._log_softmax_backward_data.default


def _widened_forward(func: Any) -> Callable[..., Any]:
    """`func` (softmax or log-softmax) of a half input to a float output, as CUDA's one kernel does
    (`half_to_float`): the input read as fp32 and the op computed in fp32, which the CPU kernel can do."""

    def compute(input: torch.Tensor, dim: int, half_to_float: bool) -> torch.Tensor:
        return func(input.float() if half_to_float else input, dim, False)

    return compute


def _widened_backward(func: Any) -> Callable[..., Any]:
    """The backward of a `half_to_float` softmax or log-softmax: fp32 gradient and output in, the gradient of the
    half input out, computed in fp32 (CUDA's kernel writes its fp32 accumulation as the input's dtype)."""

    def compute(grad_output: torch.Tensor, output: torch.Tensor, dim: int, input_dtype: torch.dtype) -> torch.Tensor:
        return func(grad_output, output, dim, grad_output.dtype).to(input_dtype)

    return compute


HALF_TO_FLOAT: dict[Any, Callable[..., Any]] = {
    f: one_kernel(f, _widened_forward(f)) for f in (SOFTMAX, LOG_SOFTMAX)
} | {f: one_kernel(f, _widened_backward(f)) for f in (SOFTMAX_BACKWARD, LOG_SOFTMAX_BACKWARD)}
"""Ops whose CUDA kernel takes an fp16 input to an fp32 output, or back, in one kernel, and how they run on a
simulated-GPU tensor's data then. `F.softmax(x, dtype=torch.float32)` and `F.log_softmax` of an fp16 cuda tensor,
and fp16 autocast's softmax and log-softmax (which it runs in fp32), call ``_softmax(x, dim, half_to_float=True)``
(ATen's SoftMax.cpp: only for a cuda input); the CPU kernel refuses that ("softmax with half to float conversion
is not supported on CPU"). Charged as the one CUDA kernel, on its own arguments (`widened`)."""


def widened(func: Any, args: tuple, kwargs: dict[str, Any]) -> Callable[..., Any] | None:
    """The kernel of `HALF_TO_FLOAT` that runs `func` on `args` (the data of simulated-GPU tensors), or None when
    the CPU kernel takes them itself: no dtype conversion asked, or meta data (phantom mode)."""
    kernel = HALF_TO_FLOAT.get(func)
    if kernel is None or not args or not isinstance(args[0], torch.Tensor) or args[0].is_meta:
        return None
    if func is SOFTMAX or func is LOG_SOFTMAX:
        convert = args[2] if len(args) > 2 else kwargs.get("half_to_float", False)
    else:
        convert = args[0].dtype != (args[3] if len(args) > 3 else kwargs.get("input_dtype", args[0].dtype))
    return kernel if convert else None


_NESTED_FACTORIES = (
    "_nested_tensor_from_mask",
    "_nested_tensor_from_tensor_list",
    "_nested_from_padded",
    "_nested_from_padded_and_nested_example",
    "_nested_view_from_buffer",
    "_nested_view_from_jagged",
)


def _refuse_nested(func: Any) -> Callable[..., Any]:
    """A kernel that stops the run in one line: a nested tensor on the simulated GPU is not simulated (its wrapper
    has one shape; torch's error would be "NestedTensorImpl doesn't support sizes")."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotSimulatedError(
            f"{func} makes a nested tensor, which the simulated GPU does not hold (nn.TransformerEncoder's inference "
            "fast path makes one from a padding mask: build it with enable_nested_tensor=False, and its fast path runs "
            "on the padded batch, or call torch.backends.mha.set_fastpath_enabled(False))"
        )

    return refuse


NESTED: dict[Any, Callable[..., Any]] = {
    op: _refuse_nested(op) for op in (getattr(torch.ops.aten, name).default for name in _NESTED_FACTORIES)
}
"""The ops that make a nested tensor from simulated-GPU tensors, each refused in one line (`_refuse_nested`)."""


_CTC_CHECKS = (torch.ops.aten._use_cudnn_ctc_loss, torch.ops.aten._use_miopen_ctc_loss)


def _no_cudnn(*args: Any, **kwargs: Any) -> bool:
    """``_use_cudnn_ctc_loss``'s (and ``_use_miopen_ctc_loss``'s) answer without cuDNN (this CPU build has none):
    `F.ctc_loss` runs torch's own CTC kernels, computed on the data. The question is a host check: no kernel, nothing
    charged."""
    return False


def _out_dtype_product(name: str) -> Callable[..., Any]:
    """``aten.<name>.dtype`` / ``.dtype_out`` (mm, bmm, addmm, baddbmm with ``out_dtype``: fp16 / bf16 operands, a
    product accumulated and returned in fp32, CUDA kernels only) on the data: the fp32 product of the operands'
    values, which a GPU's fp32 accumulation computes up to summation order, cast to ``out_dtype``."""
    plain = getattr(torch.ops.aten, name).default
    inputs = 2 if name in ("mm", "bmm") else 3

    def kernel(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = kwargs.pop("out", None)
        operands, out_dtype = args[:inputs], args[inputs]
        result = plain(*(t.float() for t in operands), **kwargs).to(out_dtype)
        return result if out is None else out.copy_(result)

    return kernel


def _out_dtype_cost(name: str) -> Callable[..., Any]:
    """The charge of a product with ``out_dtype``: the compute model's plain ``aten.<name>`` of the same operands and
    output (torch's FLOP formulas take no ``out_dtype`` argument)."""
    plain = getattr(torch.ops.aten, name).default
    inputs = 2 if name in ("mm", "bmm") else 3

    def cost(model: Any, func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
        rest = {k: v for k, v in kwargs.items() if k != "out"}
        return model.cost(plain, args[:inputs], rest, out)

    return cost


OUT_DTYPE_PRODUCTS = {
    op: one_kernel(op, _out_dtype_product(name), _out_dtype_cost(name))
    for name in ("mm", "bmm", "addmm", "baddbmm")
    for op in (getattr(torch.ops.aten, name).dtype, getattr(torch.ops.aten, name).dtype_out)
}


KERNELS: dict[Any, Callable[..., Any]] = {
    **NESTED,
    **OUT_DTYPE_PRODUCTS,
    **{getattr(packet, o): _no_cudnn for packet in _CTC_CHECKS for o in packet.overloads()},
    **attention.KERNELS,
    attention.EFFICIENT: one_kernel(attention.EFFICIENT, attention.efficient_forward),
    attention.EFFICIENT_BACKWARD: one_kernel(attention.EFFICIENT_BACKWARD, attention.efficient_backward),
    RMS_NORM: one_kernel(RMS_NORM, rms_norm),
    RMS_NORM_BACKWARD: one_kernel(RMS_NORM_BACKWARD, rms_norm_backward),
    varlen.FORWARD: one_kernel(varlen.FORWARD, varlen.forward, varlen.cost),
    varlen.BACKWARD: one_kernel(varlen.BACKWARD, varlen.backward, varlen.cost),
    **{op: one_kernel(aten_op, run, charge) for op, (aten_op, run, charge) in varlen.CUSTOM_OPS.items()},
    flash_kernels.FORWARD: one_kernel(flash_kernels.FORWARD, flash_kernels.forward, flash_kernels.cost),
    flash_kernels.BACKWARD: one_kernel(flash_kernels.BACKWARD, flash_kernels.backward, flash_kernels.cost),
    lstm_cell.FORWARD: one_kernel(lstm_cell.FORWARD, lstm_cell.forward),
    lstm_cell.BACKWARD: one_kernel(lstm_cell.BACKWARD, lstm_cell.backward),
    lstm_cell.GRU_FORWARD: one_kernel(lstm_cell.GRU_FORWARD, lstm_cell.gru_forward),
    lstm_cell.GRU_BACKWARD: one_kernel(lstm_cell.GRU_BACKWARD, lstm_cell.gru_backward),
    scaled_grouped.OP: one_kernel(scaled_grouped.OP, scaled_grouped.forward),
}
"""The CUDA-only ops and how they run on the data of a simulated-GPU tensor (on meta data too, so that real
and phantom mode charge the same op)."""
