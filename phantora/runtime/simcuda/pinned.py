"""Pinned host memory on the simulated GPU's host: plain host memory that answers `is_pinned()` with True.

This torch build has no CUDA to page-lock memory with, so a pinned allocation (DataLoader's
pin_memory, DDP's reducer staging its unused-parameter map) is an ordinary CPU tensor remembered
here, and `is_pinned` says what the program asked for. A copy between it and the GPU runs at the PCIe
link's DMA rate, one from pageable memory slower (runtime/hostwork.py).
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

import torch

_pinned: dict[int, weakref.ref[torch.Tensor]] = {}  # by id: tensors compare element-wise, not by identity
_IS_PINNED = torch.ops.aten.is_pinned.default
_PIN = torch.ops.aten._pin_memory.default


_storages: dict[int, weakref.ref[torch.Tensor]] = {}  # by storage: a view of a pinned buffer is pinned memory


def _storage(t: torch.Tensor) -> int:
    """The identity of `t`'s storage, which its views and aliases share (meta tensors' too, which have no address)."""
    return int(t.untyped_storage()._cdata)


def mark(t: torch.Tensor) -> torch.Tensor:
    """Remember `t` as pinned; return it."""
    key = id(t)
    _pinned[key] = weakref.ref(t, lambda _: _pinned.pop(key, None))
    ptr = _storage(t)
    _storages[ptr] = weakref.ref(t, functools.partial(_forget_storage, ptr))
    return t


def _forget_storage(ptr: int, ref: weakref.ref[torch.Tensor]) -> None:
    if _storages.get(ptr) is ref:  # not a later pinned buffer at the same address
        del _storages[ptr]


def is_pinned(t: torch.Tensor) -> bool:
    ref = _pinned.get(id(t))
    return ref is not None and ref() is t


def in_pinned_memory(t: torch.Tensor) -> bool:
    """Is `t` (or the buffer it views) pinned? What a copy's speed over PCIe depends on (runtime/hostwork.py)."""
    if is_pinned(t):
        return True
    ptr = _storage(t)
    ref = _storages.get(ptr)
    owner = ref() if ref is not None else None
    return owner is not None and _storage(owner) == ptr


def host_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run a host op, with pinning asked for (`pin_memory=True`, `_pin_memory`, `is_pinned`) answered here."""
    if func is _IS_PINNED:
        return is_pinned(args[0])
    if func is _PIN:
        return mark(args[0].clone())
    if kwargs.get("pin_memory"):
        return mark(func(*args, **{**kwargs, "pin_memory": False}))
    return func(*args, **kwargs)
