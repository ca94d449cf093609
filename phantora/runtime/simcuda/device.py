"""Installing the simulated CUDA device in a rank process.

`install(gpu, device_count, phantom)` (the rank bootstrap calls it, unless ``--no-sim-cuda``):

- registers a CUDA device guard (guard.cc, built once and cached), so ``.to("cuda")`` and the
  autograd engine accept cuda tensors;
- makes `torch.cuda` answer as the simulated GPU (api.py: devices, properties from the GPU table,
  streams and events on the virtual clock, memory from the simulated device memory);
- makes ``device="cuda"`` produce `SimCudaTensor` (tensor.py): cuda tensors whose data is a CPU
  tensor (real mode) or a meta tensor (phantom mode); the dispatch mode charges their ops;
- routes ``"nccl"`` and the CUDA half of ``"cuda:nccl,cpu:gloo"`` to the phantora backend.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import torch
import torch.jit._builtins as jit_builtins
from torch.utils._pytree import tree_map

from phantora.runtime import fusion, import_hooks, phantom_mode
from phantora.runtime.simcuda import (  # noqa: F401 - rng: dispatch.py draws with it
    api,
    checkpoint,
    cuda_only,
    guard,
    nccl_surface,
    pinned,
    profiler_cuda,
    rng,
    sdpa_op,
    simapex,
    simflash,
    toolkit,
)
from phantora.runtime.simcuda.tensor import (
    SimCudaTensor,
    _module_moves_in_place,
    cuda_index,
    cuda_seen,
    device_work,
    direct,
    inner_device,
    is_cuda_device,
    local,
    on_device,
    patch_set_data,
    set_inner_device,
    unwrap,
    wrap,
)

__all__ = [
    "SimCudaTensor",
    "active",
    "cuda_index",
    "cuda_seen",
    "device_work",
    "direct",
    "on_device",
    "inner_device",
    "install",
    "is_cuda_device",
    "local",
    "unwrap",
    "wrap",
]

_installed = False


def active() -> bool:
    """True once this process simulates a CUDA device."""
    return _installed


def install(gpu: Any, device_count: int, phantom: bool) -> None:
    """Simulate `device_count` CUDA GPUs of type `gpu` (a phantora.perfmodel.gpus.GpuSpec) in this process."""
    global _installed
    guard.load(device_count)  # loaded before torch by preload.py; this sets the device count
    api.install(gpu, device_count)
    toolkit.install(api.CUDA_VERSION)  # CUDA_HOME, nvcc --version: the simulated machine's toolkit
    simapex.install()  # `import apex` finds a simulated apex where none is installed
    simflash.install()  # `import flash_attn_interface` (FA3) and `flash_attn` (FA2) likewise
    nccl_surface.install()  # dist.is_nccl_available(), dist.ProcessGroupNCCL.Options
    set_inner_device(torch.device("meta") if phantom else torch.device("cpu"))
    # The autograd engine would run the backward of cuda tensors on its own device threads; the rank's
    # dispatch mode charges only the rank's own thread, so backward runs on the calling thread.
    torch._C._set_multithreading_enabled(False)
    _run_compiled_code_eagerly()
    if _installed:
        return
    _patch_host_entry_points()
    _patch_fsdp_storage()
    import_hooks.after_import("torch.distributed.fsdp._init_utils", _fsdp1_sees_plain_cuda)
    patch_set_data()
    checkpoint.install()  # torch.load onto the simulated GPU
    phantom_mode.use_fused_attention()  # a GPU runs SDPA as one flash kernel, in real and phantom mode alike
    sdpa_op.install()  # also when a graph (torch.export's) calls the aten op itself
    cuda_only.register_fused_rms_norm()  # and RMSNorm as one fused kernel each way, from torch 2.9
    profiler_cuda.install()  # torch.profiler asked for CUDA: CPU ops only, said once
    _foreach_takes_simulated_tensors()
    _installed = True


def _foreach_takes_simulated_tensors() -> None:
    """torch's optimizers and `clip_grad_norm_` at their defaults take the multi-tensor foreach kernels only for
    parameter types on two lists, as a CUDA build does for its cuda tensors; DTensor joins them the same way."""
    from torch.optim import optimizer
    from torch.utils import _foreach_utils

    lists: tuple[list[Any], ...] = (optimizer._foreach_supported_types, _foreach_utils._foreach_supported_types)
    for supported in lists:
        if SimCudaTensor not in supported:
            supported.append(SimCudaTensor)


def _run_compiled_code_eagerly() -> None:
    """The simulated GPU has no compiler: `torch.compile` runs the program eagerly, its values the eager ones; its
    kernels are timed as Inductor's fused ones (runtime/fusion.py). Dynamo reads the switch at each call."""
    os.environ["TORCH_COMPILE_DISABLE"] = "1"
    config = sys.modules.get("torch._dynamo.config")
    if config is not None:
        config.disable = True
    if not getattr(torch.compile, "_phantora", False):
        torch.compile = _eager_compile(torch.compile)  # type: ignore[assignment]


def _eager_compile(compile_fn: Any) -> Any:
    """`torch.compile` with the eager backend: nothing is compiled anyway, and the default backend's set-up
    imports the inductor compiler (seconds per process; DeepSpeed calls torch.compile as it is imported). What it
    returns is a compiled region for the fusion layer (runtime/fusion.py) unless PHANTORA_COMPILE_FUSION=off."""

    told: list[bool] = []
    fused = fusion.enabled()

    @functools.wraps(compile_fn)
    def compile_eagerly(model: Any = None, **kwargs: Any) -> Any:
        if not told:  # once per process: the program (or a framework it imports) asked for compilation
            told.append(True)
            print(
                "phantora: torch.compile runs eagerly on the simulated GPU: "
                + (
                    "its kernel fusion is modelled (pointwise and reduction ops timed as Inductor's fused kernels; "
                    f"{fusion.ENV}=off times them op by op; CUDA graphs and max-autotune's templates are not)"
                    if fused
                    else f"each aten op is timed by the compute model ({fusion.ENV}=off: kernel fusion not modelled)"
                ),
                file=sys.stderr,
                flush=True,
            )
        # fullgraph=True asks that everything be compiled; nothing is, and torch then refuses the call ("found no
        # compiled frames": torch's own context parallelism compiles create_block_mask so)
        inductor = kwargs.get("backend", "inductor") == "inductor"  # what the program asked for
        kwargs.update(backend="eager", mode=None, options=None, fullgraph=False)
        if model is not None:
            out = compile_fn(model, **kwargs)
            return fusion.compiled(out, inductor) if fused else out
        decorate = compile_fn(**kwargs)
        if not fused:
            return decorate
        return functools.wraps(decorate)(lambda fn: fusion.compiled(decorate(fn), inductor))

    compile_eagerly._phantora = True  # type: ignore[attr-defined]
    return compile_eagerly


def _patch_host_entry_points() -> None:
    """Entry points that build a tensor without going through the dispatch mode (torch.tensor & co)."""
    for name in ("tensor", "as_tensor", "asarray"):
        orig = getattr(torch, name, None)
        if orig is None:
            continue
        torch.__dict__[name] = made = _on_host_then_move(orig)
        op = jit_builtins._find_builtin(orig)
        if op is not None:  # TorchScript calls the aten op for it, as for torch's own (not a Python function to
            jit_builtins._register_builtin(made, op)  # compile, whose `__wrapped__` it cannot read the source of)
    _host_tolist = torch.Tensor.tolist
    torch.Tensor.tolist = lambda self: _host_tolist(_to_host(self))  # type: ignore[method-assign]  # a copy and a sync, as on a GPU
    # the caching allocator's cross-stream reuse is not modelled: a block is free when its tensor is
    torch.Tensor.record_stream = lambda self, stream: None  # type: ignore[method-assign,assignment]
    torch.Tensor.pin_memory = lambda self, device=None: pinned.mark(self)  # type: ignore[method-assign,arg-type]
    torch.Tensor.is_pinned = lambda self, device=None: pinned.is_pinned(self)  # type: ignore[method-assign,arg-type]


def _on_host_then_move(orig: Any) -> Any:
    @functools.wraps(orig)
    def make(*args: Any, **kwargs: Any) -> Any:
        dev = kwargs.get("device")
        if dev is None:  # a device context (`with torch.device("meta")`, set_default_device) names it
            dev = _context_device()
            if dev is not None:
                kwargs["device"] = dev
        if args:  # torch reads tensors inside the data with Python dispatch off: bring them to the host first
            args = (tree_map(_to_host, args[0]), *args[1:])
        if not is_cuda_device(dev):
            return orig(*args, **kwargs)
        kwargs["device"] = "cpu"
        requires_grad = kwargs.pop("requires_grad", False)
        host = orig(*args, **kwargs)
        if torch._C._functorch.maybe_current_level() is not None:
            # inside vmap / grad (FlexAttention's mask and score functions, torch's context parallelism) the
            # dispatch mode is not consulted for a tensor no transform wraps, so `.to(dev)` would reach torch's own
            # CUDA backend: wrap the host data as the simulated-GPU tensor directly (a small constant, uncharged)
            out = SimCudaTensor(host, cuda_index(dev))
        else:
            out = host.to(dev)
        return out.requires_grad_(True) if requires_grad else out

    return make


def _context_device() -> torch.device | None:
    """The device a device context or `torch.set_default_device` gives factories, or None (the CPU).

    torch's device context adds ``device=`` to the calls of the functions it listed when it was first used. The
    wrapper of `_on_host_then_move` is not a torch function, so the context never sees a call of it, and its call
    of the original is not one the context lists: without this, `torch.tensor([])` inside ``with
    torch.device("meta")`` made a CPU tensor (transformers' `from_pretrained` asks that to know whether it builds
    on meta; it then ran the rotary embedding's initialisation on meta buffers and left them uninitialised).
    """
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext

    for mode in reversed(_get_current_function_mode_stack()):  # what torch.get_default_device reads (which calls
        if isinstance(mode, DeviceContext):  # torch.tensor for an index-less device: this wrapper again)
            return None if mode.device.type == "cpu" else mode.device
    return None


def _to_host(x: Any) -> Any:
    """A simulated-GPU tensor read on the host (a copy and a sync). A phantom scalar, as `torch.tensor([norms])`
    reads its elements (Megatron's grad norm without apex), reads as `.item()` does: `scalar_placeholder`."""
    if not isinstance(x, SimCudaTensor):
        return x
    host = x.to("cpu")
    if host.is_meta and host.dim() == 0:
        return torch.tensor(phantom_mode.scalar_placeholder(x), dtype=x.dtype)
    return host


def _fsdp1_sees_plain_cuda(module: Any) -> None:
    """FSDP1's `sync_module_states` (HF Accelerate's FSDP1 sets it) collects a module's states and takes a traceable
    tensor subclass's inner tensors: a simulated-GPU tensor's are host tensors, so FSDP refused the module as holding
    CPU parameters. There it sees a simulated-GPU tensor as the plain CUDA tensor it stands for."""
    module.is_traceable_wrapper_subclass = _module_moves_in_place


def _patch_fsdp_storage() -> None:
    """FSDP2 frees and refills unsharded parameters with ``untyped_storage().resize_()``: do it on the data."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
    except ImportError:
        return

    def on_data(fn: Any) -> Any:
        @functools.wraps(fn)
        def run(tensor: torch.Tensor) -> None:
            fn(local(tensor))

        return run

    alloc, free = on_data(_fsdp_param.alloc_storage), on_data(_fsdp_param.free_storage)
    _fsdp_param.alloc_storage, _fsdp_param.free_storage = alloc, free
    if hasattr(_fsdp_param_group, "alloc_storage"):
        _fsdp_param_group.alloc_storage = alloc
