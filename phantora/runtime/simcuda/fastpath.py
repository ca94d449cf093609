"""The fast path of an op on the simulated GPU: unwrap, run, count memory, charge and wrap, in one pass.

Most ops a program runs on cuda tensors take flat arguments (tensors, scalars, lists of numbers), draw no
random numbers, and do not mix phantom data with real data. For those, the rank's dispatch mode calls
`device_op` instead of the general route, in which the cuda tensors' own dispatch (tensor.run_op) unwraps
the op and sends it through the dispatcher and the mode again, where every case is checked anew. The
result is the same: the op runs on the data, its outputs are counted as device memory, it is charged to
the compute lane, and its tensor outputs are wrapped (an in-place op returns its input).

`device_op` returns `SLOW` before doing anything when the op is not such a case; the caller then takes
the general route.
"""

from __future__ import annotations

from typing import Any

import torch

from phantora.runtime.compute import _sig
from phantora.runtime.simcuda import attention, rng
from phantora.runtime.simcuda.tensor import SimCudaTensor

SLOW: Any = object()  # `device_op`'s answer for an op it leaves to the general route

_TENSOR = torch.Tensor
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_SEQ = (list, tuple)
_matmul_precision = torch._C._get_float32_matmul_precision
aten = torch.ops.aten
# Ops the general route answers specially: pinning, and in phantom mode copies to the host, .item(), torch.equal.
_SPECIAL = {aten.is_pinned.default, aten._pin_memory.default}
_PHANTOM_SPECIAL = {id(aten.copy_.default), id(aten._local_scalar_dense.default), id(aten.equal.default)}
_FAST: dict[int, bool] = {}  # by id(op): OpOverloads live as long as torch, and hashing one runs Python
_NAMES: dict[int, str] = {}


def _fast(func: Any) -> bool:
    """Can `func` take the fast path at all (decided once per op)? Not collectives, random ops (the device's
    generator, rng.py), CUDA-only ops run by a Python kernel, or the ops answered specially."""
    known = _FAST.get(id(func))
    if known is None:
        known = _FAST[id(func)] = (
            func.namespace == "aten"
            and func not in attention.KERNELS
            and func not in _SPECIAL
            and not rng.is_random(func)
        )
        _NAMES[id(func)] = str(func.overloadpacket)
    return known


def _has_tensor(seq: Any) -> bool:
    for item in seq:
        if isinstance(item, _TENSOR) or type(item) in _SEQ:
            return True
    return False


def device_op(session: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """Run `func` on the simulated GPU's data and charge it to `session`, or return `SLOW` untouched."""
    if not _fast(func) or session._internal:
        return SLOW
    meta = data = False
    last: Any = None  # the last cuda argument: its device is the outputs' (as tensor.run_op)
    inputs: list[Any] = []  # the wrappers, so an in-place op returns its input
    unwrapped: list[Any] = []
    key: list[Any] = [id(func)]  # the compute model's cache key (compute.cache_key's parts), made on the way
    for x in args:
        if isinstance(x, SimCudaTensor):
            e = x.elem
            last = x
            if e.is_meta:
                meta = True
            else:
                data = True
            inputs.append(x)
            unwrapped.append(e)
            key.append((e.shape, e.dtype))
        elif isinstance(x, _TENSOR) or (type(x) in _SEQ and _has_tensor(x)):
            return SLOW  # a host tensor beside cuda ones (a 0-dim scalar), or tensors in a list
        else:
            unwrapped.append(x)
            key.append(_sig(x))
    if kwargs:
        for v in kwargs.values():
            if isinstance(v, _TENSOR) or (type(v) in _SEQ and _has_tensor(v)):
                return SLOW
        key.append(_sig(tuple(kwargs.items())))
    phantom = session.phantom
    if meta and (data or not phantom):  # phantom data beside real data, or real mode's meta bookkeeping
        return SLOW
    if phantom and id(func) in _PHANTOM_SPECIAL:
        return SLOW
    if session.by_storage:
        session.join_tensors([x.elem for x in inputs])
    a = tuple(unwrapped)
    out = func._op(*a, **kwargs)  # what OpOverload.__call__ runs
    mem = session.memory
    index = (last.device.index or 0) if last is not None else 0
    if type(out) in _PLAIN:
        if mem.enabled:
            mem.on_tensor(out, func)
        if phantom or not out.is_meta:
            key.append((out.shape, out.dtype))
            session.charge(_NAMES[id(func)], _cost(session.model, key, func, a, kwargs, out))
        for x in inputs:
            if x.elem is out:
                return x
        return SimCudaTensor(out, index)
    if mem.enabled:
        mem.on_outputs(out, func)
    if type(out) is not tuple or _has_meta_or_nested(out, phantom):
        return _slow_wrap(session, func, a, kwargs, out, inputs, index, phantom)
    session.charge(_NAMES[id(func)], session.model.cost(func, a, kwargs, out))
    return tuple(_back(x, inputs, index) for x in out)


def _cost(model: Any, key: list[Any], func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
    """The model's cost of the op, cached under `key` (+ the fp32 matmul precision) where the model allows."""
    cost_for = getattr(model, "cost_for", None)
    if cost_for is None:
        return model.cost(func, args, kwargs, out)
    key.append(_matmul_precision())
    return cost_for(tuple(key), func, args, kwargs, out)


def _has_meta_or_nested(out: tuple, phantom: bool) -> bool:
    for x in out:
        if type(x) in _SEQ or (not phantom and isinstance(x, _TENSOR) and x.is_meta):
            return True
    return False


def _back(x: Any, inputs: list[Any], index: int) -> Any:
    if type(x) not in _PLAIN:
        return x
    for i in inputs:
        if i.elem is x:
            return i
    return SimCudaTensor(x, index)


def _slow_wrap(
    session: Any, func: Any, args: tuple, kwargs: dict, out: Any, inputs: list[Any], index: int, phantom: bool
) -> Any:
    """Charge and wrap an output that is not a tensor or a flat tuple (a list, None, a scalar)."""
    from torch.utils._pytree import tree_leaves, tree_map

    if phantom or not any(isinstance(t, _TENSOR) and t.is_meta for t in tree_leaves(out)):
        session.charge(_NAMES[id(func)], session.model.cost(func, args, kwargs, out))
    return tree_map(lambda x: _back(x, inputs, index), out)
