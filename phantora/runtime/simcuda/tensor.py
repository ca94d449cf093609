"""Tensors on the simulated GPU: they report ``cuda:N``; their data lives in a CPU or meta tensor.

`SimCudaTensor` is a wrapper subclass (as DTensor is): ``.device`` is ``cuda:N`` and ``.is_cuda`` is
True, while the data is held by ``elem``: a CPU tensor in real mode (values are computed), a meta
tensor in phantom mode (shapes only). Every aten op on it is unwrapped and run on ``elem``, so the
rank's dispatch mode (dispatch.py) sees and charges the plain op, and the output is wrapped again.
Collectives (the ``c10d`` ops) keep their wrappers and go to the process group's CUDA backend,
which is phantora's (backend.py unwraps them), while CPU tensors still go to the CPU backend (gloo
for ``"cuda:nccl,cpu:gloo"``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten, tree_map

from phantora.perfmodel.gemm_layout import contiguous_strides
from phantora.runtime import data_shapes
from phantora.runtime.simcuda import composite, cuda_only, devices, guard, kept_values, lazy, list_index, rng
from phantora.runtime.simcuda.devices import NotSimulatedError

_PYTHON_KEY = torch._C.DispatchKeySet(torch._C.DispatchKey.Python)
_CUDA = tuple(torch.device("cuda", i) for i in range(64))  # made once: a new wrapper is made for every op's output
_TO_COPY = torch.ops.aten._to_copy.default
_INDEX = torch.ops.aten.index.Tensor
_IS_PINNED = torch.ops.aten.is_pinned.default
_PIN = torch.ops.aten._pin_memory.default
_STRIDED = torch.strided
_make_wrapper = torch.Tensor._make_wrapper_subclass
_GETITEM = torch.Tensor.__getitem__
_SETITEM = torch.Tensor.__setitem__
_SEQUENCES = list_index.SEQUENCES


class _DeviceIndex:
    """`SimCudaTensor._sim_index`'s fallback, a non-data descriptor: a wrapper made by `SimCudaTensor(...)` or
    `wrap_output` keeps its index in its own `__dict__`, which Python reads first; any other (one that became a
    SimCudaTensor in place) asks torch, as `get_device` does."""

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        return self if obj is None else obj.get_device()


class SimCudaTensor(torch.Tensor):
    """A tensor on simulated GPU ``cuda:index``; `elem` holds its data (CPU) or shape (meta); `_sim_index` is its
    device index (read without `get_device()`, a torch method call the fast path would pay on every op)."""

    elem: torch.Tensor
    _sim_index: int = _DeviceIndex()  # type: ignore[assignment]

    @staticmethod
    def __new__(cls, elem: torch.Tensor, index: int = 0) -> SimCudaTensor:  # noqa: ANN001 - cls of a staticmethod __new__
        if not _seen:
            _first_cuda_tensor()
        r = torch.Tensor._make_wrapper_subclass(
            cls,
            elem.size(),
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=_CUDA[index] if index < len(_CUDA) else torch.device("cuda", index),
            requires_grad=elem.requires_grad,
        )
        r.elem = elem
        r._sim_index = index
        return r

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"{self.elem!r}".replace("device='meta'", f"device='{self.device}'") + f" [simulated {self.device}]"

    def __format__(self, format_spec: str) -> str:
        """As torch formats a CUDA tensor: a 0-dim one as its number (`f"{loss:0.4f}"`, DeepSpeed's pipeline log);
        torch's own `Tensor.__format__` does so for the exact type `Tensor` only."""
        if self.dim() == 0:
            return self.detach().item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def __tensor_flatten__(self) -> tuple[list[str], int]:
        return ["elem"], self.device.index or 0

    @staticmethod
    def __tensor_unflatten__(inner: dict[str, torch.Tensor], index: int, size: Any, stride: Any) -> SimCudaTensor:
        return SimCudaTensor(inner["elem"], index)

    def data_ptr(self) -> int:
        """The data's address, as `untyped_storage()` is the data's storage (a wrapper has none: 0 before, and
        safetensors' `load_model` refused a tensor not covering its storage)."""
        return self.elem.data_ptr()

    def untyped_storage(self) -> torch.UntypedStorage:
        """The data's storage: programs compare storage pointers to find shared storage (HF's tied weights
        when it saves a checkpoint); the wrapper itself has none."""
        return self.elem.untyped_storage()

    def __getitem__(self, index: Any) -> Any:
        """As torch indexes, a list or numpy array index made a tensor on this device first (list_index.py)."""
        if type(index) in _SEQUENCES and list_index.needs_conversion(index):
            index = list_index.on_device(index, self.device)
        return _GETITEM(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        if type(index) in _SEQUENCES and list_index.needs_conversion(index):
            index = list_index.on_device(index, self.device)
        _SETITEM(self, index, value)

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(
        cls, func: Any, types: tuple[type, ...], args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        return run_op(func, args, kwargs or {})


def wrap_output(elem: torch.Tensor, index: int, shape: torch.Size, dtype: torch.dtype) -> SimCudaTensor:
    """`SimCudaTensor(elem, index)` for the output of an op on cuda tensors (fastpath.py), with fewer steps: no
    first-tensor check (its inputs were cuda tensors), `elem`'s shape and dtype as the caller read them, and the
    wrapper made directly, given only the metadata that differs from the defaults: its strides only when they are
    not the contiguous ones `_make_wrapper_subclass` computes itself (parsing them is a sixth of the wrapper's
    cost); a storage offset, another layout or requires_grad take the constructor's way."""
    if elem.requires_grad or elem.layout is not _STRIDED or elem.storage_offset() or index >= _N_CUDA:
        return SimCudaTensor(elem, index)
    strides = elem.stride()
    contiguous = _CONTIGUOUS.get(shape)
    if contiguous is None:
        contiguous = _contiguous_strides(shape)
    if strides == contiguous:
        r = _make_wrapper(SimCudaTensor, shape, dtype=dtype, device=_CUDA[index])
    else:
        r = _make_wrapper(SimCudaTensor, shape, strides=strides, dtype=dtype, device=_CUDA[index])
    r.elem = elem
    r._sim_index = index
    return r


_N_CUDA = len(_CUDA)
_CONTIGUOUS: dict[torch.Size, tuple[int, ...]] = {}  # shape -> its contiguous strides, for `wrap_output`
_CONTIGUOUS_MAX = 4096  # shapes kept (a program whose shapes keep changing starts the cache afresh)


def _contiguous_strides(shape: torch.Size) -> tuple[int, ...]:
    """The strides torch gives a contiguous tensor of `shape` (a dimension of size 0 or 1 counts as 1), cached."""
    if len(_CONTIGUOUS) >= _CONTIGUOUS_MAX:
        _CONTIGUOUS.clear()
    out = _CONTIGUOUS[shape] = contiguous_strides(shape)
    return out


_BASE_DATA = torch._C.TensorBase.data


def _get_data(self: torch.Tensor) -> torch.Tensor:
    return _BASE_DATA.__get__(self)


def _set_data(self: torch.Tensor, value: torch.Tensor) -> None:
    """`t.data = v` onto the simulated device (`module.to("cuda")` and FSDP2 move parameters this way).

    torch gives the object the simulated-GPU tensor's metadata but keeps its own dispatch keys and
    Python class. The object becomes a SimCudaTensor in place: the Python dispatch key, the class,
    and `elem`, the data. It keeps its identity (an optimizer made before the move still holds it,
    as DeepSpeed's does), its weak references, its `requires_grad` and its being a parameter
    (`isinstance` reads `_is_param`).
    """
    if isinstance(self, SimCudaTensor) and not isinstance(value, SimCudaTensor):
        if value.device.type != "cpu" or self.elem.is_meta:
            raise NotSimulatedError(
                "moving a simulated-GPU tensor off the device with `t.data = cpu_tensor` is simulated in real mode "
                "only, onto the host; use `t.to('cpu')` (a copy), or keep the tensor on the device"
            )
        _off_the_device(self, value)
        return
    _BASE_DATA.__set__(self, value)
    if not isinstance(value, SimCudaTensor):
        return
    if not isinstance(self, SimCudaTensor):
        was_param = isinstance(self, torch.nn.Parameter)
        guard.set_python_dispatch(self)
        self.__class__ = SimCudaTensor
        if was_param:
            self._is_param = True  # type: ignore[attr-defined]
    self.elem = value.elem  # type: ignore[attr-defined]
    self._sim_index = value._sim_index  # type: ignore[attr-defined]  # torch gave it the value's device


def _off_the_device(t: SimCudaTensor, value: torch.Tensor) -> None:
    """`t.data = host_tensor` on a simulated-GPU tensor (FSDP1 moves its flat parameter to the host for a full state
    dict, and back): the object becomes a host tensor in place, its class the plain one it stands for (a parameter
    stays one), and keeps its identity, as a CUDA tensor does."""
    _BASE_DATA.__set__(t, value)
    guard.clear_python_dispatch(t)
    t.__dict__.pop("elem", None)
    t.__class__ = torch.nn.Parameter if getattr(t, "_is_param", False) else torch.Tensor


def _module_moves_in_place(tensor: Any) -> bool:
    """`Module._apply`'s test for a subclass that needs `swap_tensors`: not a SimCudaTensor, which moves with
    `param.data = ...` as a real CUDA tensor does (swapping fails on weakly referenced parameters)."""
    return not isinstance(tensor, SimCudaTensor) and is_traceable_wrapper_subclass(tensor)


_SHALLOW_COPY_COMPATIBLE = torch._has_compatible_shallow_copy_type


def _module_moves_off_by_replacing(input: torch.Tensor, from_: torch.Tensor) -> bool:
    """`Module._apply`'s test for moving a parameter in place (`param.data = moved`). Off the simulated GPU
    (`module.cpu()`) the answer is no: the module gets a new host parameter, as torch does for a device whose
    tensors cannot share an implementation, since the object cannot stop being a simulated-GPU tensor.
    The parameters keep torch's names: torch._dynamo's polyfill of this function checks the signature when it is
    imported (a forked rank imports it after the patch)."""
    if isinstance(input, SimCudaTensor) and not isinstance(from_, SimCudaTensor):
        return False
    return bool(_SHALLOW_COPY_COMPATIBLE(input, from_))


def patch_set_data() -> None:
    """Route `Tensor.data` assignment through `_set_data` (phantom mode's `enable` keeps tied parameters tied)."""
    torch.Tensor.data = property(_get_data, _set_data)  # type: ignore[assignment,method-assign]
    torch.nn.modules.module.is_traceable_wrapper_subclass = _module_moves_in_place  # type: ignore[attr-defined]
    torch._has_compatible_shallow_copy_type = _module_moves_off_by_replacing  # type: ignore[assignment]


def is_cuda_device(dev: Any) -> bool:
    """Is `dev` (a device, string, index-less name, or an integer index, which torch takes as the accelerator's:
    `torch.tensor(n, device=torch.cuda.current_device())`) the simulated CUDA device?"""
    if dev is None or isinstance(dev, bool):
        return False
    if isinstance(dev, int):
        return dev >= 0
    if isinstance(dev, torch.device):
        return dev.type == "cuda"
    if isinstance(dev, str):
        return dev.startswith("cuda")
    return False


def cuda_index(dev: Any) -> int:
    """The device index of a cuda device spec (the current device when it has none)."""
    if isinstance(dev, int):
        return dev
    d = torch.device(dev) if not isinstance(dev, torch.device) else dev
    return devices.current_device() if d.index is None else d.index


_inner_device = torch.device("cpu")  # meta in phantom mode (set by install)
_seen = False  # has this process made a cuda tensor? From then on, CPU tensors are host data


def cuda_seen() -> bool:
    """True once the program has selected a device of the simulated GPU (`torch.cuda.set_device`) or put a
    tensor on it: it is a CUDA program.

    Until then its ops are charged as GPU work, as in scripts written for phantora's CPU stand-in
    (examples/gpt_ddp.py); from then on only the simulated GPU's ops are, and CPU tensors are the
    host's (data loading), neither charged nor counted as device memory.
    """
    return _seen


_first_cuda_listeners: list[Callable[[], None]] = []


def on_first_cuda_tensor(listener: Callable[[], None]) -> None:
    """Call `listener` when the program makes its first tensor on the simulated GPU (phantom mode listens)."""
    _first_cuda_listeners.append(listener)


def _first_cuda_tensor() -> None:
    global _seen
    _seen = True
    lazy.lazy_init()  # a cuda tensor, or a selected device, initialises CUDA
    for listener in _first_cuda_listeners:
        listener()


def program_uses_cuda() -> None:
    """The program selected a CUDA device: from now on it is a CUDA program (`cuda_seen`).

    So a model it builds on the meta device before its first cuda tensor (torchtitan, then `to_empty`) is
    bookkeeping, as on a GPU, not the simulated GPU's memory or work.
    """
    if not _seen:
        _first_cuda_tensor()


_device_depth = 0  # > 0 while an op of the simulated GPU runs on its data


def on_device() -> bool:
    """Is the op being dispatched now an op of the simulated GPU (not host work on CPU tensors)?"""
    return _device_depth > 0


class device_work:  # noqa: N801 - a context manager
    """Inside, plain-tensor ops are the simulated GPU's (run on a SimCudaTensor's data, or making one)."""

    def __enter__(self) -> None:
        global _device_depth
        _device_depth += 1

    def __exit__(self, *exc: Any) -> None:
        global _device_depth
        _device_depth -= 1


def set_inner_device(dev: torch.device) -> None:
    global _inner_device
    _inner_device = dev


def inner_device() -> torch.device:
    """Where simulated GPU data lives: cpu (real mode) or meta (phantom mode)."""
    return _inner_device


def wrap(out: Any, index: int) -> Any:
    """Wrap every plain tensor in `out` as a SimCudaTensor on ``cuda:index``."""
    return tree_map(lambda x: SimCudaTensor(x, index) if type(x) in _PLAIN else x, out)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def unwrap(x: Any) -> Any:
    """`x` with every SimCudaTensor replaced by its `elem` (nested lists, tuples, dicts)."""
    return tree_map(lambda t: t.elem if isinstance(t, SimCudaTensor) else t, x)


def unwrap_to_meta(x: Any) -> Any:
    """`unwrap`, with every elem on meta (an op mixing phantom tensors with ones that hold values)."""
    return tree_map(lambda t: t.elem.to("meta") if isinstance(t, SimCudaTensor) else t, x)


def local(t: torch.Tensor) -> torch.Tensor:
    """The tensor holding `t`'s data: its elem for a simulated CUDA tensor, else `t` itself."""
    return t.elem if isinstance(t, SimCudaTensor) else t


def _device_kwargs(kwargs: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    """kwargs with a cuda `device` replaced by the inner device, and the cuda index (None if not cuda)."""
    dev = kwargs.get("device")
    if not is_cuda_device(dev):
        return kwargs, None
    return {**kwargs, "device": _inner_device}, cuda_index(dev)


_NESTED = (list, tuple, dict)
# In-place ops that change their tensor's shape, strides, offset or storage (FSDP1 shards its flat parameter with
# `set_`): they run on the data, and the wrapper then takes its data's new metadata (`_take_metadata`).
HOST_OUTPUTS: dict[Any, frozenset[int]] = {
    torch.ops.aten._pack_padded_sequence.default: frozenset({1}),
    torch.ops.aten._pad_packed_sequence.default: frozenset({1}),
}
"""Ops whose CUDA kernel returns some outputs on the host, by index: they stay host tensors. A `PackedSequence`'s
`batch_sizes` is a CPU tensor whatever the data's device ("batch_sizes should always be on CPU", rnn.py), and so
are the lengths `pad_packed_sequence` returns."""

RESHAPED_IN_PLACE = frozenset(
    getattr(packet, name)
    for packet in (
        torch.ops.aten.set_,
        torch.ops.aten.resize_,
        torch.ops.aten.resize_as_,
        torch.ops.aten.as_strided_,
        torch.ops.aten.unsqueeze_,
        torch.ops.aten.squeeze_,
        torch.ops.aten.t_,
        torch.ops.aten.transpose_,
    )
    for name in packet.overloads()
)


def _take_metadata(t: SimCudaTensor) -> None:
    """The wrapper `t` takes its data's shape, strides, offset (an in-place op changed them on the data only)."""
    elem = t.elem
    if t.shape != elem.shape or t.stride() != elem.stride() or t.storage_offset() != elem.storage_offset():
        _BASE_DATA.__set__(t, SimCudaTensor(elem, t._sim_index))


def _as_meta(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """Flat arguments with each simulated CUDA tensor's data on meta (a probe of the op's output shapes)."""
    return tuple(_open(x, True) for x in args), {name: _open(v, True) for name, v in kwargs.items()}


def _open(x: Any, to_meta: bool) -> Any:
    if isinstance(x, SimCudaTensor):
        return x.elem.to("meta") if to_meta else x.elem
    return x


_DIRECT: dict[Any, bool] = {}


def direct(func: Any) -> bool:
    """Can the rank's dispatch mode run `func` on the data itself (`run_op` with `inner`)? Not collectives, which
    keep their wrappers, nor the CUDA-only ops whose kernels are Python functions that dispatch again, nor a
    composite that reached the device below autograd (composite.py: `run_op` dispatches its parts)."""
    known = _DIRECT.get(func)
    if known is None:
        known = _DIRECT[func] = (
            func.namespace not in ("c10d", "_c10d_functional")
            and func not in cuda_only.KERNELS
            and not composite.runs_as_parts(func)
        )
    return known


def run_op(
    func: Any, args: tuple, kwargs: dict[str, Any], inner: Callable[[Any, tuple, dict], Any] | None = None
) -> Any:
    """Run one aten op with SimCudaTensor arguments on their data, and wrap its tensor outputs.

    Most ops take flat arguments; those skip pytree (a third of the cost of an op otherwise). `inner(func, args,
    kwargs)`, if given, runs the unwrapped op (the dispatch mode's charging path, for an op that `direct` allows);
    otherwise the op goes through the dispatcher again.
    """
    if func.namespace == "c10d":  # collectives go to the process group's CUDA backend (phantora)
        with torch._C._ExcludeDispatchKeyGuard(_PYTHON_KEY):
            return func(*args, **kwargs)
    if composite.runs_as_parts(func):  # below autograd (a subclass's handler): its parts, as a CUDA tensor runs it
        return composite.run_parts(func, args, kwargs)
    nested = any(type(x) in _NESTED for x in args) or any(type(x) in _NESTED for x in kwargs.values())
    flat = tree_flatten((args, kwargs))[0] if nested else (*args, *kwargs.values())
    index = 0
    by_elem: dict[int, SimCudaTensor] = {}
    has_meta = has_data = False
    for x in flat:
        if isinstance(x, SimCudaTensor):
            index = x.device.index or 0
            by_elem[id(x.elem)] = x
            if x.elem.is_meta:
                has_meta = True
            else:
                has_data = True
        elif type(x) is torch.Tensor and x.is_meta:  # phantom data beside the wrappers (a mask function's index)
            has_meta = True
    if func is _IS_PINNED:
        return False
    if func is _PIN:
        return args[0]
    kwargs, to_index = _device_kwargs(kwargs)
    # A device other than the GPU asked for (`.cpu()`, `.to("cpu")`, `x.new_empty(n, device="cpu")`,
    # `torch.empty_like(x, device="cpu")`: DCP's staging of a state dict) gives a host tensor, as on a GPU.
    moved_off = "device" in kwargs and to_index is None and kwargs["device"] is not None
    # Phantom mode: integer data copied from the host keeps its values (token ids, labels), so that what a
    # program reads from them (a count of valid tokens) exists; an op that mixes them with phantom tensors
    # runs on meta.
    to_meta = has_meta and has_data
    if has_data and not has_meta and _inner_device.type == "meta":  # phantom mode, every tensor with values:
        to_meta = func not in data_shapes.OPS and kept_values.too_large(  # data_shapes: no size on meta
            func, *(unwrap_to_meta((args, kwargs)) if nested else _as_meta(args, kwargs))
        )
    if to_meta and func is _INDEX:  # phantom data indexed by a boolean mask with values: its count, exactly
        args = (args[0], data_shapes.exact_mask_indices(args[1]), *args[2:])
    if nested:
        a, k = (unwrap_to_meta if to_meta else unwrap)((args, kwargs))
    else:
        a = tuple(_open(x, to_meta) for x in args)
        k = {name: _open(v, to_meta) for name, v in kwargs.items()}
    phantom = _inner_device.type == "meta"
    kept = phantom and func in kept_values.OPS  # outputs that keep values in phantom mode (kept_values.py)
    run_func = func
    if kept and to_meta and func is kept_values.MASKED_SELECT and not nested:
        gather = kept_values.masked_select_as_gather(local(args[0]), local(args[1]))
        if gather is not None:
            run_func, a, k = gather
    if to_meta and phantom:  # phantom data written into a tensor with values: it becomes phantom
        a = _phantom_writes(func, args, kwargs, a, nested, by_elem)
    kernel = cuda_only.KERNELS.get(run_func, run_func)  # a CUDA-only op: its kernel on the data
    if run_func in cuda_only.HALF_TO_FLOAT and (widened := cuda_only.widened(run_func, a, k)) is not None:
        kernel, inner = widened, None  # an fp16 -> fp32 softmax: one CUDA kernel, refused by the CPU's
    global _device_depth
    _device_depth += 1
    try:
        if rng.is_random(func) and kwargs.get("generator") is None:  # the device's generator (rng.py)
            run = (lambda: kernel(*a, **k)) if inner is None else (lambda: inner(func, a, k))
            out = rng.draw(index, _inner_device.type != "meta", run)
        elif inner is None:
            out = kernel(*a, **k)
        else:
            out = inner(run_func, a, k)
    finally:
        _device_depth -= 1
    if kept:
        out = kept_values.after(func, args, kwargs, out)
    if moved_off:  # .cpu(), .to("cpu"): a host tensor
        return out
    if func in RESHAPED_IN_PLACE and isinstance(args[0], SimCudaTensor):
        _take_metadata(args[0])
    dest = index if to_index is None else to_index

    def back(x: Any) -> Any:
        if type(x) not in _PLAIN:
            return x
        same = by_elem.get(id(x))  # an in-place op returns its input
        return same if same is not None else SimCudaTensor(x, dest)

    if type(out) in _PLAIN:
        wrapped = back(out)
        if kept and out.is_meta:
            kept_values.mark_fill(func, args, kwargs, wrapped)
        return wrapped
    if type(out) is tuple and not any(type(x) in _NESTED for x in out):
        host = HOST_OUTPUTS.get(func)
        if host is not None:
            return tuple(x if i in host else back(x) for i, x in enumerate(out))
        return tuple(back(x) for x in out)
    return tree_map(back, out)


def _phantom_writes(
    func: Any, args: tuple, kwargs: dict[str, Any], a: tuple, nested: bool, by_elem: dict[int, SimCudaTensor]
) -> tuple:
    """Phantom mode, an op mixing phantom data in: each argument it writes into that held values gets the meta
    data the op runs on as its own (phantom from now on: never a stale value), and is the op's output again.
    Other tensors viewing the same values are not reached: they keep them."""
    positions, names = kept_values.written(func)
    targets = [(i, args[i]) for i in positions if i < len(args)] + [(None, kwargs.get(n)) for n in names]
    for i, x in targets:
        if not isinstance(x, SimCudaTensor) or x.elem.is_meta:
            continue
        meta = a[i] if i is not None and not nested and isinstance(a[i], torch.Tensor) else x.elem.to("meta")
        x.elem = meta
        by_elem[id(meta)] = x
    return a
