"""Pinned host memory on the simulated GPU's host: plain host memory that answers `is_pinned()` with True.

This torch build has no CUDA to page-lock memory with, so a pinned allocation (DataLoader's
pin_memory, DDP's reducer staging its unused-parameter map) is an ordinary CPU tensor remembered
here, and `is_pinned` says what the program asked for. Copies from it cost what any host-to-device
copy costs.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

_pinned: dict[int, weakref.ref[torch.Tensor]] = {}  # by id: tensors compare element-wise, not by identity
_IS_PINNED = torch.ops.aten.is_pinned.default
_PIN = torch.ops.aten._pin_memory.default


def mark(t: torch.Tensor) -> torch.Tensor:
    """Remember `t` as pinned; return it."""
    key = id(t)
    _pinned[key] = weakref.ref(t, lambda _: _pinned.pop(key, None))
    return t


def is_pinned(t: torch.Tensor) -> bool:
    ref = _pinned.get(id(t))
    return ref is not None and ref() is t


def host_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run a host op, with pinning asked for (`pin_memory=True`, `_pin_memory`, `is_pinned`) answered here."""
    if func is _IS_PINNED:
        return is_pinned(args[0])
    if func is _PIN:
        return mark(args[0].clone())
    if kwargs.get("pin_memory"):
        return mark(func(*args, **{**kwargs, "pin_memory": False}))
    return func(*args, **kwargs)
