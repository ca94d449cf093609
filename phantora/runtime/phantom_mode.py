"""Phantom mode: ranks run on meta tensors, so a 70B model costs no host memory and no real FLOPs.

`enable()` (the rank bootstrap calls it under `phantora run --phantom`) makes `meta` the default
device, so models and data a script builds without an explicit device are shapes without
storage. Every aten op is still dispatched and charged to the virtual clock by the GPU model
(shapes and dtypes are all it reads), collectives are simulated without moving data, and the
simulated device memory counts the meta storages as if they lived on the GPU.

What cannot work without values is never answered silently wrong:
- `.item()` (and `float(t)`, `print(loss)` formatting) of a floating-point tensor returns NaN,
  a placeholder that cannot be mistaken for a real loss;
- `.item()`, `bool()`, `.tolist()` of an integer or boolean tensor, which usually drives control
  flow (`if mask.any():`), raises `PhantomValueError` naming the op;
- ops whose output shape depends on values (`nonzero`, a boolean index, `unique`) raise `PhantomValueError` naming
  the call, or assume a size if `PHANTORA_PHANTOM_SHAPES` says so (data_shapes.py).

FSDP2 refuses to train meta parameters (it expects `to_empty()` first); in phantom mode its check
is lifted, since the parameters stand for GPU memory that the simulation never touches. DDP's two
value-reading steps (the shape check across ranks, the bucket rebuild) do not read values
(`_ddp_on_meta`): the shape check's collectives run, its comparison is skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from phantora.errors import PhantomValueError  # defined there, raised here and in data_shapes.py

_enabled = False


def enabled() -> bool:
    """True when this rank runs in phantom mode."""
    return _enabled


_default_context: Any = None  # the DeviceContext that torch.set_default_device("meta") made


def unplaced_tensors_on_host() -> None:
    """From now on, tensors made without a device are host (CPU) tensors: a CUDA program's data loading.

    Besides dropping the default device, the context object itself is turned to the CPU: a program's
    ``with torch.device("meta")`` block that was open meanwhile puts that object back when it exits.
    """
    if _default_context is not None:
        _default_context.device = torch.device("cpu")
    if torch.get_default_device().type == "meta":
        torch.set_default_device(None)


def enable() -> None:
    """Switch this process to phantom mode (idempotent)."""
    global _enabled
    if _enabled:
        return
    _enabled = True
    torch.set_default_device("meta")
    global _default_context
    _default_context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    from phantora.runtime.simcuda.tensor import on_first_cuda_tensor
    from phantora.runtime.simcuda.tied_params import keep_ties

    on_first_cuda_tensor(unplaced_tensors_on_host)  # a CUDA program's unplaced tensors are host data
    keep_ties()  # host parameters are meta tensors, which torch replaces on a move instead: ties broke
    _allow_fsdp_meta_params()
    use_fused_attention()
    _trunc_normal_without_rejection()
    _ddp_on_meta()
    _tolist_on_meta()
    _masked_softmax_on_meta()
    from phantora.runtime import data_shapes, object_values, phantom_dcp, phantom_pipelining

    data_shapes.enable()  # nonzero, a boolean index, unique ...: a size assumed, or one line naming the call

    object_values.enable()  # torch's object collectives carry real values (the value channel)
    phantom_pipelining.enable()  # and a pipeline schedule's warm-up vote
    phantom_dcp.enable()


def _allow_fsdp_meta_params() -> None:
    """Lift FSDP2's 'parameters must be materialized' check: meta parameters are the point here."""
    try:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    except ImportError:  # FSDP2 not in this torch build: nothing to lift
        return
    FSDPParamGroup._validate_no_meta_params = lambda self: None  # type: ignore[method-assign]


def use_fused_attention() -> None:
    """Make `F.scaled_dot_product_attention` run the kernel a GPU would (idempotent).

    On the simulated GPU (plain tensors and DTensors whose shards are on it) the backend is torch's CUDA choice
    for the simulated GPU's arch (simcuda/sdp_choice.py: flags, `sdpa_kernel` contexts, dtype, head dim, mask,
    causal lengths, GQA): flash runs the GPU's flash op (DTensor has its sharding rule) or the CPU flash op on plain
    data, efficient runs ``_scaled_dot_product_efficient_attention`` (DTensor has its rule too), cudnn runs as
    flash (cuDNN's fused attention timed as the flash kernel), math runs torch's composite, each op charged.
    On other meta tensors (phantom CPU programs) torch would pick the unfused math path, materialising the
    seq x seq scores; the fused CPU flash op has meta kernels and the same FLOPs, so it runs instead.
    """
    import torch.nn.functional as F

    orig = F.scaled_dot_product_attention
    if getattr(orig, "_phantora", False):
        return
    from phantora.runtime.simcuda import sdp_choice

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    gpu_flash = torch.ops.aten._scaled_dot_product_flash_attention
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention

    def sdpa(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        dtensor = _dtensor_on_device(query)
        if dtensor or _on_simulated_gpu(query):
            params = sdp_choice.SdpParams(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
            backend = sdp_choice.choose(params, _capability())
            if backend == sdp_choice.EFFICIENT:
                grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
                bias = _additive_bias(attn_mask, query.dtype)
                return efficient(query, key, value, bias, grad, dropout_p, is_causal, scale=scale)[0]
            groups = query.shape[-3] // key.shape[-3]
            if dtensor and backend != sdp_choice.MATH and enable_gqa and groups > 1:
                # DTensor's flash rule takes equal head counts: shared key/value heads copied out (a GPU's flash
                # kernel reads them in place; CP's ring then moves the copies, `groups` times their bytes)
                key, value = (t.repeat_interleave(groups, dim=-3) for t in (key, value))
            if backend == sdp_choice.MATH or (dtensor and query.shape[-3] != key.shape[-3]):
                return orig(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
            if dtensor:  # DTensor's sharding rule is the GPU's flash op (simcuda/attention.py runs it on the data)
                return gpu_flash(query, key, value, dropout_p, is_causal, scale=scale)[0]
        elif not (query.is_meta and attn_mask is None and query.dim() == 4 and key.dim() == 4):
            return orig(query, key, value, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)
        groups = query.shape[-3] // key.shape[-3]
        if groups > 1 and enable_gqa:  # the flash kernel reads shared KV heads in place: no copy on a GPU
            key = key.unsqueeze(-3).expand(*key.shape[:-2], groups, *key.shape[-2:]).flatten(-4, -3)
            value = value.unsqueeze(-3).expand(*value.shape[:-2], groups, *value.shape[-2:]).flatten(-4, -3)
        return flash(query, key, value, dropout_p, is_causal, scale=scale)[0]

    sdpa._phantora = True  # type: ignore[attr-defined]
    # torch's context_parallel patches the function by its __name__ (`setattr(F, fn.__name__, wrapper)`, _attention.py
    # `_distribute_function`): under another name it patched `F.sdpa`, and CP's attention ran on each rank's shard alone
    sdpa.__name__, sdpa.__qualname__ = orig.__name__, orig.__qualname__
    F.scaled_dot_product_attention = sdpa
    _FUSED.append(sdpa)


_FUSED: list[Callable[..., torch.Tensor]] = []  # the function use_fused_attention installed, whoever wraps it later


def fused_attention() -> Callable[..., torch.Tensor]:
    """phantora's `F.scaled_dot_product_attention` (use_fused_attention's), not a wrapper put over it later (CP's
    `context_parallel` wraps it to take plain tensors only); torch's own before it is installed."""
    import torch.nn.functional as F

    return _FUSED[0] if _FUSED else F.scaled_dot_product_attention


def _capability() -> tuple[int, int]:
    """The simulated GPU's compute capability."""
    from phantora.runtime.simcuda import api

    major, minor = api._gpu().capability
    return int(major), int(minor)


def _additive_bias(mask: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """A boolean mask as the additive bias the fused kernels take (torch's `convert_boolean_attn_mask`)."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros_like(mask, dtype=dtype).masked_fill(mask.logical_not(), float("-inf"))


def _dtensor_on_device(t: torch.Tensor) -> bool:
    """Is `t` a DTensor whose shards are on the simulated GPU or phantom (meta)?"""
    from torch.distributed.tensor import DTensor

    if not isinstance(t, DTensor):
        return False
    shard = t._local_tensor
    return shard.is_meta or _on_simulated_gpu(shard)


def _on_simulated_gpu(t: torch.Tensor) -> bool:
    from phantora.runtime.simcuda.tensor import SimCudaTensor

    return isinstance(t, SimCudaTensor)


def _trunc_normal_without_rejection() -> None:
    """`nn.init.trunc_normal_` redraws the values outside [a, b] until there are none, a loop on tensor
    values. Phantom tensors have none: draw once and clamp (an initialisation's cost is not the point)."""
    init = torch.nn.init
    orig = init.trunc_normal_
    if getattr(orig, "_phantora", False):
        return

    def trunc_normal_(tensor: torch.Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                      generator: torch.Generator | None = None) -> torch.Tensor:  # fmt: skip
        with torch.no_grad():
            return tensor.normal_(mean, std, generator=generator).clamp_(a, b)

    trunc_normal_._phantora = True  # type: ignore[attr-defined]
    init.trunc_normal_ = trunc_normal_


def _ddp_on_meta() -> None:
    """Let DistributedDataParallel run on meta tensors.

    Its constructor checks that every rank has the same parameter shapes by comparing values
    (SPMD ranks do; phantom tensors have none to compare): the comparison is skipped, the check's
    collectives still run (`_shape_check_traffic`). Its bucket rebuild exchanges bucket indices
    through a host tensor: see `copy_to_host`.
    """
    import torch.nn.parallel.distributed as ddp

    if getattr(ddp.DistributedDataParallel, "_phantora", False):
        return
    ddp._verify_param_shape_across_processes = _shape_check_traffic
    ddp.DistributedDataParallel._phantora = True  # type: ignore[attr-defined]


def _shape_check_traffic(process_group: Any, tensors: list[torch.Tensor], logger: Any = None) -> None:
    """The collectives of torch's `verify_params_across_processes`, without its comparison of values: an
    all-gather of each rank's parameter count (one int64), then a broadcast from the group's first rank of
    every parameter's sizes and strides (2 x dim int64 each)."""
    import torch.distributed as dist

    if not tensors:
        return
    device = tensors[0].device
    count = torch.empty(1, dtype=torch.long, device=device)
    dist.all_gather([torch.empty_like(count) for _ in range(process_group.size())], count, group=process_group)
    shapes = torch.empty(sum(2 * t.dim() for t in tensors), dtype=torch.long, device=device)
    dist.broadcast(shapes, dist.get_global_rank(process_group, 0), group=process_group)


_META_LIBRARY: torch.library.Library | None = None


def _masked_softmax_on_meta() -> None:
    """Meta kernels for `torch._masked_softmax` and its backward, which torch has only for CPU and CUDA.

    It is the fused mask-and-softmax kernel a GPU runs (one pass over the scores, as Megatron-LM's
    fused scale-mask-softmax); without a meta kernel a phantom program could not call it at all.
    """
    global _META_LIBRARY
    if _META_LIBRARY is not None:
        return
    lib = torch.library.Library("aten", "IMPL")

    def forward(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, kind: int | None = None) -> torch.Tensor:
        return torch.empty_like(x)

    def backward(grad: torch.Tensor, out: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
        return torch.empty_like(grad)

    lib.impl("_masked_softmax", forward, "Meta")
    lib.impl("_masked_softmax_backward", backward, "Meta")
    _META_LIBRARY = lib


def _tolist_on_meta() -> None:
    """`.tolist()` of a meta tensor, which torch refuses before any op is dispatched: NaN for every
    floating-point element (as `.item()`), `PhantomValueError` for integers and booleans."""
    if getattr(torch.Tensor.tolist, "_phantora", False):
        return
    original = torch.Tensor.tolist

    def tolist(self: torch.Tensor) -> Any:
        if self.device.type != "meta":
            return original(self)
        value = scalar_placeholder(self)
        with torch.utils._python_dispatch._disable_current_modes():
            return original(torch.full(self.shape, value, dtype=self.dtype, device="cpu"))

    tolist._phantora = True  # type: ignore[attr-defined]
    torch.Tensor.tolist = tolist  # type: ignore[method-assign]


def copy_to_host(dst: torch.Tensor) -> torch.Tensor:
    """`dst.copy_(meta)` for a host tensor `dst`: integers keep their own values, floats become NaN.

    Host integer tensors filled from a collective carry bookkeeping that is the same on every SPMD
    rank (DDP's bucket indices after their broadcast), so the rank's own values stand for its
    peers'. A floating-point value has no such stand-in: NaN, like `.item()`.
    """
    if dst.is_floating_point() or dst.is_complex():
        with torch.utils._python_dispatch._disable_current_modes():
            dst.fill_(math.nan)
    return dst


def scalar_placeholder(t: torch.Tensor) -> Any:
    """The value of `.item()` on a meta tensor: NaN for floating point, an error otherwise.

    In a program on the simulated CUDA device the floating-point placeholder is 0.0: the frameworks
    written for CUDA stop on a non-finite loss (torchtitan: "Loss is not finite").
    """
    from phantora.runtime.simcuda.tensor import cuda_seen

    fake = 0.0 if cuda_seen() else math.nan
    if t.is_floating_point():
        return fake
    if t.is_complex():
        return complex(fake, fake)
    raise no_values(
        f"the value of a {str(t.dtype).removeprefix('torch.')} tensor of shape {list(t.shape)} was asked for "
        "(.item(), bool(), .tolist(), a Python `if` on a tensor)"
    )


def no_values(what: str) -> PhantomValueError:
    """The error for a question about values (`what` was asked), which phantom tensors do not have."""
    return PhantomValueError(
        f"phantom mode: {what}; tensors have no values in phantom mode. Guard data-dependent code with "
        "`phantora.runtime.phantom()`, or run in real mode (without --phantom)."
    )
