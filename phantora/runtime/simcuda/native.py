"""Build (once, cached) a C++ source of the simulated CUDA device against the installed torch.

The shared library is compiled with the system C++ compiler against torch's headers and libraries (and, for a
source that reads Python objects, Python's headers), into the per-user cache (phantora.resources.cache_dir), under a
name keyed by the source, the torch version and the compiler (and, with Python's headers, the interpreter's ABI).
A file lock makes concurrent first uses (many ranks) build it once (phantora.cached_build). This module does not
import torch: the device guard is built and loaded before torch is.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

from phantora import resources
from phantora.cached_build import build_once
from phantora.errors import PhantoraError


class NativeBuildError(PhantoraError):
    """A C++ source of the simulated CUDA device could not be compiled."""


def compiler(what: str) -> str:
    """The C++ compiler ($CXX, else g++, c++ or clang++); `what` names the library in the error without one."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")
    if not cxx:
        raise NativeBuildError(
            f"the simulated CUDA device needs a C++ compiler (g++) to build {what} once; "
            "install one (apt-get install g++), or run with --no-sim-cuda"
        )
    return cxx


def torch_dir_and_version() -> tuple[Path, str]:
    """Where torch is installed and its version, without importing it."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise NativeBuildError("torch is not installed")
    return Path(list(spec.submodule_search_locations)[0]), importlib.metadata.version("torch")


def build_key(source: bytes, torch_version: str, cxx: str, python: bool) -> str:
    """The cached library's key: the source, torch's version and the compiler; with Python's headers also the
    interpreter's ABI (SOABI: one torch version serves several Pythons, whose object layouts differ)."""
    salt = b"python" + str(sysconfig.get_config_var("SOABI")).encode() if python else b""  # guard: key unchanged
    salt += b"+torch_python" if python else b""  # linked against torch's Python bindings too
    return hashlib.sha256(source + torch_version.encode() + cxx.encode() + salt).hexdigest()[:16]


def library(source: Path, stem: str, what: str, *, python: bool = False) -> Path:
    """The cached library `stem-<key>.so` built from `source` (built now if missing); `python`: with Python's
    headers and the C++ standard torch's Python headers need. `what` names it in messages."""
    torch_dir, version = torch_dir_and_version()
    cxx = compiler(what)
    out = resources.cache_dir() / f"{stem}-{build_key(source.read_bytes(), version, cxx, python)}.so"

    def command(tmp: Path) -> list[str]:
        cmd = [cxx, "-O2" if python else "-O1", "-std=c++20" if python else "-std=c++17", "-shared", "-fPIC"]
        cmd += [f"-I{torch_dir / 'include'}"]
        if python:
            cmd += [f"-I{torch_dir / 'include' / 'torch' / 'csrc' / 'api' / 'include'}"]
            cmd += [f"-I{sysconfig.get_paths()['include']}", "-w"]
        cmd += [str(source), f"-L{torch_dir / 'lib'}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{torch_dir / 'lib'}"]
        if python:  # torch's Python bindings' own functions (THPVariable_Wrap), loaded by `import torch` already
            cmd += ["-ltorch_python"]
        return [*cmd, "-o", str(tmp)]

    def failed(cmd: list[str], run: subprocess.CompletedProcess[str]) -> NativeBuildError:
        return NativeBuildError(f"building {what} failed ({' '.join(cmd)}):\n{run.stderr}")

    return build_once(out, ".simcuda.lock", command, failed)
