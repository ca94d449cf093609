"""One line for a call the simulated device cannot run, in place of torch's dispatcher error.

torch's dispatcher answers an op with no kernel for a backend with a NotImplementedError of some hundred
lines ("Could not run 'aten::empty_strided' with arguments from the 'CUDA' backend ... is only available
for these backends: [...]"), or "aten::bincount: attempted to run this operator with Meta tensors, but there
was no fake impl or Meta kernel registered" and a page on torch.compile. Under phantora that means the call
went where the simulated device is not: torch's own CUDA backend (which a CPU build has no kernels for) or,
in phantom mode, an op with no meta kernel. `explain` names the program's call, the op, and what to do.
"""

from __future__ import annotations

import os
import re
import traceback

import torch

import bridge.client
import phantora.errors

_DISPATCH = re.compile(r"Could not run '([\w:.]+)' with arguments from the '(\w+)' backend")
_NO_META = re.compile(r"([\w:.]+): attempted to run this operator with Meta tensors, but there was no fake impl")
_NOT_USER = tuple(  # torch's, phantora's and the bridge's own frames
    os.path.dirname(m.__file__ or "") + "/" for m in (torch, phantora.errors, bridge.client)
)


def _call(exc: BaseException) -> str:
    """The source line of the innermost frame of the program (not torch, not phantora), quoted, or ''."""
    return _quoted(traceback.extract_tb(exc.__traceback__))


def program_call() -> str:
    """The source line of the program that is calling now (its innermost frame on the stack), quoted, or ''."""
    return _quoted(traceback.extract_stack())


def _quoted(frames: traceback.StackSummary) -> str:
    line = ""
    for frame in frames:
        if frame.filename.startswith("<") or frame.filename.startswith(_NOT_USER):
            continue
        line = (frame.line or "").strip()
    return f"`{line}`" if line else ""


_META_VALUE = re.compile(r"(\S+\(\)) cannot be called on meta tensors")


_CHILD_CUDA = re.compile(r"(module 'torch\._C' has no attribute '_cuda\w*'|Torch not compiled with CUDA enabled)")


def _spawned_cuda(exc: BaseException) -> str | None:
    """The line for a process the program started itself (torch.multiprocessing.spawn, as a GPU script starts one
    per GPU) that used CUDA in a run without --spawn: it runs outside phantora, on this CPU build's torch."""
    from torch.multiprocessing.spawn import ProcessRaisedException

    found = _CHILD_CUDA.search(str(exc)) if isinstance(exc, ProcessRaisedException) else None
    if found is None:
        return None
    call = _call(exc) or "torch.multiprocessing.spawn"
    return (
        f"NotSimulatedError: {call} started processes of its own (torch.multiprocessing.spawn), which run outside "
        f"phantora, and one of them used CUDA (torch: {found.group(1)}): run the program with `phantora run --spawn "
        "--nproc N script.py` (phantora runs it once, on a host of N GPUs, and each process it starts is a rank)"
    )


_ONE_THREAD = (
    "phantora simulates a rank's GPU on the thread that runs its program and on the threads it starts with "
    "`threading` (torch's dispatch modes are per thread), so GPU work on another thread (an RPC's request thread, "
    "one started elsewhere) is not simulated"
)
_THREAD_FILES = ("/threading.py", "/concurrent/futures/thread.py")
_REMOTE = re.compile(r"On WorkerInfo\(id=(\d+), name=([^)]*)\):")
_FRAME = re.compile(r'^  File "([^"]+)", line (\d+), in (\S+)\n    (.+)$', re.MULTILINE)


def _remote_cuda(exc: BaseException) -> str | None:
    """The line for GPU work in a function run over torch.distributed.rpc: RPC runs it on its own request thread,
    where the rank's dispatch mode is not (torch's modes are per thread), so its CUDA ops reached torch's own CUDA
    backend there; RPC hands the caller a RuntimeError of the remote error's text and traceback."""
    text = str(exc) if isinstance(exc, RuntimeError) else ""
    worker, found = _REMOTE.search(text), _DISPATCH.search(text)
    if worker is None or found is None or found.group(2) != "CUDA":
        return None
    user = [f for f in _FRAME.finditer(text) if not f.group(1).startswith(_NOT_USER)]
    where = (
        f" (`{user[-1].group(4).strip()}`, {user[-1].group(1)}:{user[-1].group(2)} in {user[-1].group(3)})"
        if user
        else ""
    )
    call = _call(exc) or "a call"
    return (
        f"NotSimulatedError: {call} ran a function over torch.distributed.rpc on worker {worker.group(2)} (id "
        f"{worker.group(1)}), whose GPU work{where} ran on RPC's request thread and reached {found.group(1)} on "
        f"torch's own CUDA backend: {_ONE_THREAD}; do the GPU work on the rank's own thread, or keep the remote "
        "function's tensors on the host"
    )


_HF_LOADER = "/transformers/core_model_loading.py"


def _hf_loader(exc: BaseException) -> str:
    """The switch to name when the thread was transformers' weight loader's (its `from_pretrained` onto a GPU), or
    ''; phantora sets it (library_env.py) unless the environment sets it otherwise, as this run's did."""
    if not any(f.filename.endswith(_HF_LOADER) for f in traceback.extract_tb(exc.__traceback__)):
        return ""
    value = os.environ.get("HF_DEACTIVATE_ASYNC_LOAD")
    return (
        " (this was transformers' weight loader's thread pool, which HF_DEACTIVATE_ASYNC_LOAD=1 turns off; phantora "
        f"sets it unless the environment sets it, and this run's set it to {value!r})"
    )


def _from_a_thread(exc: BaseException) -> bool:
    """Was `exc` raised on a thread the program started (a `threading.Thread`'s or an executor's frames in its
    traceback; `Future.result()` raises the worker's exception with them)?"""
    return any(f.filename.endswith(_THREAD_FILES) for f in traceback.extract_tb(exc.__traceback__))


def explain(exc: BaseException) -> str | None:
    """'NotSimulatedError: ...' naming the call and what to do, if `exc` is torch's missing-kernel error;
    'PhantomValueError: ...' if it is torch's refusal to read a value of a meta tensor (a phantom tensor's value
    asked for where phantora's own check does not see it, such as DTensor's RNG tracker comparing states); the
    first for GPU work a function run over RPC did on RPC's own thread, too."""
    meta_value = _META_VALUE.search(str(exc)) if isinstance(exc, RuntimeError) else None
    if meta_value is not None:
        call = _call(exc) or "a call"
        return (
            f"PhantomValueError: {call} asked for the value of a phantom tensor (torch: {meta_value.group(1)} "
            "cannot be called on meta tensors); tensors have no values in phantom mode: run without --phantom "
            "(real mode), or guard the data-dependent code with `phantora.runtime.phantom()`"
        )
    spawned = _spawned_cuda(exc)
    if spawned is not None:
        return spawned
    remote = _remote_cuda(exc)
    if remote is not None:
        return remote
    if not isinstance(exc, NotImplementedError):
        return None
    text = str(exc)
    found, no_meta = _DISPATCH.search(text), _NO_META.search(text)
    if found is not None:
        op, backend = found.groups()
    elif no_meta is not None:
        op, backend = no_meta.group(1), "Meta"
    else:
        return None
    call = _call(exc) or "a call"
    if backend == "CUDA" and _from_a_thread(exc):
        what = (
            f"{call} ran GPU work on a thread other than the program's, where {op} reached torch's own CUDA backend: "
            f"{_ONE_THREAD}; do the GPU work on the rank's own thread{_hf_loader(exc)}"
        )
    elif backend == "CUDA":
        what = (
            f"{call} reached {op} on torch's own CUDA backend, past phantora's simulated GPU (which runs an op of a "
            "cuda tensor on the tensor's data); name the device as 'cuda', 'cuda:N' or torch.device('cuda', N) in "
            "that call, or run with --no-sim-cuda on CPU tensors"
        )
    elif backend == "Meta":
        what = (
            f"{call} needs {op}, which has no meta kernel, so phantom mode cannot run it (phantom tensors hold no "
            "data): run without --phantom (real mode), or keep the op out of the simulated part of the program"
        )
    else:
        what = (
            f"{call} needs {op}, which torch has no '{backend}' kernel for in this (CPU) build under phantora's "
            "simulated GPU: keep the op off that device, or run with --no-sim-cuda"
        )
    return f"NotSimulatedError: {what}"
