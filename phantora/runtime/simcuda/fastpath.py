"""The fast path of an op on the simulated GPU: unwrap, run, count memory, charge and wrap, in one pass.

Most ops a program runs on cuda tensors take flat arguments (tensors, scalars, lists of numbers), draw no
random numbers, and do not mix phantom data with real data. For those, the rank's dispatch mode calls
`device_op` instead of the general route, in which the cuda tensors' own dispatch (tensor.run_op) unwraps
the op and sends it through the dispatcher and the mode again, where every case is checked anew. The
result is the same: the op runs on the data, its outputs are counted as device memory, it is charged to
the compute lane, and its tensor outputs are wrapped (an in-place op returns its input).

Every op pays this path, so it is written for few Python steps: what depends on the op alone (may it come
here, its name) is decided once per op (`_plan`); its cost is looked up in the compute model's cache under
a key made while the arguments are unwrapped (the op, each argument's shape and dtype or scalar, the
output's shape and dtype, the fp32 matmul precision as runtime/precision.py caches it; a matrix product's operand
that is not contiguous at an offset on the 16-byte grid also by its strides and offset, compute.layout_part: under the
calibrated model its layout decides cuBLAS's kernel), so a repeated op never reaches the model; the output's wrapper
is made without a Python constructor (`wrap_output`), from the shape and dtype the key read, and on the device index
its input's wrapper keeps (`SimCudaTensor._sim_index`).

`device_op` returns `SLOW` before doing anything when the op is not such a case; the caller then takes
the general route.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from phantora.runtime import precision
from phantora.runtime.compute import _sig, layout_bound, layout_part, tensors_in
from phantora.runtime.simcuda import compiled, composite, cuda_only, kept_values, rng
from phantora.runtime.simcuda.tensor import HOST_OUTPUTS, RESHAPED_IN_PLACE, SimCudaTensor, wrap_output

SLOW: Any = object()  # `device_op`'s answer for an op it leaves to the general route

_TENSOR = torch.Tensor
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_SEQ = (list, tuple)
aten = torch.ops.aten
# Ops the general route answers specially: pinning, a copy-on-write clone (its input's storage unhooked first,
# dispatch.py), an empty tensor like a cuda one (zero-filled in real mode, dispatch.py), and in phantom mode copies
# to the host, .item(), torch.equal, and the ops whose outputs keep values (kept_values.py; a cast only to integers
# or booleans).
_SPECIAL = {aten.is_pinned.default, aten._pin_memory.default, aten._lazy_clone.default, aten.empty_like.default}
_SPECIAL |= {aten.new_empty.default, aten.new_empty_strided.default}
_SPECIAL |= RESHAPED_IN_PLACE  # the wrapper takes its data's new shape after the op (tensor.py)
_SPECIAL |= set(HOST_OUTPUTS)  # outputs that stay on the host (a PackedSequence's batch_sizes)
_PHANTOM_SPECIAL = {id(aten.copy_.default), id(aten._local_scalar_dense.default), id(aten.equal.default)}
_PHANTOM_SPECIAL |= {id(op) for op in kept_values.OPS}
_TO_COPY = id(kept_values.TO_COPY)
_UNKNOWN: Any = object()
# by id(op) (OpOverloads live as long as torch, and hashing one runs Python): the op's name if it may take the
# fast path, None if it may not
_PLANS: dict[int, str | None] = {}
_LAYOUT_OPS: set[int] = set()  # ids of the fast ops whose cost may depend on their operands' layout (matrix products)


def _plan(func: Any) -> str | None:
    """The op's name if `func` may take the fast path at all, else None (decided once per op). Not collectives,
    random ops (the device's generator, rng.py), CUDA-only ops run by a Python kernel, or the ops answered
    specially, nor a composite below autograd (composite.py)."""
    fast = (
        func.namespace == "aten"
        and func not in cuda_only.KERNELS
        and func not in cuda_only.HALF_TO_FLOAT  # an fp16 -> fp32 softmax's kernel is a Python function
        and func not in _SPECIAL
        and not rng.is_random(func)
        and not composite.runs_as_parts(func)
    )
    if fast and layout_bound(func):
        _LAYOUT_OPS.add(id(func))
    name = _PLANS[id(func)] = str(func.overloadpacket) if fast else None
    return name


def _lay_out(key: list[Any], unwrapped: list[Any]) -> None:
    """A matrix product's key (`key[i + 1]` the part of argument `i`) with each operand's `layout_part` folded in:
    (shape, dtype, strides, offset) for an operand not contiguous at an offset on the 16-byte grid."""
    i = 1
    for e in unwrapped:
        if isinstance(e, _TENSOR):
            part = layout_part(e)
            if part is not None:
                key[i] = (e.shape, e.dtype, *part)
        i += 1


def _has_tensor(seq: Any) -> bool:
    for item in seq:
        if isinstance(item, _TENSOR) or type(item) in _SEQ:
            return True
    return False


def device_op(session: Any, func: Any, args: tuple, kwargs: dict) -> Any:
    """Run `func` on the simulated GPU's data and charge it to `session`, or return `SLOW` untouched."""
    op = id(func)
    name = _PLANS.get(op, _UNKNOWN)
    if name is _UNKNOWN:
        name = _plan(func)
    if name is None or session._internal:
        return SLOW
    meta = data = False
    last: Any = None  # the last cuda argument: its device is the outputs' (as tensor.run_op)
    unwrapped: list[Any] = []
    key: list[Any] = [op]  # the compute model's cache key (compute.cache_key's parts), made on the way
    for x in args:
        if isinstance(x, SimCudaTensor):
            e = x.elem
            last = x
            if e.is_meta:
                meta = True
            else:
                data = True
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
    if meta:
        if data or not phantom:  # phantom data beside real data, or real mode's meta bookkeeping
            return SLOW
    elif data and phantom:  # values in phantom mode: run_op keeps them only for index-sized outputs
        return SLOW
    if phantom and op in _PHANTOM_SPECIAL and (op != _TO_COPY or kept_values.casts_to_index(kwargs)):
        return SLOW
    if session.by_storage:
        session.join_tensors([x.elem for x in args if isinstance(x, SimCudaTensor)])
    a = tuple(unwrapped)
    out = func._op(*a, **kwargs) if kwargs else func._op(*a)  # what OpOverload.__call__ runs
    mem = session.memory
    index = last._sim_index if last is not None else 0  # its index, kept on the wrapper
    if type(out) in _PLAIN:
        if mem.enabled:
            mem.on_tensor(out, func)
        shape = out.shape
        dtype = out.dtype
        if phantom or not out.is_meta:
            key.append((shape, dtype))
            key.append(precision.value or precision.matmul_precision())  # the cached value, else torch's
            model = session.model
            if op in _LAYOUT_OPS and model.by_layout:
                _lay_out(key, unwrapped)
            k = tuple(key)
            try:
                cost = model.keyed.get(k)  # the model's cache of `cost_keyed`, read here: one call fewer per op
            except TypeError:  # an unhashable argument
                cost = None
            if cost is None:
                cost = model.cost_keyed(k, func, a, kwargs, out)
            session.charge(name, cost)
        i = 0
        for e in unwrapped:  # one per argument, in order
            if e is out:
                return args[i]  # an in-place op returns its input (a cuda one: only their data is in `unwrapped`)
            i += 1
        return wrap_output(out, index, shape, dtype)
    return _tail(session, name, func, a, kwargs, out, args, index, phantom)


def _tail(
    session: Any, name: str, func: Any, a: tuple, kwargs: dict, out: Any, args: tuple, index: int, phantom: bool
) -> Any:
    """The end of `device_op` for an output that is not one plain tensor: count, charge and wrap it."""
    if session.memory.enabled:
        session.memory.on_outputs(out, func)
    if type(out) is not tuple or _has_meta_or_nested(out, phantom):
        return _slow_wrap(session, name, func, a, kwargs, out, args, index, phantom)
    session.charge(name, session.model.cost(func, a, kwargs, out))
    return tuple(_back(x, args, index) for x in out)


def _has_meta_or_nested(out: tuple, phantom: bool) -> bool:
    for x in out:
        if type(x) in _SEQ or (not phantom and isinstance(x, _TENSOR) and x.is_meta):
            return True
    return False


def _back(x: Any, args: tuple, index: int) -> Any:
    """An output wrapped, or the cuda argument whose data it is (an in-place op's)."""
    if type(x) not in _PLAIN:
        return x
    for i in args:
        if isinstance(i, SimCudaTensor) and i.elem is x:
            return i
    return wrap_output(x, index, x.shape, x.dtype)


def _slow_wrap(
    session: Any, name: str, func: Any, args: tuple, kwargs: dict, out: Any, inputs: tuple, index: int, phantom: bool
) -> Any:
    """Charge and wrap an output that is not a tensor or a flat tuple (a list, None, a scalar)."""
    from torch.utils._pytree import tree_leaves, tree_map

    if phantom or not any(isinstance(t, _TENSOR) and t.is_meta for t in tree_leaves(out)):
        session.charge(name, session.model.cost(func, args, kwargs, out))
    return tree_map(lambda x: _back(x, inputs, index), out)


def _plain_tail(session: Any, name: str, func: Any, args: tuple, kwargs: dict, out: Any) -> Any:
    """The end of the compiled path's plain-tensor op (a program that made no cuda tensor: its ops are GPU work) for
    an output that is not one plain tensor: count and charge it as `ChargeMode._charged` does."""
    if session.memory.enabled:
        session.memory.on_outputs(out, func)
    if not session.phantom:
        for t in tensors_in(out):
            if t.is_meta:
                return out
    session.charge(name, session.model.cost(func, args, kwargs, out))
    return out


python_device_op = device_op  # the Python transcription, kept for the tests and the benchmark
_fast = compiled.load(sys.modules[__name__])
if _fast is not None:
    device_op = _fast.device_op  # the same function, compiled (simcuda/_fastop.c)
