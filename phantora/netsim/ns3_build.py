"""Building the ns-3 models (ns3-scratch/) into libphantora-ns3.so and the runner, and a user's own CCs.

In a checkout the models build in place (scripts/build_ns3.sh, incremental); an installed package builds them
into `<cache>/ns3-<hash>` (docs/architecture.md, "Shipped data and the ns-3 build"). `PHANTORA_CC_DIR` names a
folder of the user's own congestion controls (one `.cc` file each, docs/tutorial-cc.md): `cc_library()`
compiles every `*.cc` there into one library beside ours, named by a hash of those files and of our sources,
so any change to either builds a new one.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from phantora import resources
from phantora.cached_build import build_once, output_tail
from phantora.errors import InputError, PhantoraError

CC_DIR_ENV = "PHANTORA_CC_DIR"

# The model sources: ns3-scratch/ of the checkout, or its copy in an installed package (phantora.resources).
SCRATCH = resources.ns3_source_dir()
CHECKOUT = resources.checkout_root()
BUILD_SCRIPT = CHECKOUT / "scripts" / "build_ns3.sh" if CHECKOUT else None
LIBRARY_NAME = "libphantora-ns3.so"  # the library's file name, which the runner loads from its own folder
_TARGETS = (LIBRARY_NAME, "phantora-ns3-runner")  # what an installed package builds (no C++ tests)
_BUILT = ".built"  # written into a cache build directory once make succeeded


def ns3_wheel() -> tuple[Path, str]:
    """The ns3 wheel's directory (with include/ and lib64/) and its library version (e.g. '3.44'), not imported."""
    spec = importlib.util.find_spec("ns3")
    if spec is None or not spec.submodule_search_locations:
        raise PhantoraError("the ns3 wheel is not installed (pip install ns3==3.44.post0)")
    ns3_dir = Path(list(spec.submodule_search_locations)[0])
    libs = sorted((ns3_dir / "lib64").glob("libns3.*-core.so")) if (ns3_dir / "include" / "ns3").is_dir() else []
    if not libs:
        raise PhantoraError(f"the ns3 wheel at {ns3_dir} has no include/ns3 or lib64/libns3.*-core.so")
    return ns3_dir, libs[0].name.removeprefix("libns3.").removesuffix("-core.so")


def _source_files() -> list[Path]:
    """The model sources, in a stable order (the build directory and editor files left out)."""
    files = [SCRATCH / "Makefile"]
    for part in ("model", "runner", "test"):
        files += sorted(p for p in (SCRATCH / part).glob("*") if p.is_file() and p.suffix in (".cc", ".h"))
    return files


@functools.cache
def _build_key() -> str:
    """Hash of the model sources, the ns3 wheel's version and the compiler: the cache build directory's name."""
    h = hashlib.sha256()
    for path in _source_files():
        h.update(str(path.relative_to(SCRATCH)).encode() + b"\0" + path.read_bytes() + b"\0")
    try:
        ns3 = importlib.metadata.version("ns3") + "/" + ns3_wheel()[1]
    except (importlib.metadata.PackageNotFoundError, PhantoraError):
        ns3 = "none"
    h.update(ns3.encode() + b"\0" + (os.environ.get("CXX") or "g++").encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    """Where the models are built: ns3-scratch/build in a checkout, else <cache>/ns3-<hash of sources and ns-3>."""
    if CHECKOUT is not None:
        return SCRATCH / "build"
    return resources.cache_dir() / f"ns3-{_build_key()}"


def library_path() -> Path:
    """The fabric library: $PHANTORA_NS3_LIB, else libphantora-ns3.so in `build_dir()`."""
    env = os.environ.get("PHANTORA_NS3_LIB")
    return Path(env) if env else build_dir() / LIBRARY_NAME


def runner_path() -> Path:
    """The standalone runner binary (built next to the library)."""
    return library_path().parent / "phantora-ns3-runner"


def needs_build(tests: bool = False) -> bool:
    """True if the library or the runner (with `tests`, in a checkout, also the C++ tests) are missing or older
    than their sources.

    A cache build directory is named by a hash of the sources, so there it is enough that the build completed.
    """
    lib = library_path()
    if CHECKOUT is None:
        complete = bool(os.environ.get("PHANTORA_NS3_LIB")) or (lib.parent / _BUILT).exists()
        return not (complete and lib.exists() and runner_path().exists())

    def newest(*dirs: str) -> float:
        files = [p for d in dirs for p in SCRATCH.glob(f"{d}/*") if p.is_file()] + [SCRATCH / "Makefile"]
        return max(p.stat().st_mtime for p in files if p.exists())

    built = {lib: ("model",), runner_path(): ("runner",)}
    if tests:
        built[lib.parent / "phantora-ns3-tests"] = ("test",)
    if not all(p.exists() for p in built):
        return True
    model = newest("model")
    return any(max(model, newest(*dirs)) > binary.stat().st_mtime for binary, dirs in built.items())


def build(jobs: int = 2, tests: bool = False) -> Path:
    """Build the models and return the library path: scripts/build_ns3.sh in a checkout (incremental; the C++
    TestSuites too with `tests`), else make into the cache (`build_dir()`). Either holds a lock, so concurrent
    first uses build once."""
    if os.environ.get("PHANTORA_NS3_LIB"):
        return library_path()
    if BUILD_SCRIPT is not None:
        cmd = ["bash", str(BUILD_SCRIPT), "-j", str(jobs), "all" if tests else "models"]
        env = {"PHANTORA_PYTHON": sys.executable, **os.environ}  # the script finds the ns3 wheel with this Python
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if proc.returncode != 0:
            tail = output_tail(proc)
            raise PhantoraError(f"building the ns-3 fabric failed ({BUILD_SCRIPT}):\n{tail}")
        return library_path()
    return _build_cached(jobs)


def _to_stderr(text: str) -> None:
    print(f"[phantora] {text}", file=sys.stderr, flush=True)


def ensure_built(say: Callable[[str], None] = _to_stderr) -> None:
    """Bring the models (and the user's CC library) up to date here, saying so (a minute or two of silence
    otherwise), before a run starts the processes that load them: built inside a network server, a rebuild after
    the sources changed counts against the coordinator's wait for that server (180 s), which a loaded machine's
    full rebuild outlasts."""
    if os.environ.get("PHANTORA_NS3_LIB"):
        return
    if needs_build():
        say("building the ns-3 models: their sources are newer than the library (a minute or two)")
        build()
    cc = cc_library_path()
    if cc is not None and not cc.exists():
        say(f"building the congestion controls of {CC_DIR_ENV}")
        cc_library()


def _build_cached(jobs: int) -> Path:
    """make the library and the runner out of tree, into the cache directory, under a file lock."""
    out = build_dir()
    ns3_dir, ns3_ver = ns3_wheel()
    if not shutil.which("make"):
        raise PhantoraError("building the ns-3 models needs make and a C++ compiler (apt-get install make g++)")
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not needs_build():
            return library_path()
        cmd = ["make", "-C", str(SCRATCH), f"-j{jobs}", f"NS3_DIR={ns3_dir}", f"NS3_VER={ns3_ver}", f"BUILD={out}"]
        proc = subprocess.run([*cmd, *(str(out / t) for t in _TARGETS)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            tail = output_tail(proc)
            raise PhantoraError(f"building the ns-3 fabric into {out} failed ({' '.join(cmd)}):\n{tail}")
        (out / _BUILT).write_text(f"sources {SCRATCH}\nns3 {ns3_dir} {ns3_ver}\n")
    return library_path()


def user_cc_dir() -> Path | None:
    """The folder `$PHANTORA_CC_DIR` names (None when unset); an error naming it if it holds no `*.cc`."""
    text = os.environ.get(CC_DIR_ENV, "").strip()
    if not text:
        return None
    folder = Path(text).expanduser().resolve()
    if not folder.is_dir():
        raise InputError(f"{folder} is not a directory", field=CC_DIR_ENV)
    if not any(folder.glob("*.cc")):
        raise InputError(f"{folder} holds no *.cc congestion-control source", field=CC_DIR_ENV)
    return folder


def _cc_key(folder: Path) -> str:
    """Hash of the user's CC sources (names and bytes, headers too) and of our own build key."""
    h = hashlib.sha256(_build_key().encode() + b"\0")
    for path in sorted(p for p in folder.iterdir() if p.is_file() and p.suffix in (".cc", ".h")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cc_library_path() -> Path | None:
    """Where the user's CC library is (or will be) built: `<cache>/cc-<hash>/libphantora-cc.so`; None without one."""
    folder = user_cc_dir()
    if folder is None:
        return None
    return resources.cache_dir() / f"cc-{_cc_key(folder)}" / "libphantora-cc.so"


def cc_library(jobs: int = 2) -> Path | None:
    """The user's CC library, compiled from `$PHANTORA_CC_DIR/*.cc` against ours if not built yet (None when
    the variable is unset). A compile error is shown with the compiler's last lines."""
    out = cc_library_path()
    if out is None or out.exists():
        return out
    folder = user_cc_dir()
    assert folder is not None
    if needs_build():
        build(jobs)
    ns3_dir, ns3_ver = ns3_wheel()

    def command(tmp: Path) -> list[str]:
        cmd = ["make", "-C", str(SCRATCH), "plugin", f"NS3_DIR={ns3_dir}", f"NS3_VER={ns3_ver}"]
        return [*cmd, f"BUILD={library_path().parent}", f"CC_DIR={folder}", f"PLUGIN={tmp}"]

    def failed(cmd: list[str], proc: subprocess.CompletedProcess[str]) -> PhantoraError:
        tail = output_tail(proc)
        return PhantoraError(f"building the congestion controls of {CC_DIR_ENV}={folder} failed:\n{tail}")

    return build_once(out, ".lock", command, failed)
