"""Build (once, cached) and load the simulated CUDA device guard and hooks (`guard.cc`).

The shared library is compiled by simcuda/native.py against the installed torch, into the per-user cache
(``$PHANTORA_CACHE`` or ``$XDG_CACHE_HOME/phantora``, default ``~/.cache/phantora``), once.

It must be loaded before torch is imported: torch looks its CUDA hooks up once, at import. So this
module does not import torch, and `preload()` runs first in the rank bootstrap and the fork server.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from phantora import resources
from phantora.errors import PhantoraError
from phantora.runtime.simcuda import native
from phantora.runtime.simcuda.native import NativeBuildError

SOURCE = Path(__file__).with_name("guard.cc")
_LIB: ctypes.CDLL | None = None


GuardBuildError = NativeBuildError  # the device guard could not be compiled


def cache_dir() -> Path:
    """Where built artefacts are kept (phantora.resources.cache_dir)."""
    return resources.cache_dir()


def library_path() -> Path:
    """The cached library for this source, torch version and compiler (built if missing)."""
    return native.library(SOURCE, "simcuda-guard", "its device guard")


def preload() -> None:
    """Load the library if this process simulates CUDA (``PHANTORA_SIM_CUDA=1``); before torch is imported."""
    if os.environ.get("PHANTORA_SIM_CUDA") == "1":
        load()


def load(device_count: int | None = None) -> None:
    """Register the CUDA device guard and hooks in this process (idempotent); set the device count."""
    global _LIB
    if _LIB is None:
        if "torch" in sys.modules:
            raise PhantoraError(
                "the simulated CUDA device must be loaded before torch is imported "
                "(phantora.runtime.simcuda.guard.preload() first)"
            )
        _LIB = ctypes.CDLL(str(library_path()), mode=ctypes.RTLD_GLOBAL)
    if device_count is not None:
        _LIB.phantora_simcuda_set_device_count(ctypes.c_int(device_count))


def set_current_device(index: int) -> None:
    """Make `index` the calling thread's current device in torch's C++ device guard too (`.cuda()`,
    `.to("cuda")` and the autograd engine read it there)."""
    if _LIB is not None:
        _LIB.phantora_simcuda_set_current_device(ctypes.c_int(index))


def set_python_dispatch(tensor: object) -> None:
    """Give `tensor`'s implementation torch's Python dispatch key, which a tensor subclass made with
    `_make_wrapper_subclass` has and one that became such a subclass in place (`t.data = ...`) lacks."""
    if _LIB is None:
        raise PhantoraError("the simulated CUDA device is not loaded")
    _LIB.phantora_simcuda_set_python_dispatch(ctypes.c_void_p(tensor._cdata))  # type: ignore[attr-defined]


def clear_python_dispatch(tensor: object) -> None:
    """Take torch's Python dispatch key off `tensor`'s implementation: a simulated-GPU tensor that became a host
    tensor in place (`t.data = host_tensor`)."""
    if _LIB is None:
        raise PhantoraError("the simulated CUDA device is not loaded")
    _LIB.phantora_simcuda_clear_python_dispatch(ctypes.c_void_p(tensor._cdata))  # type: ignore[attr-defined]
