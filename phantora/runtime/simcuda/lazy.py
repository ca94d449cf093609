"""CUDA's lazy initialisation, as torch.cuda has it.

A real process starts with CUDA uninitialised: `torch.cuda.is_initialized()` is False and
`torch.cuda._initialized` too, until the first call that needs the device (a cuda tensor, `set_device`,
`current_device`, `synchronize`, a stream, device properties, the RNG state, `init()`). Calls made
before that through `torch.cuda._lazy_call` (the CUDA seeds of `torch.manual_seed`) are queued and run
then. Programs read the flag: DeviceMesh sets the current device from ``LOCAL_RANK`` only while it is
False, which is how pytorch/examples' FSDP2 example puts each rank on its own GPU.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import torch

_queued: list[Callable[[], Any]] = []
_tls = threading.local()  # `initializing` while the queued calls run (they may re-enter init)
F = TypeVar("F", bound=Callable[..., Any])


def reset() -> None:
    """Start uninitialised, as a fresh process does; drop torch's own queued checks (they probe real GPUs)."""
    torch.cuda._initialized = False
    _queued.clear()
    queued = getattr(torch.cuda, "_queued_calls", None)
    if isinstance(queued, list):
        queued.clear()


def is_initialized() -> bool:
    """`torch.cuda.is_initialized()`."""
    return bool(torch.cuda._initialized)


def lazy_init() -> None:
    """`torch.cuda._lazy_init()` / `init()`: initialise once, then run the calls queued before."""
    if torch.cuda._initialized or getattr(_tls, "initializing", False):
        return
    _tls.initializing = True
    try:
        while _queued:
            _queued.pop(0)()
    finally:
        _tls.initializing = False
    torch.cuda._initialized = True


def lazy_call(fn: Callable[[], Any], **kwargs: Any) -> None:
    """`torch.cuda._lazy_call`: run `fn` now if CUDA is initialised, else when it is."""
    if is_initialized():
        fn()
    else:
        _queued.append(fn)


def initialising(fn: F) -> F:
    """`fn`, initialising CUDA first (as the torch.cuda function of the same name does)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.cuda._initialized:
            lazy_init()
        return fn(*args, **kwargs)

    return run  # type: ignore[return-value]
