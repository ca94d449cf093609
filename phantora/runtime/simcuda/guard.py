"""Build (once, cached) and load the simulated CUDA device guard and hooks (`guard.cc`).

The shared library is compiled with the system C++ compiler against the installed torch's headers
and libraries, into a per-user cache keyed by the source, the torch version and the compiler:
``$PHANTORA_CACHE`` or ``$XDG_CACHE_HOME/phantora`` (default ``~/.cache/phantora``). A file lock
makes concurrent first uses (many ranks) build it once.

It must be loaded before torch is imported: torch looks its CUDA hooks up once, at import. So this
module does not import torch, and `preload()` runs first in the rank bootstrap and the fork server.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from phantora import resources
from phantora.errors import PhantoraError

SOURCE = Path(__file__).with_name("guard.cc")
_LIB: ctypes.CDLL | None = None


class GuardBuildError(PhantoraError):
    """The simulated CUDA device guard could not be compiled."""


def cache_dir() -> Path:
    """Where built artefacts are kept (phantora.resources.cache_dir)."""
    return resources.cache_dir()


def _compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise GuardBuildError(
            "the simulated CUDA device needs a C++ compiler (g++) to build its device guard once; "
            "install one (apt-get install g++), or run with --no-sim-cuda"
        )
    return cxx


def _torch_dir_and_version() -> tuple[Path, str]:
    """Where torch is installed and its version, without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise GuardBuildError("torch is not installed")
    return Path(list(spec.submodule_search_locations)[0]), importlib.metadata.version("torch")


def library_path() -> Path:
    """The cached library for this source, torch version and compiler (built if missing)."""
    torch_dir, version = _torch_dir_and_version()
    cxx = _compiler()
    key = hashlib.sha256(SOURCE.read_bytes() + version.encode() + cxx.encode()).hexdigest()[:16]
    out = cache_dir() / f"simcuda-guard-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".simcuda.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return out
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cmd = [
            cxx,
            "-O1",
            "-std=c++17",
            "-shared",
            "-fPIC",
            f"-I{torch_dir / 'include'}",
            str(SOURCE),
            f"-L{torch_dir / 'lib'}",
            "-lc10",
            "-ltorch_cpu",
            f"-Wl,-rpath,{torch_dir / 'lib'}",
            "-o",
            str(tmp),
        ]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise GuardBuildError(f"building the simulated CUDA device guard failed ({' '.join(cmd)}):\n{run.stderr}")
        tmp.rename(out)
    return out


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
