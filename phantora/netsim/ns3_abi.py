"""The interface version of the ns-3 models, checked before Python or the runner drives them.

The compiled models (libphantora-ns3.so, or a user's own as `$PHANTORA_NS3_LIB`) and the runner beside them
report the version they were built with (`PhantoraInterfaceVersion()`, `phantora-ns3-runner --interface-version`;
ns3-scratch/model/phantora-interface-version.h). A library of another version would misread what Python hands it
(AddFlows' 9 words a flow read as 8 by an older one), so either is refused in one line naming the fix.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

from phantora.errors import PhantoraError
from phantora.netsim import ns3_build

# Equal to kPhantoraInterfaceVersion in ns3-scratch/model/phantora-interface-version.h: bump both with every change
# to PhantoraNetwork's calls, its record structs or a packed layout (docs/packet-model.md, "Interface version").
INTERFACE_VERSION = 1
SYMBOL = "PhantoraInterfaceVersion"  # C linkage: found by name in a library of any version
LIB_ENV = "PHANTORA_NS3_LIB"
QUERY_TIMEOUT_S = 120.0  # a question to the runner (its interface version, its CCs): it answers in milliseconds
_RUNNERS: dict[tuple[Path, int], int] = {}  # a runner checked in this process: (path, mtime_ns) -> its version


def library_version(lib: Path) -> int | None:
    """The interface version `lib` was built with; None if it has no `PhantoraInterfaceVersion()`."""
    # global, as cppyy loads it: its later load finds it loaded and leaves it so, and cling must see its symbols
    handle = ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    try:
        fn = getattr(handle, SYMBOL)
    except AttributeError:
        return None
    fn.argtypes = []
    fn.restype = ctypes.c_uint32
    return int(fn())


def _fix() -> str:
    """How to get a library and runner of this interface."""
    if os.environ.get(LIB_ENV):
        return f"rebuild your {LIB_ENV} from this phantora's ns3-scratch/ (scripts/build_ns3.sh), or unset {LIB_ENV}"
    if ns3_build.BUILD_SCRIPT is not None:
        return f"run {ns3_build.BUILD_SCRIPT}"
    return f"delete {ns3_build.build_dir()} and run `phantora doctor` to rebuild it"


def _named(lib: Path) -> str:
    """The library as the user named it."""
    return f"{LIB_ENV}={lib}" if os.environ.get(LIB_ENV) else str(lib)


def check_library(lib: Path) -> int:
    """The version of `lib` (loaded here if not yet); a one-line PhantoraError unless it is INTERFACE_VERSION."""
    try:
        found = library_version(lib)
    except OSError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PhantoraError(f"cannot load the ns-3 fabric library {_named(lib)}: {first}: {_fix()}") from None
    if found != INTERFACE_VERSION:
        has = f"interface version {found}" if found is not None else f"no interface version (no {SYMBOL}())"
        raise PhantoraError(
            f"the ns-3 fabric library {_named(lib)} has {has}, this phantora needs version {INTERFACE_VERSION}: "
            + _fix()
        )
    return found


def check_runner(runner: Path) -> int:
    """The version `runner --interface-version` prints (it checks its own library first), once a process per
    build; a one-line PhantoraError unless it is INTERFACE_VERSION (a runner older than the check prints none)."""
    try:
        key = (runner, runner.stat().st_mtime_ns)
    except OSError:
        raise PhantoraError(f"the ns-3 runner {runner} is missing: {_fix()}") from None
    if key in _RUNNERS:
        return _RUNNERS[key]
    try:
        proc = subprocess.run(
            [str(runner), "--interface-version"], capture_output=True, text=True, check=False, timeout=QUERY_TIMEOUT_S
        )
    except OSError as exc:
        raise PhantoraError(f"cannot start the ns-3 runner {runner}: {exc.strerror}: {_fix()}") from None
    except subprocess.TimeoutExpired:
        raise PhantoraError(
            f"the ns-3 runner {runner} did not answer --interface-version within {QUERY_TIMEOUT_S:.0f} s"
        ) from None
    text = proc.stdout.strip()
    found = int(text) if proc.returncode == 0 and text.isdigit() else None
    if found is None:
        errors = [line.strip() for line in proc.stderr.splitlines() if "error" in line.lower()]
        if errors:  # its own check refused its library, or the loader refused it
            raise PhantoraError(f"the ns-3 runner {runner} failed its interface check ({errors[0]}): {_fix()}")
        has = "no interface version (it predates --interface-version)"
    else:
        has = f"interface version {found}"
    if found != INTERFACE_VERSION:
        raise PhantoraError(
            f"the ns-3 runner {runner} has {has}, this phantora needs version {INTERFACE_VERSION}: {_fix()}"
        )
    _RUNNERS[key] = found
    return found
