"""The TorchDispatchMode that charges every aten op to the rank's virtual clock.

For each op: join any collective in flight whose memory the op touches, run the op for real,
and advance the compute lane by the GPU model's duration (`compute.op_time_ns`). Functional
collectives go to `functional.run`. Ops on fake tensors (sharding propagation) are bookkeeping,
not GPU kernels: they run uncharged; so do ops on meta tensors (meta init) in real mode, while in
phantom mode meta tensors are the rank's tensors and are charged like any other. Other tensor subclasses (DTensor,
AsyncCollectiveTensor) are left to their own dispatch, whose plain-tensor ops come back here.

A thread the program starts gets the mode too (`adopt`, from bootstrap.py's `threading.Thread.start`): its ops are
the simulated GPU's, charged on the lane of that thread's current stream (`RankSession.charge_on`) from its host
time, each in its turn in simulated time (host_clocks.py); its host ops run as plain torch, timed on its host
clock. From its start until it ends, the rank's GPU ops run one at a time under one lock: the program's holds it in
the compiled entry (simcuda/_fastop.c), the others' in the Python route (`_off_thread`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from phantora.runtime import flex_attention, functional, hostwork, phantom_mode
from phantora.runtime.compute import tensors_in
from phantora.runtime.session import RankSession
from phantora.runtime.simcuda import compiled, fastpath, kept_values, pinned, routes
from phantora.runtime.simcuda import device as simcuda
from phantora.runtime.simcuda import streams as simstreams
from phantora.runtime.simcuda.tensor import SimCudaTensor, run_op

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


_META = torch.device("meta")
_FAKE = torch._C._TorchDispatchModeKey.FAKE
_get_mode = torch._C._get_dispatch_mode
_get_ident = threading.get_ident
_SIMCUDA_ONLY = (SimCudaTensor,)
_COPY = torch.ops.aten.copy_.default
_TO_COPY = torch.ops.aten._to_copy.default
# a copy with a `device` keyword: `_to_copy`, or `to` itself where the Python dispatcher is on (inside DTensor's)
_DEVICE_COPIES = frozenset({_TO_COPY, torch.ops.aten.to.dtype_layout})
_ITEM = torch.ops.aten._local_scalar_dense.default  # .item(), bool(t), .tolist()
_EQUAL = torch.ops.aten.equal.default  # torch.equal: a comparison of values, answered on the host
_LAZY_CLONE = torch.ops.aten._lazy_clone.default  # copy-on-write: a hooked storage is unhooked first
# factories whose memory torch leaves as it finds it: on the simulated GPU in real mode they are zero-filled, since the
# host allocator hands out freed blocks whose stale bytes differ from run to run (gloo's threads allocate too), and
# programs do read them: torch's pipeline stages run their shape inference on such buffers (docs/runtime.md)
_UNINITIALISED = frozenset(
    {
        torch.ops.aten.empty.memory_format,
        torch.ops.aten.empty_strided.default,
        torch.ops.aten.empty_like.default,
        torch.ops.aten.new_empty.default,
        torch.ops.aten.new_empty_strided.default,
    }
)
_NAMES: dict[int, str] = {}


def _name(func: Any) -> str:
    name = _NAMES.get(id(func))
    if name is None:
        name = _NAMES[id(func)] = str(func.overloadpacket)
    return name


_INDEX_FACTORIES = {"arange", "range", "randint", "randperm", "scalar_tensor", "tensor"}


def _integer_host_data(t: Any) -> bool:
    """A host tensor of integers or booleans with values: in phantom mode, a copy to the GPU keeps them."""
    return type(t) is torch.Tensor and not t.is_meta and not t.is_floating_point() and not t.is_complex()


def _host_data(func: Any, kwargs: dict, leaves: list[torch.Tensor]) -> bool:
    """Phantom mode: would this op put tensor data on the host? Then it goes to meta instead.

    Copies out of meta tensors (`.cpu()`, `.to("cpu")`) and floating-point buffers allocated on
    the CPU (FSDP2 allocates its all-gather buffers on the mesh's device, "cpu" here) are GPU data
    of the simulated job. Integer tensors made on the CPU are bookkeeping whose values are read
    (DeviceMesh's rank layout, index lists): they stay real.
    """
    dev = kwargs["device"]
    if dev is None or torch.device(dev).type != "cpu":
        return False
    if any(t.is_meta for t in leaves):
        return True
    dtype = kwargs.get("dtype")
    if dtype is None:
        return func.overloadpacket.__name__ not in _INDEX_FACTORIES
    return dtype.is_floating_point or dtype.is_complex


def _factory_bytes(args: tuple, kwargs: dict) -> int:
    """Bytes a factory op (``empty(size, ...)``, ``zeros``, ``full`` ...) will allocate; 0 if unknown."""
    size = args[0] if args and isinstance(args[0], list | tuple) else None
    if size is None or not all(isinstance(d, int) for d in size):
        return 0
    dtype = kwargs.get("dtype") or torch.get_default_dtype()
    return math.prod(size) * dtype.itemsize


class ChargeMode(TorchDispatchMode):
    """Charges aten ops to a `RankSession`; enter it for the whole run."""

    def __init__(self, session: RankSession) -> None:
        super().__init__()
        self.session = session
        _without_dynamo_guard()
        self.thread: int | None = threading.get_ident()  # None: detached, every op runs as plain torch
        # (the compiled entry charges this thread's ops; it hands the others' to the Python route, `_off_thread`)
        self.program: int | None = self.thread  # the program's thread
        self._threads: dict[int, Any] = {}  # a thread the program started -> its host clock (host_clocks.Part)
        self._lock = threading.Lock()  # one op at a time while such threads live
        self._holder: int | None = None  # the thread whose op holds the lock
        self._live = 0  # threads started for adoption that have not ended (the rank's ops in turn meanwhile)
        # `_lock` while they live, else None: both entries, the compiled one too, take it around each op then
        self._turns: threading.Lock | None = None
        self._link: hostwork.HostCopy | None = None  # the host<->GPU copy being dispatched (charged over PCIe)
        if type(self) is ChargeMode:  # the same checks and fast path, compiled (torch finds the instance's first)
            fast = compiled.mode_dispatch(self, ChargeMode.__dict__["__torch_dispatch__"])
            if fast is not None:
                self.__torch_dispatch__ = fast  # type: ignore[method-assign]

    def detach(self) -> None:
        """Stop charging: in a process the rank forked (a DataLoader worker), ops are host work."""
        self.thread = self.program = self._turns = None
        self._threads.clear()

    def charges(self, ident: int) -> bool:
        """Are the ops of thread `ident` charged (the program's, or one it started: `adopt`)?"""
        return self.thread is not None and (ident == self.program or ident in self._threads)

    @contextlib.contextmanager
    def ops_released(self) -> Iterator[None]:
        """Inside: the calling thread's own op, if one holds the rank's op lock, lets it go (the other threads' ops run
        meanwhile), and takes it back after (a thread waiting for its turn or its collective, host_clocks.py)."""
        me = _get_ident()
        if self._holder != me:
            yield
            return
        self._holder = None
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()
            self._holder = me

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        """`_lock` for the bookkeeping of adopted threads, unless the calling thread's op already holds it (a thread
        started, or one ending, inside an op run in turn: the lock is not re-entrant)."""
        if self._holder == _get_ident():
            yield
            return
        with self._lock:
            yield

    def starting(self) -> None:
        """The program's thread (or an adopted one) starts a thread to adopt: from now on the rank's ops run one at
        a time, each holding `_turns` from its start to its end (said here, between the program's ops: one in its
        kernel, which lets other threads run, would not hold the lock for the rest of it)."""
        with self._held():
            if self.thread is not None:
                self._live += 1
                self._turns = self._lock

    def adopt(self, part: Any) -> None:
        """The calling thread, one `starting` announced, runs its GPU work on the simulated GPU from now on, each
        kernel not before its host time (`part`, host_clocks.py); its host ops stay plain torch, as on a thread of a
        GPU host (their time on its host clock)."""
        with self._held():
            if self.thread is not None:
                self._threads[threading.get_ident()] = part

    def release(self) -> None:
        """A thread `starting` announced ends (or did not start); with the last, the rank's ops run without the
        lock again (switched under it: no op is in flight)."""
        with self._held():
            self._threads.pop(threading.get_ident(), None)
            self._live -= 1
            if not self._live:
                self._turns = None

    def _off_thread(self, func: Any, types: tuple[type, ...], args: tuple, kwargs: dict) -> Any:
        """An op the entry does not run straight on: gloo's workers' (which inherit the mode: their copies are not
        GPU work) and a detached mode's run as plain torch; the program's while threads live (where the compiled
        entry does not take the lock itself: without `_fastop`) and its adopted threads' run under the lock, an
        adopted thread's in its turn in simulated time (host_clocks.py), charged on its current stream's lane from
        its host time; its host ops run as plain torch, their time on its host clock."""
        me = _get_ident()
        part = self._threads.get(me)
        if self.thread is None or (part is None and me != self.program):
            return func(*args, **kwargs)
        s = self.session
        clocks = s.host_clocks
        if part is not None and not _gpu_work(types, kwargs):  # host work of a thread: plain torch
            out = func(*args, **kwargs)
            if s.host is not None and clocks is not None and simcuda.cuda_seen():
                clocks.spend(part, s.host.op_ns(func, args, kwargs, out))
            return out
        if part is not None and clocks is not None:
            clocks.turn(part)  # every thread that could launch before it has: the lanes' order is simulated time's
        with self._lock:
            self._holder = me  # its ops within this one (the op's own dispatch) go straight on
            if part is None:
                try:
                    return type(self).__torch_dispatch__(self, func, types, args, kwargs)
                finally:
                    self._holder = None
            prev = s.__dict__.get("charge")  # a compiled region's (fusion.py), if one is open
            launches = [0]
            charge = _thread_charge(s, me, simstreams.current_stream().stream_id, part, launches, prev)
            s.charge = charge  # type: ignore[method-assign]
            try:
                return type(self).__torch_dispatch__(self, func, types, args, kwargs)
            finally:
                self._holder = None
                if s.__dict__.get("charge") is charge:  # (else a region hooked it meanwhile and restores it)
                    if prev is None:
                        del s.charge
                    else:
                        s.charge = prev  # type: ignore[method-assign]
                if clocks is not None:  # its host spent each kernel's launch
                    clocks.spend(part, launches[0] * s._launch_ns)

    def __enter__(self) -> ChargeMode:
        self.session.memory.activate()  # parameter, gradient, optimizer and saved-tensor hooks
        return super().__enter__()

    def __exit__(self, *exc: Any) -> Any:
        try:
            return super().__exit__(*exc)
        finally:
            self.session.memory.deactivate()

    def __torch_dispatch__(
        self, func: Any, types: tuple[type, ...], args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        s = self.session
        me = _get_ident()
        if me != self._holder and (me != self.thread or self._turns is not None):
            return self._off_thread(func, types, args, kwargs)
        if _get_mode(_FAKE) is not None:  # shape propagation (DTensor's, the compiler's): no kernel, no memory
            return func(*args, **kwargs)  # FakeTensorMode, an infra mode, runs after this one and makes it fake
        if types == _SIMCUDA_ONLY and "device" not in kwargs and simcuda.active():  # in one pass (fastpath.py)
            out = fastpath.device_op(s, func, args, kwargs)
            if out is not fastpath.SLOW:
                return out
        return self._general(func, types, args, kwargs)

    def _general(self, func: Any, types: tuple[type, ...], args: tuple, kwargs: dict) -> Any:
        """Every op the fast path does not take (the compiled entry, simcuda/_fastop.c, comes here directly)."""
        s = self.session
        if func in hostwork.COPIES and self._link is None and s.host is not None and simcuda.active():
            link = hostwork.transfer(func, args, kwargs)
            if link is not None:  # a copy between host and GPU: its kernel is charged as the transfer (`_charged`)
                self._link = link
                try:
                    out = self._general(func, types, args, kwargs)
                except BaseException:
                    self._link = None
                    raise
                if out is not NotImplemented:  # else the cuda tensors' dispatch sends the copy back here at once
                    self._link = None
                return out
        mem = s.memory  # simulated device memory: every op's outputs, real or meta (memory.py)
        if simcuda.active():
            if SimCudaTensor in types:
                if func.namespace == "_c10d_functional":
                    if func.overloadpacket.__name__ == "_wrap_tensor_autograd":
                        return functional.wrap_async(s, args[0])
                    index = next(t.device.index or 0 for t in tensors_in(args) if isinstance(t, SimCudaTensor))
                    with simcuda.device_work():
                        out = self.__torch_dispatch__(func, (), simcuda.unwrap(args), simcuda.unwrap(kwargs))
                    return simcuda.wrap(out, index)
                if "device" not in kwargs:
                    if len(types) == 1 and simcuda.direct(func):  # without a second trip through the dispatcher
                        out = run_op(func, args, kwargs, self._device_op)
                        if func in _UNINITIALISED and not s.phantom and type(out) is SimCudaTensor:
                            out.elem.zero_()  # empty_like and the like (fastpath.py leaves them to this route)
                        return out
                    return NotImplemented  # the cuda tensors' own dispatch unwraps them and comes back here
            dev = kwargs.get("device")
            if simcuda.is_cuda_device(dev):  # a factory or copy onto the simulated GPU
                index = simcuda.cuda_index(dev)
                if mem.enabled and not s.phantom:  # out of simulated memory before the host allocates it
                    mem.check_fits(_factory_bytes(args, kwargs))
                inner = simcuda.inner_device()
                if s.phantom and func in _DEVICE_COPIES and _integer_host_data(args[0]):
                    inner = torch.device("cpu")  # token ids, labels, masks keep their values (simcuda/tensor.py)
                elif s.phantom and (dtype := kept_values.on_host(func, args, kwargs)) is not None:
                    inner = torch.device("cpu")  # an integer or boolean factory: its values (kept_values.py)
                    kwargs = {**kwargs, "dtype": dtype}
                kwargs = {**kwargs, "device": inner}
                with simcuda.device_work():
                    if simcuda.rng.is_random(func) and kwargs.get("generator") is None:
                        run = functools.partial(self.__torch_dispatch__, func, types, args, kwargs)
                        out = simcuda.rng.draw(index, not s.phantom, run)
                    else:
                        out = self.__torch_dispatch__(func, types, args, kwargs)
                if func in _UNINITIALISED and not s.phantom and type(out) is torch.Tensor:
                    out.zero_()  # here the mode is off: no kernel charged, the same simulated time as phantom mode
                return simcuda.wrap(out, index)
        return self._charged(func, types, args, kwargs)

    def _device_op(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """An op of the simulated GPU on its data (plain tensors), from `run_op`: what the mode does when the
        cuda tensors' own dispatch sends the unwrapped op back through the dispatcher, without that round trip."""
        return self._charged(func, (), args, kwargs)

    def _charged(self, func: Any, types: tuple[type, ...], args: tuple, kwargs: dict) -> Any:
        """An op on plain tensors (or another subclass's): run it, count its memory, charge its time."""
        s = self.session
        mem = s.memory
        if func.namespace == "_c10d_functional":
            out = functional.run(s, func, args, kwargs)
            if mem.enabled:
                mem.on_outputs(out, func)
            return out
        if s.internal_active or func.namespace == "c10d":
            return func(*args, **kwargs)
        kind = _subclass_kind(types)
        if kind == "fake":
            return func(*args, **kwargs)
        if kind == "other":
            return NotImplemented
        if simcuda.active() and simcuda.cuda_seen() and not simcuda.on_device():
            out = pinned.host_op(func, args, kwargs)  # host work: a CUDA program's CPU tensors are not the GPU's
            if s.host is not None:  # timed on the target host (runtime/hostwork.py)
                s.host_work(_name(func), s.host.op_ns(func, args, kwargs, out))
            return out
        leaves = tensors_in(args)
        if kwargs:
            tensors_in(kwargs, leaves)
        if s.phantom and "device" in kwargs and _host_data(func, kwargs, leaves):
            kwargs = {**kwargs, "device": _META}
        if not s.phantom:  # real mode: meta tensors are bookkeeping (meta init), not GPU kernels
            for t in leaves:
                if t.is_meta:
                    out = func(*args, **kwargs)
                    if mem.enabled:
                        mem.on_outputs(out, func)
                    return out
        elif func is _COPY and len(leaves) >= 2 and leaves[1].is_meta and not leaves[0].is_meta:
            return phantom_mode.copy_to_host(leaves[0])
        elif func is _ITEM and leaves and leaves[0].is_meta:
            s.charge(_name(func), s.model.cost(func, args, kwargs, None))  # a device sync
            return phantom_mode.scalar_placeholder(leaves[0])
        elif func is _EQUAL and any(t.is_meta for t in leaves):
            raise phantom_mode.no_values(f"torch.equal compared tensors of shapes {[list(t.shape) for t in leaves]}")
        if s.by_storage:
            s.join_tensors(leaves)
        if func is _LAZY_CLONE:
            compiled.unhook(leaves)  # it makes a storage copy-on-write only from a plain DataPtr
        out = func(*args, **kwargs)
        if mem.enabled:
            mem.on_outputs(out, func)
        if not s.phantom:
            for t in tensors_in(out):
                if t.is_meta:
                    return out
        link = self._link
        if link is not None and func in hostwork.COPIES and s.host is not None:
            self._link = None
            s.host_copy(link, s.host.copy_ns(link))
            if link.kind == "d2h" and link.pinned and func is not _COPY and type(out) is torch.Tensor:
                pinned.mark(out)  # a pinned host tensor, as torch makes it (is_pinned() says so)
            return out
        s.charge(_name(func), s.model.cost(func, args, kwargs, out))
        return out


def _gpu_work(types: tuple[type, ...], kwargs: dict) -> bool:
    """Does an op touch the simulated GPU: a tensor other than a plain one, or a device other than the host's?"""
    if any(t not in _PLAIN for t in types):
        return True
    dev = kwargs.get("device")
    return dev is not None and simcuda.is_cuda_device(dev)


def _thread_charge(s: RankSession, me: int, stream: int, part: Any, launches: list[int], prev: Any) -> Any:
    """The session's `charge` while thread `me`'s op runs: its charges on its stream's lane (`charge_on`), each
    kernel not before its launch on the thread's host clock (`part`: the op's `launches` so far after its host time);
    another thread's (the program's, which does not wait for the lock to charge a Triton kernel) as before."""

    def charge(name: str, cost: Any) -> None:
        if _get_ident() == me:
            if s.charge_on(stream, part.h + launches[0] * s._launch_ns, name, cost):
                launches[0] += 1
        elif prev is not None:
            prev(name, cost)
        else:
            type(s).charge(s, name, cost)

    return charge


flex_attention.register(ChargeMode)  # FlexAttention's operators, whole (flex_attention.py)
routes.PYTHON_ROUTE = (ChargeMode._general, ChargeMode._charged)  # what the compiled quick routes stand for
routes.PLAIN, routes.SUBCLASS_KIND = _PLAIN, _subclass_kind  # how they tell a type's kind


def _without_dynamo_guard() -> None:
    """Drop torch's dynamo-disable wrapper around `ChargeMode.__torch_dispatch__` where nothing compiles.

    torch wraps a dispatch mode's `__torch_dispatch__` so that torch.compile never compiles its frame: two Python
    wrappers and three eval-frame switches per call, and an op of the simulated GPU calls it twice. A rank with
    the simulated GPU runs torch.compile eagerly (`TORCH_COMPILE_DISABLE`, simcuda/device.py), so the guard
    guards nothing there; elsewhere it stays.
    """
    method = ChargeMode.__dict__["__torch_dispatch__"]
    if os.environ.get("TORCH_COMPILE_DISABLE") == "1" and hasattr(method, "__wrapped__"):
        ChargeMode.__torch_dispatch__ = inspect.unwrap(method)  # type: ignore[method-assign]
