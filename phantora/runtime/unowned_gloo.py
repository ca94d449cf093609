"""The inner gloo group of real mode, fed aliases of the caller's tensors that do not own their memory.

gloo's worker thread keeps its references to a work's tensors for a moment after the work has
completed. Had it been handed the caller's tensors, the last reference to a buffer (an FSDP
reduce-scatter input, say) could drop on that thread, at a point of the rank's op stream that
depends on wall-clock scheduling, and the simulated device memory (memory.py counts a storage as
freed when its last reference dies) would differ from run to run. So gloo gets aliases: tensors
over the same bytes whose storage does not own them. Every free of the caller's memory then happens
on the rank's own thread. The wrapped work keeps the caller's tensors alive until it has been
waited on, so the bytes stay valid for as long as gloo may touch them.
"""

from __future__ import annotations

import ctypes
from typing import Any

import torch
from torch._C._distributed_c10d import Work


def unowned_alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor over the same bytes, sizes and strides as `t` whose storage does not own the memory."""
    st = t.untyped_storage()
    size = st.nbytes()
    if t.layout != torch.strided or t.device.type != "cpu" or size == 0:
        return t
    raw = (ctypes.c_uint8 * size).from_address(st.data_ptr())
    flat = torch.frombuffer(raw, dtype=torch.uint8)
    if t.element_size() != 1:
        flat = flat[: size - size % t.element_size()].view(t.dtype)
    else:
        flat = flat.view(t.dtype)
    return flat.as_strided(t.size(), t.stride(), t.storage_offset())


def _aliased(x: Any, originals: list[torch.Tensor]) -> Any:
    """`x` with every tensor (in nested lists) replaced by its unowned alias; the originals are collected."""
    if isinstance(x, torch.Tensor):
        originals.append(x)
        return unowned_alias(x)
    if isinstance(x, list | tuple):
        return type(x)(_aliased(item, originals) for item in x)
    return x


class HeldWork:
    """A gloo work with the caller's tensors kept alive until it has been waited on."""

    def __init__(self, work: Any, originals: list[torch.Tensor]) -> None:
        self._work = work
        self._originals = originals

    def wait(self) -> bool:
        done = self._work.wait()
        self._originals = []
        return done


class UnownedGloo:
    """A gloo process group whose collectives see unowned aliases of their tensor arguments."""

    def __init__(self, gloo: Any) -> None:
        self._gloo = gloo

    @property
    def inner(self) -> Any:
        """The gloo process group itself (its backend object, for torch's C++ side; not for collectives)."""
        return self._gloo

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._gloo, name)
        if not callable(method):
            return method

        def call(*args: Any) -> Any:
            originals: list[torch.Tensor] = []
            out = method(*(_aliased(a, originals) for a in args))
            return HeldWork(out, originals) if isinstance(out, Work) else out

        return call
