"""torch.compile's kernel fusion on the simulated GPU: a compiled region's ops timed as Inductor's fused kernels.

The simulated GPU runs a compiled program eagerly (simcuda/device.py), so its values are the eager ones. What
compilation changes is the kernels: Inductor (torch/_inductor/scheduler.py) fuses pointwise and reduction ops with
their producers and consumers into generated kernels, and leaves matmuls, convolutions, attention and collectives
to extern kernels (cuBLAS, cuDNN, flash, NCCL), which never fuse with their neighbours ("node1 is extern but not a
triton kernel"). A fused kernel reads what its group takes from outside once and writes only what is used outside
the group, and has one launch.

This module models that. While a compiled function runs (`region`), and while autograd runs the backward of nodes
created in one (their sequence numbers, `torch._C._current_autograd_node()`: AOTAutograd compiles the backward
too), a dispatch mode above the rank's ChargeMode sees each op before it is charged:

- views and aliases are free and carry their base's identity;
- a pointwise op (`torch.Tag.pointwise`) or a reduction (`FUSED`) runs and is charged as usual, but the charge is
  caught: the op joins the open group of any input an open group produced (groups merge), else starts one, if
  their iteration spaces can share a kernel (`fits`: Inductor's SIMDScheduling.can_fuse); an input from outside the
  groups is a read of its bytes, once per group (a gather reads what it outputs); an input another group made in
  another space is read back if a reduction made it (that group writes it) or recomputed from its pointwise
  chain's sources (Inductor inlines unrealized pointwise nodes);
- any other op (an extern kernel, a copy to or from the host, a sync) first closes the open groups, then is charged
  as itself; so does leaving the region (the forward's end, the backward's end).

A group closes as one kernel (none if it writes nothing): its reads plus the bytes of its outputs still alive
(referenced by the program, saved for backward, or the region's outputs: a tensor the program will use again is
alive now, one it dropped is an intermediate that stayed in registers), timed as max(bytes' time, FLOPs / peak)
plus one launch (`memory_ns`: the bytes at HBM bandwidth under the roofline model, the calibrated model's
elementwise kernel of as many bytes under it), charged under the name `fused:` and its first ops' names, tier
"fused". Like Inductor (`max_fusion_size`), a group takes at most 64 ops.

Ops on complex tensors (rotary embeddings' `view_as_complex` products) stay their own kernels too: Inductor "does not
support code generation for complex operators" (torch/_inductor/lowering.py) and falls back to the eager kernels.

Not modelled: Inductor's recomputation in the backward (its min-cut partitioner saves fewer activations; here
autograd's saved tensors are written), horizontal fusion of unrelated ops that only share an input (each is its own
kernel), fusion across an extern kernel neither side depends on (an extern kernel closes the open groups), memory
(the eager intermediates are still allocated), `mode="max-autotune"`'s Triton matmul templates and their epilogue
fusion, and CUDA graphs (`reduce-overhead`, `max-autotune`): every mode is timed as the default one.
`PHANTORA_COMPILE_FUSION=off` times a compiled program eagerly, op by op, as before.
"""

from __future__ import annotations

import bisect
import functools
import math
import os
import threading
import weakref
from types import MethodType
from typing import Any

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from phantora.perfmodel.ops import FILL_OPS, REDUCTION_OPS
from phantora.runtime.compute import _GATHER, OpCost, _op_info, tensors_in
from phantora.runtime.simcuda import torch_release
from phantora.runtime.simcuda.tensor import SimCudaTensor, cuda_index, direct, is_cuda_device

ENV = "PHANTORA_COMPILE_FUSION"
MAX_FUSION_SIZE = 64  # torch._inductor.config.max_fusion_size
TIER = "fused"
# The first torch release whose Inductor fuses a reduction along one axis with one along the other of the same tensor
# (MixOrderReduction in torch/_inductor/scheduler.py; pytorch/pytorch#165370, "generate fused rms/layer norm bwd",
# opened 2025-10-13, after 2.9's branch cut): before it a norm backward's dx and dw reductions are two kernels.
MIX_ORDER_REDUCTION = (2, 10)

# Reductions Inductor runs as their eager kernels: no lowering or decomposition in torch/_inductor (a fallback).
INDUCTOR_FALLBACKS = frozenset({"_masked_softmax", "_masked_softmax_backward"})
# Ops Inductor lowers to generated (fusible) kernels that torch does not tag pointwise: the compute model's reductions
# and fills (perfmodel/ops.py, less the fallbacks) and these.
_LOWERED = frozenset(
    {
        "logsumexp",  # (a reduction the compute model times as elementwise)
        "native_group_norm",
        "native_group_norm_backward",
        "native_batch_norm",
        "native_batch_norm_backward",
        "_native_batch_norm_legit",
        "_native_batch_norm_legit_no_training",
        "native_dropout",
        "native_dropout_backward",
        "_to_copy",
        "copy_",
        "clone",
        "contiguous",
        "new_ones",
        "scalar_tensor",
        "tril",
        "triu",
        "cat",
        "embedding",
        "index_select",
        "gather",
        "slice_backward",
        "select_backward",
        "expand_backward",
        "masked_fill",
        "masked_fill_",
        "where",
        "arange",
    }
)
FUSED = (REDUCTION_OPS - INDUCTOR_FALLBACKS) | FILL_OPS | _LOWERED

# Ops that launch no kernel but carry their input's identity (a saved tensor's `.data` is a detach).
_ALIASES = frozenset({"detach", "alias", "lift_fresh", "_unsafe_view", "_reshape_alias"})
_NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set_", "resize_"})

_VIEW, _FREE, _FUSE, _EXTERN = 0, 1, 2, 3
_KINDS: dict[int, int] = {}  # id(OpOverload) -> kind (OpOverloads live as long as torch)
_get_ident = threading.get_ident
_FAKE = torch._C._TorchDispatchModeKey.FAKE
_get_mode = torch._C._get_dispatch_mode
_current_node = torch._C._current_autograd_node
_sequence_nr = torch._C._autograd._get_sequence_nr


def enabled() -> bool:
    """Whether compiled regions are timed as fused kernels (`PHANTORA_COMPILE_FUSION`, default on)."""
    return os.environ.get(ENV, "on").strip().lower() not in ("off", "0", "false", "no")


def kind(func: Any) -> int:
    """How the fusion layer treats an op: a view, no kernel, a fusible kernel, or a kernel of its own."""
    k = _KINDS.get(id(func))
    if k is None:
        k = _KINDS[id(func)] = _classify(func)
    return k


def _classify(func: Any) -> int:
    packet = getattr(func, "overloadpacket", None)
    name = getattr(packet, "__name__", "")
    if getattr(func, "namespace", "") != "aten":
        return _EXTERN
    if name in _ALIASES or getattr(func, "is_view", False):
        return _VIEW
    if name in _NO_KERNEL:
        return _FREE
    if name.startswith("_foreach"):
        return _EXTERN  # the optimizer's multi-tensor kernels: Inductor's combo kernels are not modelled
    if torch.Tag.pointwise in getattr(func, "tags", ()) or name in FUSED:
        # a CUDA-only op whose kernel is Python (simcuda/cuda_only.py) is charged as itself
        return _FUSE if direct(func) else _EXTERN
    return _EXTERN


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a kernel reads of `t`: its elements, or for a broadcast (stride-0) view the memory it spans."""
    if type(t) is SimCudaTensor:
        t = t.elem  # the same shape and strides, and its methods skip the subclass's torch-function check
    if t.is_contiguous():
        return t.numel() * t.element_size()
    n = t.numel()
    if n:
        span = 1
        for size, stride in zip(t.shape, t.stride(), strict=True):
            if size > 1:
                span += (size - 1) * abs(stride)
        n = min(n, span)
    return n * t.element_size()


def _numel(t: torch.Tensor) -> int:
    return (t.elem if type(t) is SimCudaTensor else t).numel()


def fits(numel1: int, rnumel1: int, numel2: int, rnumel2: int, mix_order: bool = False) -> bool:
    """Whether nodes of two iteration spaces can share one generated kernel, by Inductor's rule
    (`SIMDScheduling.can_fuse`, torch/_inductor/codegen/simd.py): two pointwise nodes of the same numel; two
    reductions of the same (numel, rnumel); a pointwise node and a reduction when the pointwise one covers the
    reduction's input (numel x rnumel: a prologue or an epilogue in its loop) or its output (numel). With
    `mix_order` (Inductor's MixOrderReduction, torch 2.10 on) also two reductions of the same tensor along the two
    axes, (n, r) and (r, n): a norm backward's row reduction and its weight gradient's column one."""
    if rnumel1 > 1 and rnumel2 > 1:
        return (numel1 == numel2 and rnumel1 == rnumel2) or (mix_order and numel1 == rnumel2 and rnumel1 == numel2)
    if rnumel1 == 1 and rnumel2 == 1:
        return numel1 == numel2
    if rnumel1 == 1:
        numel1, rnumel1, numel2 = numel2, rnumel2, numel1
    return numel2 == numel1 * rnumel1 or numel2 == numel1


_Src = tuple[int, weakref.ref, int, "_Buf | None"]  # (id of the weak reference, it, bytes, the buffer that made it)
MAX_SOURCES = 16  # a pointwise chain reading more is realized (Inductor's realize_reads/opcount thresholds, roughly)


class _Buf:
    """A tensor an open group made: written out at the group's end if still referenced then."""

    __slots__ = ("group", "nbytes", "refs", "shared", "srcs")

    def __init__(self, group: _Group, nbytes: int, ref: weakref.ref, srcs: list[_Src] | None) -> None:
        self.group = group
        self.nbytes = nbytes
        self.refs = [ref]
        self.shared = False  # read back by a kernel of another iteration space: written whatever the program keeps
        # What a pointwise op's result is computed from (the tensors in memory and the reductions' results its
        # pointwise chain reads): a kernel that cannot join its group inlines the chain and reads these, as Inductor
        # inlines an unrealized pointwise node into each consumer. None: a reduction's result, a buffer of its own.
        self.srcs = srcs

    def alive(self) -> bool:
        for r in self.refs:
            if r() is not None:
                return True
        return False


class _Group:
    """Ops fused into one kernel so far."""

    __slots__ = ("bufs", "dtype", "flops", "names", "numel", "ops", "read", "rnumel", "seen")

    def __init__(self, numel: int, rnumel: int) -> None:
        self.numel = numel  # its iteration space, as Inductor groups a kernel's nodes: (numel, reduced numel)
        self.rnumel = rnumel
        self.bufs: list[_Buf] = []
        self.seen: dict[int, tuple[weakref.ref, int]] = {}  # id(a weak reference to a tensor read) -> (it, bytes)
        self.read = 0
        self.flops = 0
        self.dtype = ""
        self.ops = 0
        self.names: list[str] = []

    def absorb(self, other: _Group) -> None:
        """Take `other`'s ops in (they feed or share this group's)."""
        for b in other.bufs:
            b.group = self
        self.bufs += other.bufs
        for key, entry in other.seen.items():
            if key in self.seen:
                self.read -= entry[1]  # both read it: once
            else:
                self.seen[key] = entry
        self.read += other.read
        self.flops += other.flops
        self.dtype = self.dtype or other.dtype
        self.ops += other.ops
        self.names += other.names
        if other.rnumel > 1 and self.rnumel == 1:
            self.numel, self.rnumel = other.numel, other.rnumel

    def written(self) -> int:
        return sum(b.nbytes for b in self.bufs if b.shared or b.alive())


_SIMCUDA_ONLY = (SimCudaTensor,)


class Fusion:
    """Groups a compiled region's ops into fused kernels (module docstring); one per rank session.

    While a region runs, it stands in front of the rank's dispatch mode (ChargeMode): the mode's instance attribute
    `__torch_dispatch__` (where the compiled fast path already sits) is this object's `_dispatch`, which calls the
    mode's own; and the session's `charge` is this object's `_charge`, through which the mode's charges come
    (the compiled per-op path calls a session's own `charge` when it has one). No dispatch mode of its own: torch's
    higher-order operators (FlexAttention) would need a rule for it; they keep going to ChargeMode's."""

    def __init__(self, session: Any) -> None:
        self._session = weakref.ref(session)  # weakly: `_modes` holds this layer as long as the session lives
        self.thread = _get_ident()
        self.depth = 0  # compiled calls running (nested ones count)
        self.inductor = 0  # those of them the program compiled with Inductor (torch.compile's default backend)
        self.in_backward = False
        self.pushed = False
        self.hooked = False  # the session's `charge` is `_charge`
        self._node: Any = None  # the autograd node `_in_region` last asked about (during a backward), and its answer
        self._node_in = False
        self.busy = False  # an op is being run: the mode's inner trips for it go straight through
        self._mode: Any = None  # the ChargeMode stood in front of, and its own dispatch
        self._inner: Any = None
        self._own_attr = False
        self.capture: list[OpCost] | None = None
        self.groups: list[_Group] = []
        self.made: dict[int, tuple[weakref.ref, _Buf]] = {}
        self.starts: list[int] = []  # sequence-number ranges [start, end) of the autograd nodes regions made
        self.ends: list[int] = []
        self._seq_start = 0
        self._saved_charge: Any = None
        self.mix_order = torch_release.modelled() >= MIX_ORDER_REDUCTION
        self.kernels = 0  # fused kernels charged
        self.fused_ops = 0  # ops in them

    @property
    def session(self) -> Any:
        """The rank session this layer serves (held weakly: `_modes` keeps the layer only while the session lives)."""
        return self._session()

    # ----- entering and leaving ----------------------------------------------------------------------
    def enter_region(self) -> None:
        if self.depth == 0:
            self._seq_start = _sequence_nr()
            self._push()
        self.depth += 1

    def exit_region(self) -> None:
        self.depth -= 1
        if self.depth:
            return
        self.flush()
        end = _sequence_nr()
        if end > self._seq_start:
            if self.ends and self.ends[-1] == self._seq_start:
                self.ends[-1] = end
            else:
                self.starts.append(self._seq_start)
                self.ends.append(end)
                if len(self.starts) > 1 << 16:  # regions whose backward never ran (inference): forget the oldest
                    del self.starts[: 1 << 15], self.ends[: 1 << 15]
        if not self.in_backward:
            self._pop()

    def begin_backward(self) -> None:
        self.in_backward = True
        self._push()

    def end_backward(self) -> None:
        self.flush()
        self.in_backward = False
        self._node = None
        if not self.depth:
            self._pop()

    def _push(self) -> None:
        if self.pushed:
            return
        s = self.session
        mode = None
        for m in reversed(_get_current_dispatch_mode_stack()):
            if getattr(m, "session", None) is s:
                mode = m
                break
        if mode is None:  # no charging mode (a process the rank forked): nothing is charged, nothing to fuse
            return
        self._mode = mode
        self._own_attr = "__torch_dispatch__" in mode.__dict__
        self._inner = mode.__torch_dispatch__
        # torch checks `__self__`; the partial calls `_dispatch(self, mode, ...)` without a Python frame of its own
        mode.__torch_dispatch__ = MethodType(functools.partial(Fusion._dispatch, self), mode)  # type: ignore[method-assign]
        self.pushed = True

    def _hook(self) -> None:
        """The session's charges come to `_charge` (while an op's charge is caught or groups are open; otherwise
        the compiled per-op path charges an extern kernel itself)."""
        s = self.session
        self._saved_charge = s.__dict__.get("charge")
        s.charge = self._charge
        self.hooked = True

    def _unhook(self) -> None:
        if not self.hooked:
            return
        self.hooked = False
        s = self.session
        if self._saved_charge is None:
            s.__dict__.pop("charge", None)
        else:
            s.charge = self._saved_charge
            self._saved_charge = None  # (a bound method of the session: not kept past the hook)

    def _pop(self) -> None:
        if not self.pushed:
            return
        self.pushed = False
        mode = self._mode
        if self._own_attr:
            mode.__torch_dispatch__ = self._inner
        else:
            mode.__dict__.pop("__torch_dispatch__", None)
        self._mode = self._inner = None
        self._unhook()

    def _real_charge(self, name: str, cost: OpCost) -> None:
        charge = self._saved_charge
        if charge is None:
            s = self._session()
            if s is None:  # the session was collected: nothing left to charge
                return
            type(s).charge(s, name, cost)
        else:
            charge(name, cost)

    def _charge(self, name: str, cost: OpCost) -> None:
        if self.capture is not None:
            self.capture.append(cost)
            return
        if self.groups and cost.ns:  # a kernel of its own (a view's or an allocation's charge launches none)
            self.flush()
        self._real_charge(name, cost)

    # ----- the ops ------------------------------------------------------------------------------------
    def _in_region(self) -> bool:
        if self.depth:
            return True
        if not self.in_backward:
            return False
        node = _current_node()
        if node is None:
            return False
        if node is self._node:  # the node whose backward runs several ops: asked once
            return self._node_in
        seq = node._sequence_nr()
        i = bisect.bisect_right(self.starts, seq) - 1
        self._node = node
        self._node_in = found = i >= 0 and seq < self.ends[i]
        return found

    def _dispatch(self, _mode: Any, func: Any, types: tuple, args: tuple = (), kwargs: dict | None = None) -> Any:
        inner = self._inner
        if self.busy:
            return inner(func, types, args, kwargs)
        if kwargs is None:
            kwargs = {}
        if _get_ident() != self.thread or _get_mode(_FAKE) is not None:
            return inner(func, types, args, kwargs)
        if not self._in_region():  # the backward of a node outside the regions: what the region made is written
            if self.groups:
                self.flush()
            return inner(func, types, args, kwargs)
        k = _KINDS.get(id(func))
        if k is None:
            k = kind(func)
        if k == _FUSE:
            dev = kwargs.get("device")
            if types != _SIMCUDA_ONLY and types:
                k = _EXTERN  # another subclass's op (DTensor): its own dispatch runs its local ops
            elif dev is not None and not is_cuda_device(dev):
                k = _EXTERN  # off the GPU
            elif dev is not None and args and isinstance(args[0], torch.Tensor):
                if type(args[0]) is SimCudaTensor and cuda_index(dev) == args[0]._sim_index:
                    kwargs = {n: v for n, v in kwargs.items() if n != "device"}  # autocast's .to(dtype): a cast
                else:
                    k = _EXTERN  # onto the GPU, or onto another
            else:
                for t in args:
                    if type(t) is SimCudaTensor:
                        if t.elem.is_complex():  # Inductor generates no code for complex ops: eager kernels
                            k = _EXTERN
                            break
                    elif isinstance(t, torch.Tensor) and t.dim():  # a host tensor: a copy, a CPU-only program
                        k = _EXTERN
                        break
        if k == _EXTERN:
            if self.groups:
                self.flush()
            k = _FREE
        self.busy = True
        try:
            if k == _FUSE:
                if not self.hooked:
                    self._hook()
                cap: list[OpCost] = []
                self.capture = cap
                try:
                    out = inner(func, types, args, kwargs)
                finally:
                    self.capture = None
            else:
                out = inner(func, types, args, kwargs)
        finally:
            self.busy = False
        if out is NotImplemented:
            return out
        if k == _FUSE:
            self._add(func, args, kwargs, out, cap)
        elif k == _VIEW and self.made and args:
            self._alias(args[0], out)
        return out

    def _alias(self, base: Any, out: Any) -> None:
        e = self.made.get(id(base))
        if e is None or e[0]() is not base:
            return
        buf = e[1]
        for t in tensors_in(out):
            r = weakref.ref(t)
            buf.refs.append(r)
            self.made[id(t)] = (r, buf)

    def _add(self, func: Any, args: tuple, kwargs: dict, out: Any, cap: list[OpCost]) -> None:
        """One fusible op, run and its charge caught: into a group."""
        ns = flops = 0
        dtype = ""
        for c in cap:
            ns += c.ns
            flops += c.flops
            dtype = dtype or c.dtype
        if not ns:  # no kernel launched (dropout with p = 0, an op on meta data in real mode): like a view
            if self.made and args:
                self._alias(args[0], out)
            return
        made = self.made
        ins = tensors_in(args)
        if kwargs:
            tensors_in(kwargs, ins)
        gather = _op_info(func)[0] == _GATHER
        outs = tensors_in(out)
        # one pass over the inputs: the buffer an open group made of each, and the largest input's elements
        found: list[tuple[torch.Tensor, int, _Buf | None, Any]] = []
        big = 0
        for t in ins:
            key = id(t)
            e = made.get(key)
            if e is not None and e[0]() is t:
                found.append((t, key, e[1], e[0]))
            else:
                found.append((t, key, None, None))
            n = _numel(t)
            if n > big:
                big = n
        # the op's iteration space: (numel, 1) pointwise, (outputs, elements reduced into each) a reduction
        numel = _numel(outs[0]) if outs else 0
        rnumel = big // numel if not gather and numel and big > numel and not big % numel else 1
        mix = self.mix_order
        group: _Group | None = None
        reads: list[tuple[torch.Tensor, int, _Buf | None, Any]] = []
        inlined: list[_Src] = []
        for item in found:
            buf = item[2]
            if buf is None:
                reads.append(item)
                continue
            g = buf.group
            if g is group:
                continue
            if not fits(g.numel, g.rnumel, numel, rnumel, mix) or (
                group is not None and not fits(group.numel, group.rnumel, g.numel, g.rnumel, mix)
            ):  # another iteration space: another kernel
                if buf.srcs is not None:
                    inlined += buf.srcs  # a pointwise chain's result: recomputed here from what it reads
                else:
                    buf.shared = True  # a reduction's result: its kernel writes it, this one reads it back
                    reads.append(item)
            elif group is None:
                group = g
            else:
                first, second = (group, g) if self.groups.index(group) < self.groups.index(g) else (g, group)
                first.absorb(second)
                self.groups.remove(second)
                group = first
        if group is not None and group.ops >= MAX_FUSION_SIZE:
            self._close(group)  # Inductor's limit: its outputs this op takes are read back from memory
            reads = [(item[0], item[1], None, None) for item in found]
            group = None
        if group is None:
            group = _Group(numel, rnumel)
            self.groups.append(group)
        elif rnumel > 1 and group.rnumel == 1:
            group.numel, group.rnumel = numel, rnumel  # a reduction over the pointwise ops before it
        seen = group.seen
        srcs: list[_Src] | None = [] if rnumel == 1 else None
        for t, _key, src_buf, ref in reads:
            if ref is None:
                ref = weakref.ref(t)  # (torch keeps one weak reference a tensor: the same object each time)
            rkey = id(ref)  # a weak reference the group holds: its id is no other's, even once the tensor is dead
            e2 = seen.get(rkey)
            if e2 is None:
                nbytes = tensor_bytes(out) if gather and t is args[0] else tensor_bytes(t)
                e2 = seen[rkey] = (ref, nbytes)
                group.read += nbytes
            if srcs is not None:
                if src_buf is not None and src_buf.srcs is not None:
                    srcs += src_buf.srcs
                else:
                    srcs.append((rkey, ref, e2[1], src_buf))
        for rkey, ref, nbytes, src_buf in inlined:
            if src_buf is not None:
                if src_buf.group is group:
                    continue  # made in this kernel
                src_buf.shared = True
            if rkey not in seen:
                seen[rkey] = (ref, nbytes)
                group.read += nbytes
        if srcs is not None:
            if inlined:
                srcs += inlined
            for _t, _key, buf, ref in found:  # this group's own results it reads: their chains
                if buf is not None and buf.group is group:
                    if buf.srcs is None:
                        srcs.append((id(ref), ref, buf.nbytes, buf))
                    else:
                        srcs += buf.srcs
            if len(srcs) > MAX_SOURCES:
                srcs = None
        group.ops += 1
        group.flops += flops
        group.dtype = group.dtype or dtype
        if len(group.names) < 4:
            group.names.append(func.overloadpacket.__name__)
        for t in outs:
            key = id(t)
            e = made.get(key)
            if e is not None and e[0]() is t:
                buf = e[1]
                if buf.group is not group:  # written in place by this group: it is this group's output now
                    buf.group.bufs.remove(buf)
                    buf.group = group
                    group.bufs.append(buf)
                buf.srcs = None  # a mutated buffer is realized
                continue
            r = weakref.ref(t)
            buf = _Buf(group, tensor_bytes(t), r, srcs)
            group.bufs.append(buf)
            made[key] = (r, buf)

    # ----- the kernels --------------------------------------------------------------------------------
    def flush(self) -> None:
        """Close every open group: each is charged as one kernel."""
        groups = self.groups
        self.groups = []
        self.made.clear()
        for g in groups:
            self._charge_group(g)
        if self.hooked:
            self._unhook()

    def _close(self, group: _Group) -> None:
        self.groups.remove(group)
        for b in group.bufs:
            for r in b.refs:
                t = r()
                if t is not None:
                    self.made.pop(id(t), None)
        self._charge_group(group)

    def _charge_group(self, g: _Group) -> None:
        written = g.written()
        if not written:
            return  # every result inlined into other kernels or dropped: Inductor generates no kernel for it
        model = self.session.model
        nbytes = g.read + written
        ns = memory_ns(model, nbytes)
        if g.flops:
            ns = max(ns, math.ceil(g.flops / model.gpu.peak(g.dtype) * 1e9))
        name = "fused:" + "_".join(g.names) + (f"+{g.ops - len(g.names)}" if g.ops > len(g.names) else "")
        self.kernels += 1
        self.fused_ops += g.ops
        self._real_charge(name, OpCost(g.flops, nbytes, g.dtype, ns + model.launch_ns, TIER))


def memory_ns(model: Any, nbytes: int) -> int:
    """GPU time of one generated kernel moving `nbytes` through HBM. Under the roofline model (`compute.Roofline`):
    the bytes at HBM bandwidth. Under the calibrated one: the perfmodel's own time of an elementwise kernel moving
    as many bytes (a bf16 add: two reads and a write), so a fused kernel reaches the bandwidth an eager
    elementwise kernel of that size does in the same model (77-88 % of the peak on a large one)."""
    perf = getattr(model, "model", None)
    if perf is None or nbytes < 6:
        return math.ceil(nbytes / model.gpu.mem_bw * 1e9)
    n = (nbytes + 5) // 6
    cache = _MEMORY_NS.get(perf)
    if cache is None:
        cache = _MEMORY_NS[perf] = {}
    ns = cache.get(n)
    if ns is None:
        if len(cache) > 1 << 16:
            cache.clear()
        ns = cache[n] = int(perf.predict_ns("aten::add", [[n], [n]], ["bf16", "bf16"]))
    return ns


# perfmodel -> {elements: ns}: a step's groups repeat every step. Keyed by the model itself, weakly (an id a freed
# model had could be another's).
_MEMORY_NS: weakref.WeakKeyDictionary[Any, dict[int, int]] = weakref.WeakKeyDictionary()


# session -> its fusion layer. Keyed by the session itself, weakly, and the layer refers to it weakly: a session the
# program (or a test) drops is collected with its layer, open groups and region ranges.
_modes: weakref.WeakKeyDictionary[Any, Fusion] = weakref.WeakKeyDictionary()


def mode_of(session: Any) -> Fusion:
    """The fusion layer of a rank session (made on first use)."""
    m = _modes.get(session)
    if m is None:
        m = _modes[session] = Fusion(session)
    return m


def _session() -> Any:
    from phantora.runtime import session

    return session.current()


def region(fn: Any, inductor: bool = True) -> Any:
    """`fn` (what torch.compile returned) run as a compiled region: its ops, and its backward's, fused. `inductor`:
    the program asked for Inductor (whose lowering refuses what a GPU's compiler would, `in_inductor`)."""

    @functools.wraps(fn)
    def run_compiled(*args: Any, **kwargs: Any) -> Any:
        s = _session()
        if s is None:
            return fn(*args, **kwargs)
        m = mode_of(s)
        m.enter_region()
        m.inductor += inductor
        try:
            return fn(*args, **kwargs)
        finally:
            m.inductor -= inductor
            m.exit_region()

    run_compiled._phantora_region = True  # type: ignore[attr-defined]
    return run_compiled


def in_inductor(session: Any) -> bool:
    """Whether `session`'s thread runs a region the program compiled with Inductor (its forward)."""
    m = _modes.get(session)
    return m is not None and m.inductor > 0 and m.thread == _get_ident()


def compiled(result: Any, inductor: bool = True) -> Any:
    """What torch.compile returned, its calls made compiled regions: a module's `forward` (torch's OptimizedModule
    keeps it on the instance), or the function itself. Also makes autograd's entry points time a region's
    backward as fused (`_backward_entry`). `inductor`: the program asked for Inductor (`region`)."""
    _install_backward()
    if isinstance(result, torch.nn.Module):
        fwd = result.__dict__.get("forward")
        if fwd is not None and not getattr(fwd, "_phantora_region", False):
            result.forward = region(fwd, inductor)
        return result
    if callable(result) and not getattr(result, "_phantora_region", False):
        return region(result, inductor)
    return result


def _backward_entry(orig: Any) -> Any:
    @functools.wraps(orig)
    def run_backward(*args: Any, **kwargs: Any) -> Any:
        s = _session()
        m = _modes.get(s) if s is not None else None
        if m is None or not m.starts or m.in_backward or _get_ident() != m.thread:
            return orig(*args, **kwargs)
        m.begin_backward()
        try:
            return orig(*args, **kwargs)
        finally:
            m.end_backward()

    run_backward._phantora = True  # type: ignore[attr-defined]
    return run_backward


def _install_backward() -> None:
    """torch.autograd.backward (Tensor.backward calls it) and torch.autograd.grad, once per process."""
    for name in ("backward", "grad"):
        fn = getattr(torch.autograd, name)
        if not getattr(fn, "_phantora", False):
            setattr(torch.autograd, name, _backward_entry(fn))
