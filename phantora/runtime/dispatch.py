"""The TorchDispatchMode that charges every aten op to the rank's virtual clock.

For each op: join any collective in flight whose memory the op touches, run the op for real,
and advance the compute lane by the GPU model's duration (`compute.op_time_ns`). Functional
collectives go to `functional.run`. Ops on fake or meta tensors (sharding propagation, meta
init) are bookkeeping, not GPU kernels: they run uncharged. Other tensor subclasses (DTensor,
AsyncCollectiveTensor) are left to their own dispatch, whose plain-tensor ops come back here.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from phantora.runtime import functional
from phantora.runtime.compute import tensors_in
from phantora.runtime.session import RankSession

_PLAIN = (
    (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer)
    if hasattr(torch.nn, "Buffer")
    else (torch.Tensor, torch.nn.Parameter)
)


def _subclass_kind(types: tuple[type, ...]) -> str:
    """'' for plain tensors, 'fake' for fake/functional tensors, 'other' for subclasses with their own dispatch."""
    kind = ""
    for t in types:
        if t in _PLAIN:
            continue
        if issubclass(t, FakeTensor) or t.__name__ == "FunctionalTensor":
            return "fake"
        if getattr(t, "__torch_dispatch__", None) is not torch._C._disabled_torch_dispatch_impl:
            kind = "other"
    return kind


_NAMES: dict[int, str] = {}


def _name(func: Any) -> str:
    name = _NAMES.get(id(func))
    if name is None:
        name = _NAMES[id(func)] = str(func.overloadpacket)
    return name


class ChargeMode(TorchDispatchMode):
    """Charges aten ops to a `RankSession`; enter it for the whole run."""

    def __init__(self, session: RankSession) -> None:
        super().__init__()
        self.session = session
        self.thread = threading.get_ident()

    def __torch_dispatch__(
        self, func: Any, types: tuple[type, ...], args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        s = self.session
        if threading.get_ident() != self.thread:
            return func(*args, **kwargs)  # gloo worker threads inherit the mode; their copies are not GPU work
        if func.namespace == "_c10d_functional":
            return functional.run(s, func, args, kwargs)
        if s.internal_active or func.namespace == "c10d":
            return func(*args, **kwargs)
        kind = _subclass_kind(types)
        if kind == "fake":
            return func(*args, **kwargs)
        if kind == "other":
            return NotImplemented
        leaves = tensors_in(args)
        if kwargs:
            tensors_in(kwargs, leaves)
        for t in leaves:
            if t.is_meta:
                return func(*args, **kwargs)
        if s.by_storage:
            s.join_tensors(leaves)
        out = func(*args, **kwargs)
        for t in tensors_in(out):
            if t.is_meta:
                return out
        s.charge(_name(func), s.model.cost(func, args, kwargs, out))
        return out
