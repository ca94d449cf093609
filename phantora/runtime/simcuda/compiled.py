"""The compiled per-op fast path (`_fastop.c`), configured against the Python it transcribes, or None.

setup.py builds `_fastop` (an optional extension: scripts/setup.sh builds it in place). Without it, or with a build
older than `_fastop.c` beside it (the source edited or checked out since: the build would run the old code), the
Python functions run (fastpath.device_op, ChargeMode.__torch_dispatch__), the results the same, slower; one warning
line says so, once per process.

The compiled path reads its tensors' metadata (is_meta, requires_grad, layout, storage offset, strides, the storage's
size and identity) from the C++ tensors through `tensorinfo.cc`, built against the installed torch once and cached
(simcuda/native.py, as the device guard), and makes a contiguous output's wrapper there too; where that does not
build or load, it reads them through torch's Python bindings and calls `_make_wrapper_subclass`, the results the same,
slower, with one warning line; it is told by a C++ hook there when a storage it counted dies (no Python object of the
storage and no weak reference on it per new output: memory.MemoryTracker's entries say which way each is counted).
It runs each op through the dispatcher from C++ (`opcall.cc`, built and cached the same
way: the operator's handle found once per OpOverload; a call of plain tensors in one of three common schema forms is
made typed, without the boxed call's argument stack) where torch's Python binding of the operator would do nothing
else; otherwise, or without that library (one warning line), it calls the OpOverload's `_op`.
"""

from __future__ import annotations

import ctypes
import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

_module: ModuleType | None = None
_tried = False
SOURCE = Path(__file__).with_name("_fastop.c")
INFO_SOURCE = Path(__file__).with_name("tensorinfo.cc")
_info_lib: ctypes.CDLL | None = None  # kept loaded: the compiled path holds a pointer into it
CALL_SOURCE = Path(__file__).with_name("opcall.cc")
_call_lib: ctypes.PyDLL | None = None  # likewise


def load(fastpath: ModuleType | None = None) -> ModuleType | None:
    """`_fastop`, configured against `fastpath` (the module whose Python it transcribes, which calls this as it
    loads), or None (with one warning line) if it was not built, is older than its source or does not load.
    Called without it, the answer fastpath's import gave."""
    global _module, _tried
    if fastpath is None and not _tried:
        fastpath = importlib.import_module(f"{__package__}.fastpath")  # a first import loads this with itself
    if _tried:
        return _module
    assert fastpath is not None
    _tried = True
    try:
        from phantora.runtime.simcuda import _fastop  # type: ignore[attr-defined]
    except ImportError as e:
        print(
            f"phantora: warning: the compiled per-op fast path is missing ({e}); ops run through the Python one "
            "(slower): run scripts/setup.sh to build it",
            file=sys.stderr,
        )
        return None
    if stale(SOURCE, Path(_fastop.__file__ or "")):
        print(
            f"phantora: warning: the compiled per-op fast path ({Path(_fastop.__file__ or '').name}) is older than "
            f"{SOURCE.name}; ops run through the Python one (slower): run scripts/setup.sh to rebuild it",
            file=sys.stderr,
        )
        return None
    _fastop.configure(**_objects(fastpath))
    set_native(_fastop)
    _module = _fastop
    return _module


def set_native(fast: Any) -> None:
    """Give `fast` (`_fastop`) tensorinfo.cc's reader, wrapper maker and storage hook, or 0 for all where the library
    is unavailable (one warning line, from `tensor_info_address`), and opcall.cc's op caller (not tried without the
    first: it needs the same compiler and headers), or 0 (one warning line, from `op_call_address`)."""
    info = tensor_info_address()
    fast.set_tensor_info(info)
    fast.set_wrapper(wrapper_address() if info else 0)
    fast.set_storage_hook(storage_hook_address() if info else 0)
    fast.set_op_call(op_call_address() if info else 0)


def tensor_info_address() -> int:
    """The address of `tensorinfo.cc`'s `phantora_tensor_info` (built once and cached, then loaded), or 0 with one
    warning line if it cannot be built or loaded."""
    global _info_lib
    if _info_lib is None:
        _info_lib = _load(
            INFO_SOURCE,
            "simcuda-tensorinfo",
            "tensor reader",
            ctypes.CDLL,
            "reads tensors through torch's Python bindings",
        )
    if _info_lib is None:
        return 0
    return ctypes.cast(_info_lib.phantora_tensor_info, ctypes.c_void_p).value or 0


def wrapper_address() -> int:
    """The address of `tensorinfo.cc`'s `phantora_wrap_contiguous` (an output's wrapper made without parsing
    `_make_wrapper_subclass`'s arguments), or 0 where the library is unavailable (`tensor_info_address` warned)."""
    if not tensor_info_address():
        return 0
    assert _info_lib is not None
    return ctypes.cast(_info_lib.phantora_wrap_contiguous, ctypes.c_void_p).value or 0


def storage_hook_address() -> int:
    """The address of `tensorinfo.cc`'s `phantora_hook_storage` (the tracker told of a counted storage's death in
    C++), or 0 where the library is unavailable (`tensor_info_address` warned)."""
    if not tensor_info_address():
        return 0
    assert _info_lib is not None
    return ctypes.cast(_info_lib.phantora_hook_storage, ctypes.c_void_p).value or 0


def unhook(tensors: list[Any]) -> None:
    """Give the storages of `tensors` (plain tensors) their own DataPtr back if `tensorinfo.cc` hooked them (they are
    counted by weak references from then on): before an op that reads the DataPtr's deleter (`torch._lazy_clone`)."""
    if _info_lib is None:
        return
    address = ctypes.cast(_info_lib.phantora_unhook_storage, ctypes.c_void_p).value or 0
    fn = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object)(address)  # the GIL held: the hook's callbacks run Python
    for t in tensors:
        fn(t)


def op_call_address() -> int:
    """The address of `opcall.cc`'s `phantora_call_op` (an op run through the dispatcher from C++, not through its
    Python binding; built once and cached, then loaded), or 0 with one warning line if it cannot be built or loaded."""
    global _call_lib
    if _call_lib is None:
        _call_lib = _load(
            CALL_SOURCE, "simcuda-opcall", "op caller", ctypes.PyDLL, "runs ops through torch's Python binding"
        )
    if _call_lib is None:
        return 0
    return ctypes.cast(_call_lib.phantora_call_op, ctypes.c_void_p).value or 0


def _load(source: Path, stem: str, role: str, loader: type[ctypes.CDLL], fallback: str) -> Any:
    """One of the per-op path's native libraries, built once into the cache and loaded by `loader`, or None with
    one warning line naming it and what runs instead (`fallback`)."""
    from phantora.runtime.simcuda import native

    try:
        return loader(str(native.library(source, stem, f"its {role}", python=True)))
    except (native.NativeBuildError, OSError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(
            f"phantora: warning: the compiled per-op path's {role} ({source.name}) is unavailable ({first}); "
            f"it {fallback} (slower)",
            file=sys.stderr,
        )
        return None


def _call_count(symbol: str, func: Any) -> int:
    """One of `opcall.cc`'s per-OpOverload counters for `func` (0 without the library)."""
    if _call_lib is None:
        return 0
    fn = getattr(_call_lib, symbol)
    fn.argtypes, fn.restype = [ctypes.py_object], ctypes.c_long
    return int(fn(func))


def op_calls(func: Any) -> int:
    """How many calls of `func` (an OpOverload) `opcall.cc` ran (0 without the library): which ops take it."""
    return _call_count("phantora_op_calls", func)


def typed_calls(func: Any) -> int:
    """How many of `op_calls(func)` `opcall.cc` called typed (its schema one of the typed forms: not boxed)."""
    return _call_count("phantora_typed_calls", func)


def stale(source: Path, built: Path) -> bool:
    """Whether `source` (present: a checkout, not a wheel without it) changed after `built` was made."""
    return source.is_file() and built.is_file() and source.stat().st_mtime > built.stat().st_mtime


def _objects(fastpath: ModuleType) -> dict[str, Any]:
    """What `_fastop.configure` takes: the objects and functions the C code reads, calls or hands work back to."""
    import torch

    from phantora.runtime import compute, memory, precision, session, trace
    from phantora.runtime.caching_allocator import SMALL_SIZE
    from phantora.runtime.simcuda import device, kept_values, routes, tensor

    return {
        "simcuda": tensor.SimCudaTensor,
        "tensor": torch.Tensor,
        "param": torch.nn.Parameter,
        "slow": fastpath.SLOW,
        "plans": fastpath._PLANS,
        "plan": fastpath._plan,
        "layout_ops": fastpath._LAYOUT_OPS,
        "layout_grid": compute.VECTOR_BYTES,
        "phantom_special": fastpath._PHANTOM_SPECIAL,
        "to_copy_id": fastpath._TO_COPY,
        "casts_to_index": kept_values.casts_to_index,
        "sig": compute._sig,
        "precision": vars(precision),
        "matmul_precision": precision.matmul_precision,
        "tail": fastpath._tail,
        "wrap_output": tensor.wrap_output,
        "make_wrapper": torch.Tensor._make_wrapper_subclass,
        "cuda": tensor._CUDA,
        "contiguous": tensor._CONTIGUOUS,
        "contiguous_fn": tensor._contiguous_strides,
        "strided": torch.strided,
        "entry": memory._Entry,
        "hooked": memory._HookedEntry,
        "tracker": memory.MemoryTracker,
        "session": session.RankSession,
        "device": vars(device),
        "tensor_module": vars(tensor),
        "plain_tail": fastpath._plain_tail,
        "fastpath": vars(fastpath),
        "get_mode": torch._C._get_dispatch_mode,
        "fake_key": torch._C._TorchDispatchModeKey.FAKE,
        "temp": memory.TEMP,
        "small_size": SMALL_SIZE,
        "trace_op": trace.TraceRecorder.op,
        "report_check_ops": session.REPORT_CHECK_OPS,
        "routes": vars(routes),
    }


def mode_dispatch(mode: Any, python: Any) -> Any:
    """`mode.__torch_dispatch__` in C (bound to `mode`: torch checks `__self__`), handing every op it does not take
    to `python(mode, func, types, args, kwargs)` and, after its checks, to `mode._general`; None without `_fastop`."""
    fast = load()
    return None if fast is None else fast.bind(mode, python)
