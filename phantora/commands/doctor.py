"""`phantora doctor`: check the installation, one line per check, and say how to fix what is missing.

Required: torch, the ns3 wheel, the shipped data, a writable cache, make and a C++ compiler, and the ns-3
models (built on first use, then loaded and run on a 2-host flow). Optional: the `frameworks` and `dev`
extras. The exit status is 1 if a required check fails.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable

CONSTRAINTS = "-c scripts/constraints.txt"  # keeps torch==2.13.0 (CPU) when extras are installed
# Optional modules: (import name, distribution, extra).
OPTIONAL = (
    ("torchtitan", "torchtitan", "frameworks"),
    ("transformers", "transformers", "frameworks"),
    ("megatron.core", "megatron-core", "frameworks"),
    ("deepspeed", "deepspeed", "frameworks"),
    ("triton", "triton", "frameworks"),
    ("ray", "ray", "dev"),
    ("pyarrow", "pyarrow", "dev"),
    ("mmh3", "mmh3", "dev"),
)


class CheckError(Exception):
    """A check did not pass; the message says what is wrong and how to fix it."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="check the installation (torch, ns-3, the models, the cache, extras)")
    p.description = __doc__
    p.add_argument("--quick", action="store_true", help="do not build, load or run the ns-3 models")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    checks: list[tuple[str, Callable[[], str]]] = [
        ("python", lambda: sys.version.split()[0]),
        ("torch", check_torch),
        ("ns3 wheel", check_ns3_wheel),
        ("shipped data", check_data),
        ("cache", check_cache),
        ("compiler", check_compiler),
    ]
    if not args.quick:
        checks.append(("ns-3 models", check_models))
        checks.append(("congestion controls", check_ccs))
    failed = 0
    for name, check in checks:
        try:
            detail = check()
        except Exception as exc:  # noqa: BLE001 - a check reports any failure as a line, then the others run
            failed += 1
            first, rest = _first_line(exc)
            print(f"FAIL     {name}: {first}", flush=True)
            for line in rest:  # a build log's tail
                print(f"           {line}")
        else:
            print(f"ok       {name}: {detail}", flush=True)
    for module, dist, extra in OPTIONAL:
        version = _version(module, dist)
        if version:
            print(f"ok       {module} {version} ({extra} extra)")
        else:
            print(f"missing  {module} (optional, {extra} extra): pip install 'phantora[{extra}]' {CONSTRAINTS}")
    print("phantora doctor: " + (f"{failed} required check(s) failed" if failed else "all required checks passed"))
    return 1 if failed else 0


def _first_line(exc: Exception) -> tuple[str, list[str]]:
    """The error's first line and the rest (a build log follows it in PhantoraError)."""
    first, *rest = str(exc).strip().splitlines() or [type(exc).__name__]
    return first, rest


def _version(module: str, dist: str) -> str | None:
    """The installed version of an optional module, without importing it; None if it is missing."""
    try:
        if importlib.util.find_spec(module) is None:
            return None
    except (ImportError, ValueError):
        return None
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "(version unknown)"


def check_torch() -> str:
    try:
        import torch
    except ImportError as exc:
        raise CheckError(f"torch does not import ({exc}): pip install torch==2.13.0") from exc
    return f"{torch.__version__} at {os.path.dirname(torch.__file__)}"


def check_ns3_wheel() -> str:
    from phantora.netsim.packet import ns3_wheel

    try:
        path, ver = ns3_wheel()
    except Exception as exc:
        raise CheckError(f"{_first_line(exc)[0]}; pip install ns3==3.44.post0") from exc
    return f"{importlib.metadata.version('ns3')} (libns3.{ver}-*.so) at {path}"


def check_data() -> str:
    from phantora import resources
    from phantora.topology import shipped_names

    topologies = shipped_names()
    workloads = sorted(p.name for p in resources.workloads_dir().glob("*") if p.is_file())
    src = resources.ns3_source_dir()
    missing = [str(p) for p in (src / "Makefile", src / "model") if not p.exists()]
    if not topologies or not workloads or missing:
        raise CheckError(
            f"shipped data missing in {resources.data_root()} (topologies {len(topologies)}, workloads "
            f"{len(workloads)}, {', '.join(missing) or 'ns-3 sources ok'}): reinstall phantora from a wheel"
        )
    where = "git checkout" if resources.checkout_root() else "package"
    return f"{len(topologies)} topologies, {len(workloads)} workloads, ns-3 sources ({where}: {resources.data_root()})"


def check_cache() -> str:
    from phantora import resources

    root = resources.cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".doctor-"):
            pass
    except OSError as exc:
        raise CheckError(f"{root} is not writable ({exc.strerror}): set PHANTORA_CACHE to a writable folder") from exc
    return f"{root} is writable"


def check_compiler() -> str:
    cxx = os.environ.get("CXX") or "g++"
    found = [shutil.which(cxx), shutil.which("make")]
    if not all(found):
        raise CheckError(f"the ns-3 models are built with make and {cxx}: apt-get install make g++")
    return f"{found[0]}, {found[1]}"


def check_models() -> str:
    """Build the models if needed, load them, and run one flow between two hosts of a star."""
    from phantora.netsim import ns3_abi
    from phantora.netsim.base import Flow
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.packet import build, library_path, load_ns3, needs_build, runner_path
    from phantora.topology.model import Topology

    t0 = time.monotonic()
    built = ""
    if needs_build() and not os.environ.get(ns3_abi.LIB_ENV):  # a library of one's own is not built here
        print(f"...      building the ns-3 models into {library_path().parent} (a minute or two, once)", flush=True)
        build()
        built = f", built in {time.monotonic() - t0:.0f} s"
    load_ns3(build_if_needed=False)
    topo = Topology("doctor")
    for _ in range(2):
        topo.add_node("host")
    switch = topo.add_node("switch")
    for host in range(2):
        topo.add_link(host, switch, 100 * 10**9, 1000)
    sim = make_engine(EngineSpec("ns3"), topo.validate())
    try:
        sim.submit([Flow(1, 0, 1, 100_000)], at=0)
        done = sim.drain()
    finally:
        sim.close()
    if len(done) != 1 or done[0].end_ns <= 0:
        raise CheckError(f"a 2-host flow did not complete as expected ({done})")
    version = ns3_abi.check_runner(runner_path())  # the library's was checked as it loaded
    took = done[0].end_ns - done[0].start_ns
    return f"{library_path()} loaded (interface version {version}, runner too); a 100 kB flow took {took} ns{built}"


def check_ccs() -> str:
    """The registered CCs (`--cc`), with the user's own from $PHANTORA_CC_DIR built and loaded."""
    from phantora.netsim.cc_registry import cc_names
    from phantora.netsim.ns3_build import CC_DIR_ENV, user_cc_dir
    from phantora.netsim.packet_config import TRANSPORT_PRESETS

    mine = user_cc_dir()
    ccs = ", ".join(cc_names()) + (f" (with {CC_DIR_ENV}={mine})" if mine else f" (set {CC_DIR_ENV} to add yours)")
    return ccs + f"; transports (--set transport=NAME): {', '.join(TRANSPORT_PRESETS)}"
