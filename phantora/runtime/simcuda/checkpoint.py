"""`torch.save` and `torch.load` of simulated-GPU tensors, in the format a real GPU writes.

Saving (`reduce`, a SimCudaTensor's `__reduce_ex__`):
- a tensor holding data (real mode) pickles as a CUDA tensor does: `torch._utils._rebuild_tensor_v2` (v3 for
  the newer dtypes) over its storage, whose record is tagged with its device (``cuda:N``). The file is a GPU
  checkpoint: torch loads it on a GPU, or anywhere with ``map_location="cpu"``;
- a phantom tensor (phantom mode: shape, no data) pickles as torch pickles a meta tensor
  (`_rebuild_meta_tensor_no_storage`: dtype, shape, stride, requires_grad, no bytes), as its `.cpu()` is one.
  Loading gives a meta tensor, which phantom mode accepts wherever a phantom tensor goes (`load_state_dict`).
- a parameter pickles as `torch._utils._rebuild_parameter` of that tensor, as a CUDA parameter does.

Loading: a storage tagged ``cuda[:N]`` (after `map_location`) is read into host memory and copied once onto
simulated ``cuda:N`` (an H2D copy, charged and counted as device memory, as `torch.load` onto a GPU does);
every tensor saved over it is a view of that copy, so shared storage stays shared. In phantom mode the copy
is phantom, except one-element storages, which keep their values. A device the simulated host lacks is
refused as torch refuses it.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Any

import torch

from phantora.runtime.simcuda import devices, tensor

_PRIORITY = 5  # before torch's own taggers and deserializers (CPU 10, CUDA 20)
_SAVED_ATTR = "_phantora_saved_on"  # set on a storage being saved: the simulated GPU it lives on
_DEVICE_ATTR = "_phantora_cuda"  # set on a loaded host storage: the simulated GPU it goes to
_COPY_ATTR = "_phantora_on_device"  # the storage's one copy on that GPU


def reduce(t: Any) -> tuple[Any, tuple[Any, ...]]:
    """What `pickle` stores for simulated-GPU tensor `t` (the module docstring says what)."""
    if getattr(t, "_is_param", False):
        return torch._utils._rebuild_parameter, (t.detach(), t.requires_grad, OrderedDict())
    elem = t.elem
    size, stride = tuple(t.size()), t.stride()
    if elem.is_meta:
        return torch._utils._rebuild_meta_tensor_no_storage, (t.dtype, size, stride, t.requires_grad)
    untyped = elem.untyped_storage()
    setattr(untyped, _SAVED_ATTR, str(t.device))  # `_tag` names the storage's record with this device
    hooks: OrderedDict[Any, Any] = OrderedDict()
    metadata = torch._utils.get_tensor_metadata(elem)
    tail = (metadata,) if metadata else ()
    if t.dtype in torch.storage._new_dtypes():
        args = (untyped, elem.storage_offset(), size, stride, t.requires_grad, hooks, t.dtype, *tail)
        return torch._utils._rebuild_tensor_v3, args
    typed = torch.storage.TypedStorage(wrap_storage=untyped, dtype=t.dtype, _internal=True)
    return torch._utils._rebuild_tensor_v2, (typed, elem.storage_offset(), size, stride, t.requires_grad, hooks, *tail)


def _tag(storage: Any) -> str | None:
    """torch.save's location of a storage: the simulated GPU of a tensor `reduce` saves, else torch's."""
    return getattr(storage, _SAVED_ATTR, None)


def _deserialize(storage: Any, location: str) -> Any:
    """torch.load's restore step for a ``cuda[:N]`` location: the host storage, marked for simulated cuda:N."""
    if not location.startswith("cuda"):
        return None
    index = devices.index_of(torch.device(location))
    count = int(devices.state["count"])
    if not 0 <= index < count:
        raise RuntimeError(
            f"Attempting to deserialize object on CUDA device {index} but torch.cuda.device_count() is {count} "
            "(the simulated host's GPUs). Please use torch.load with map_location to map your storages "
            "to an existing device."
        )
    setattr(storage, _DEVICE_ATTR, index)
    return storage


def _on_device(t: torch.Tensor, storage: Any) -> torch.Tensor:
    """`t` (a host tensor over `storage`) as the same view of the storage's one copy on its simulated GPU.

    In phantom mode the copy is phantom (shapes only), except a one-element storage (an optimizer's step
    count): it keeps its value, as integer data does, since programs read it (Adam divides by it)."""

    index = getattr(storage, _DEVICE_ATTR, None)
    if index is None:
        return t
    copy = getattr(storage, _COPY_ATTR, None)
    if copy is None or copy.dtype != t.dtype:
        whole = torch.empty((0,), dtype=t.dtype).set_(storage)
        if whole.numel() == 1 and tensor.inner_device().type == "meta":
            copy = tensor.SimCudaTensor(whole.clone(), index)  # phantom mode: a scalar keeps its value
        else:
            copy = whole.to(torch.device("cuda", index))
        setattr(storage, _COPY_ATTR, copy)
    out = copy.as_strided(t.size(), t.stride(), t.storage_offset())
    return out.requires_grad_(True) if t.requires_grad else out


def _untyped(storage: Any) -> Any:
    return storage._untyped_storage if isinstance(storage, torch.storage.TypedStorage) else storage


def _rebuilding(original: Any) -> Any:
    """`original` (one of torch's tensor rebuild functions, whose name torch's weights-only loader allows),
    placing tensors of storages marked by `_deserialize` on their simulated GPU."""

    @functools.wraps(original)
    def rebuild(storage: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        return _on_device(original(storage, *args, **kwargs), _untyped(storage))

    rebuild._phantora = True  # type: ignore[attr-defined]
    return rebuild


def _reduce_ex(t: Any, proto: Any) -> tuple[Any, tuple[Any, ...]]:
    return reduce(t)


def install() -> None:
    """Pickle SimCudaTensors with `reduce` (torch.save) and teach torch.load the simulated GPU's storages."""
    tensor.SimCudaTensor.__reduce_ex__ = _reduce_ex  # type: ignore[method-assign,assignment]
    if getattr(torch._utils._rebuild_tensor_v2, "_phantora", False):
        return
    torch.serialization.register_package(_PRIORITY, _tag, _deserialize)
    torch._utils._rebuild_tensor_v2 = _rebuilding(torch._utils._rebuild_tensor_v2)
    torch._utils._rebuild_tensor_v3 = _rebuilding(torch._utils._rebuild_tensor_v3)
    # the weights-only loader resolves the functions it allows by name, once: let it see these
    torch._weights_only_unpickler._get_allowed_globals.cache_clear()
