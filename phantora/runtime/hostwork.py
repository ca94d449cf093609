"""A rank's host work: the CPU ops of a program that uses the simulated GPU, and its copies between host and GPU.

Once a program uses the GPU, its CPU tensors are host data and their ops host work (dispatch.py). They run for real
on this machine, whose time says nothing of the target's; `HostModel` times each on the target host
(`phantora.perfmodel.hosts`: the DGX of the run's GPU, or `PHANTORA_HOST`): a roofline of the op's bytes (inputs,
outputs and the arguments it writes in place) and FLOPs on the rank's share of the host, with the threads the
program runs (`torch.get_num_threads()`: `OMP_NUM_THREADS`, or `PHANTORA_HOST_THREADS` to model another count
without running it here) among `LOCAL_WORLD_SIZE` ranks on the host. The session charges it on the host's clock
(`RankSession.host_work`): the host is busy for that long and the GPU runs no later work before it ends.

A copy between a host tensor and the simulated GPU (`.to("cuda")`, `.cpu()`, `copy_` either way) is charged as a
transfer over the GPU's PCIe link (`HostCopy`, `hosts.copy_ns`), pinned or pageable, on the compute lane (stream
order); a blocking one (not `non_blocking` from pinned memory, as CUDA makes it) also makes the host wait for it.

DeepSpeed's CPU Adam (`DeepSpeedCPUAdam`, ZeRO-Offload's optimizer) is a C++ extension that torch's dispatch
never sees: `install` wraps its `adam_update` so each call is charged as the fused update it is (`adam_bytes`).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch

from phantora.errors import InputError
from phantora.perfmodel.gpus import GpuSpec
from phantora.perfmodel.hosts import (
    HostSpec,
    RankShare,
    copy_ns,
    fault_ns,
    get_host,
    host_of_gpu,
    op_ns,
    rank_share,
)
from phantora.runtime import import_hooks
from phantora.runtime.compute import cache_key, op_bytes, op_flops, tensors_in
from phantora.runtime.simcuda import pinned
from phantora.runtime.simcuda.tensor import SimCudaTensor, is_cuda_device, on_device

SWITCH_ENV = "PHANTORA_HOST_COMPUTE"  # on | 1: charge host ops and PCIe copies so (off by default, docs/runtime.md)
HOST_ENV = "PHANTORA_HOST"  # a host of phantora.perfmodel.hosts (default: the DGX of the run's GPU)
THREADS_ENV = "PHANTORA_HOST_THREADS"  # the threads a rank's host ops are modelled with (default: torch's)
aten = torch.ops.aten
_COPY = aten.copy_.default
_TO_COPY = aten._to_copy.default
_TO = aten.to.dtype_layout
COPIES = frozenset({_COPY, _TO_COPY, _TO})
_NO_KERNEL = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "set_", "resize_"})
_NO_KERNEL |= {"detach", "alias", "lift_fresh", "_unsafe_view", "_reshape_alias", "is_same_size", "_local_scalar_dense"}
ADAM_FLOPS = 16  # FLOP an element of DeepSpeed's fused Adam step (Step_AVX: moments, sqrt, divide, decay, update)


@dataclass(frozen=True, slots=True)
class HostCopy:
    """A copy between host memory and the simulated GPU."""

    kind: str  # "h2d" | "d2h"
    nbytes: int
    pinned: bool  # the host side is pinned memory
    blocking: bool  # the host waits for it: not `non_blocking`, or from pageable memory

    @property
    def name(self) -> str:
        return f"memcpy_{self.kind}"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def transfer(func: Any, args: tuple, kwargs: dict) -> HostCopy | None:
    """The transfer `func(*args, **kwargs)` is, if it copies between a host tensor and a simulated GPU tensor. Not
    an op the simulated GPU runs on its own data (`on_device`): in real mode a cast on the GPU (`x.to(torch.bfloat16)`)
    runs again as `_to_copy(..., device="cpu")` on the host tensor that holds the data, which crosses no link."""
    if func not in COPIES or not args or on_device():
        return None
    src = args[0]
    if func is _COPY:
        if len(args) < 2:
            return None
        dst, src = args[0], args[1]
        non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        if isinstance(dst, SimCudaTensor) and type(src) is torch.Tensor:
            kind, host = "h2d", src
        elif type(dst) is torch.Tensor and isinstance(src, SimCudaTensor):
            kind, host = "d2h", dst
        else:
            return None
        nbytes = _nbytes(dst)
    else:
        dev = kwargs.get("device")
        non_blocking = bool(kwargs.get("non_blocking", False))
        if dev is None or not isinstance(src, torch.Tensor):
            return None
        if type(src) is torch.Tensor and is_cuda_device(dev):
            kind, host = "h2d", src
        elif isinstance(src, SimCudaTensor) and torch.device(dev).type == "cpu":
            kind, host = "d2h", src
        else:
            return None
        nbytes = _nbytes(src)  # a cast on the way happens on the device side; the link carries the source's bytes
        if kind == "d2h":  # torch pins the host output of a non-blocking copy off the GPU (`_to_copy`'s pin_out)
            pin = bool(kwargs.get("pin_memory")) or non_blocking
            return HostCopy(kind, nbytes, pin, not (non_blocking and pin))
    is_pinned = pinned.in_pinned_memory(host)
    return HostCopy(kind, nbytes, is_pinned, not (non_blocking and is_pinned))


def written_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """Bytes of the tensors `func` writes in place (its schema's `Tensor(a!)` arguments) that its outputs do not
    already count: an in-place op that returns nothing (`_fused_adamw_`, `_foreach_mul_`) still writes them."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return 0
    returned = {id(t) for t in tensors_in(out)}
    total = 0
    for i, a in enumerate(schema.arguments):
        info = a.alias_info
        if info is None or not info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(a.name)
        if a.name == "grads" and kwargs.get("grad_scale") is None and schema.name.startswith("aten::_fused_adam"):
            continue  # the fused Adam(W) kernels write their gradients only to unscale them (grad_scale given)
        total += sum(_nbytes(t) for t in tensors_in(value) if id(t) not in returned)
    return total


def fresh_outputs(func: Any, out: Any) -> list[int]:
    """Bytes of each tensor `func` returns in a new pageable allocation (its schema's returns that alias no argument:
    `sqrt`'s, `div`'s output; not an in-place op's, an `out=` variant's or a view's, nor pinned memory, which torch's
    CachingHostAllocator hands out from page-locked blocks it keeps: `_pin_memory`, `pin_memory=True`)."""
    schema = getattr(func, "_schema", None)
    if schema is None or any(r.alias_info is not None for r in schema.returns):
        return []
    return [_nbytes(t) for t in tensors_in(out) if not pinned.in_pinned_memory(t)]


def _elements(args: tuple, kwargs: dict, out: Any) -> int:
    ts = tensors_in(args)
    tensors_in(kwargs, ts)
    tensors_in(out, ts)
    return max((t.numel() for t in ts), default=0)


def adam_bytes(params: torch.Tensor, grads: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor) -> int:
    """DRAM bytes of one fused Adam update (DeepSpeed's `adam_update`): the parameters, the first and second moments
    read and written, the gradients read."""
    return 2 * (_nbytes(params) + _nbytes(exp_avg) + _nbytes(exp_avg_sq)) + _nbytes(grads)


class HostModel:
    """The target host of one rank: times its host ops and its copies over PCIe."""

    def __init__(self, host: HostSpec, ranks: int, link_bw: float, threads: int | None = None) -> None:
        self.host = host
        self.ranks = ranks
        self.link_bw = link_bw
        self.fixed_threads = threads
        self._shares: dict[int, RankShare] = {}
        self._ns: dict[Any, int] = {}

    def threads(self) -> int:
        """The program's threads: `PHANTORA_HOST_THREADS` if given, else torch's intra-op thread count now."""
        return self.fixed_threads or torch.get_num_threads()

    def share(self) -> RankShare:
        n = self.threads()
        got = self._shares.get(n)
        if got is None:
            got = self._shares[n] = rank_share(self.host, self.ranks, n)
        return got

    def op_ns(self, func: Any, args: tuple, kwargs: dict, out: Any) -> int:
        """A host op's time on this rank's share of the host (0 for ops that compute nothing); cached by the op, its
        arguments' shapes and dtypes and the thread count."""
        try:
            key = (cache_key(func, args, kwargs, out), self.threads())
            ns = self._ns.get(key)
        except TypeError:  # an unhashable argument
            key, ns = None, None
        if ns is None:
            ns = self._op_ns(func, args, kwargs, out)
            if key is not None:
                self._ns[key] = ns
        return ns

    def _op_ns(self, func: Any, args: tuple, kwargs: dict, out: Any) -> int:
        packet = getattr(func, "overloadpacket", None)
        if getattr(func, "is_view", False) or getattr(packet, "__name__", "") in _NO_KERNEL:
            return 0
        nbytes = op_bytes(func, args, kwargs, out) + written_bytes(func, args, kwargs, out)
        ns = op_ns(self.share(), nbytes, op_flops(func, args, kwargs, out), _elements(args, kwargs, out))
        return ns + sum(fault_ns(b) for b in fresh_outputs(func, out))  # a large fresh output's pages fault in

    def bytes_ns(self, nbytes: int, flops: int, elements: int) -> int:
        """The time of host work given by its bytes and FLOPs (an extension's op torch's dispatch does not see)."""
        return op_ns(self.share(), nbytes, flops, elements)

    def copy_ns(self, t: HostCopy) -> int:
        """A transfer's time over the GPU's PCIe link."""
        return copy_ns(t.nbytes, self.link_bw, t.pinned, self.host)


def enabled(env: dict[str, str] | None = None) -> bool:
    """Whether `PHANTORA_HOST_COMPUTE` turns the host model on: `on` or `1` yes; unset, empty, `off` or `0` no;
    another value is an InputError naming it."""
    raw = (os.environ if env is None else env).get(SWITCH_ENV, "").strip().lower()
    if raw in ("", "off", "0"):
        return False
    if raw in ("on", "1"):
        return True
    raise InputError(f"expected on, 1, off or 0, got {raw!r}", field=SWITCH_ENV)


def from_env(gpu: GpuSpec, env: dict[str, str] | None = None) -> HostModel:
    """The rank's host model: `PHANTORA_HOST` (else the DGX of `gpu`), `LOCAL_WORLD_SIZE` ranks on it,
    `PHANTORA_HOST_THREADS` threads (else torch's at each op)."""
    env = dict(os.environ if env is None else env)
    name = env.get(HOST_ENV)
    host = get_host(name) if name else host_of_gpu(gpu.name)
    raw = env.get(THREADS_ENV)
    threads = None
    if raw:
        try:
            threads = int(raw)
        except ValueError:
            threads = 0
        if threads < 1:
            raise InputError(f"expected a thread count >= 1, got {raw!r}", field=THREADS_ENV)
    return HostModel(host, max(1, int(env.get("LOCAL_WORLD_SIZE", "1") or 1)), gpu.host_bw, threads)


def _patch_cpu_adam(session: Callable[[], Any], module: ModuleType) -> None:
    """DeepSpeedCPUAdam: its C++ `adam_update`, charged as host work each call to the rank's `session()`."""
    cls = getattr(module, "DeepSpeedCPUAdam", None)
    if cls is None or getattr(cls.__init__, "_phantora_host", False):
        return
    init = cls.__init__

    def charged_init(self: Any, *a: Any, **k: Any) -> None:
        init(self, *a, **k)
        ops = getattr(self, "ds_opt_adam", None)
        if ops is not None and not isinstance(ops, _ChargedAdam):
            self.ds_opt_adam = _ChargedAdam(ops, session)

    charged_init._phantora_host = True  # type: ignore[attr-defined]
    cls.__init__ = charged_init


class _ChargedAdam:
    """DeepSpeed's compiled CPU Adam module, whose `adam_update` is charged to the rank's host."""

    def __init__(self, ops: Any, session: Callable[[], Any]) -> None:
        self._ops = ops
        self._session = session

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ops, name)

    def adam_update(self, *args: Any) -> Any:
        out = self._ops.adam_update(*args)
        s = self._session()
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if s is not None and s.host is not None and len(tensors) >= 4:
            params, grads, exp_avg, exp_avg_sq = tensors[:4]
            n = params.numel()
            ns = s.host.bytes_ns(adam_bytes(params, grads, exp_avg, exp_avg_sq), ADAM_FLOPS * n, n)
            s.host_work("cpu_adam.adam_update", ns)
        return out


def install(session: Callable[[], Any]) -> None:
    """Charge DeepSpeedCPUAdam's update to `session()` (the rank's RankSession) when the program imports it."""
    import_hooks.after_import("deepspeed.ops.adam.cpu_adam", functools.partial(_patch_cpu_adam, session))
