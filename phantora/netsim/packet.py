"""`Ns3Simulator`: the packet-level `NetworkSimulator`, an ns-3 RDMA fabric driven in-process through cppyy.

The C++ side (ns3-scratch/, built into libphantora-ns3.so on first use, see `build`) holds the
whole network: NICs with one queue pair per flow, PFC switches with shared-buffer MMUs, ECN,
INT and the congestion controllers. Python builds it from a `Topology` and a `PacketConfig`,
hands over flows with their dependencies (released inside C++, so there is no Python callback
per flow or per packet), runs it in windows and drains the results.

ns-3 is imported lazily (``from ns import ns`` takes seconds) and once per process; ns-3 has one
global simulator, so only one Ns3Simulator can be open at a time.
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
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from phantora import resources
from phantora.errors import InputError, PhantoraError
from phantora.netsim.base import Completion, Flow, check_flow_batch
from phantora.netsim.flow import CausalityError
from phantora.netsim.hpcc_io import FctLine, PfcLine
from phantora.netsim.ns3_calls import RecordedNetwork
from phantora.netsim.observe import (
    CnpEvent,
    Drop,
    EcnMark,
    FlowTransport,
    PacketChannelUsage,
    PfcEvent,
    QueueSample,
)
from phantora.netsim.packet_config import PacketConfig, field_of_param
from phantora.topology.model import Topology

_MASK64 = (1 << 64) - 1
_FOREVER_NS = 1 << 62

# The model sources: ns3-scratch/ of the checkout, or its copy in an installed package (phantora.resources).
SCRATCH = resources.ns3_source_dir()
CHECKOUT = resources.checkout_root()
BUILD_SCRIPT = CHECKOUT / "scripts" / "build_ns3.sh" if CHECKOUT else None
_TARGETS = ("libphantora-ns3.so", "phantora-ns3-runner")  # what an installed package builds (no C++ tests)
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
    for part in ("model", "helper", "runner", "test"):
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
    return Path(env) if env else build_dir() / "libphantora-ns3.so"


def runner_path() -> Path:
    """The standalone runner binary (built next to the library)."""
    return library_path().parent / "phantora-ns3-runner"


def needs_build() -> bool:
    """True if the library or the runner (in a checkout also the C++ tests) are missing or older than their sources.

    A cache build directory is named by a hash of the sources, so there it is enough that the build completed.
    """
    lib = library_path()
    if CHECKOUT is None:
        complete = bool(os.environ.get("PHANTORA_NS3_LIB")) or (lib.parent / _BUILT).exists()
        return not (complete and lib.exists() and runner_path().exists())

    def newest(*dirs: str) -> float:
        files = [p for d in dirs for p in SCRATCH.glob(f"{d}/*") if p.is_file()] + [SCRATCH / "Makefile"]
        return max(p.stat().st_mtime for p in files if p.exists())

    built = {lib: ("model", "helper"), runner_path(): ("runner",), lib.parent / "phantora-ns3-tests": ("test",)}
    if not all(p.exists() for p in built):
        return True
    model = newest("model", "helper")
    return any(max(model, newest(*dirs)) > binary.stat().st_mtime for binary, dirs in built.items())


def build(jobs: int = 2) -> Path:
    """Build the models and return the library path: scripts/build_ns3.sh in a checkout (incremental), else make
    into the cache (`build_dir()`). Either holds a lock, so concurrent first uses build once."""
    if os.environ.get("PHANTORA_NS3_LIB"):
        return library_path()
    if BUILD_SCRIPT is not None:
        cmd = ["bash", str(BUILD_SCRIPT), "-j", str(jobs)]
        env = {"PHANTORA_PYTHON": sys.executable, **os.environ}  # the script finds the ns3 wheel with this Python
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise PhantoraError(f"building the ns-3 fabric failed ({BUILD_SCRIPT}):\n{tail}")
        return library_path()
    return _build_cached(jobs)


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
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise PhantoraError(f"building the ns-3 fabric into {out} failed ({' '.join(cmd)}):\n{tail}")
        (out / _BUILT).write_text(f"sources {SCRATCH}\nns3 {ns3_dir} {ns3_ver}\n")
    return library_path()


@dataclass
class Ns3Runtime:
    """The loaded ns-3 bindings and fabric library (one per process)."""

    ns: Any  # the `ns` module of the ns3 wheel
    cppyy: Any
    lib: Path

    @property
    def gbl(self) -> Any:
        """cppyy.gbl.ns3: PhantoraNetwork, the models, ns-3 itself."""
        return self.cppyy.gbl.ns3

    def include_model_headers(self) -> None:
        """Declare the model classes (CongestionControl, Cc*, ...) to cppyy, for tests that drive them."""
        for header in ["congestion-control.h", *sorted(p.name for p in SCRATCH.glob("model/cc-*.h"))]:
            self.cppyy.include(header)


_RUNTIME: Ns3Runtime | None = None


def load_ns3(build_if_needed: bool = True) -> Ns3Runtime:
    """Import ns-3 (once), build the fabric library if it is stale, and load it into cppyy."""
    global _RUNTIME
    if _RUNTIME is not None:
        return _RUNTIME
    if build_if_needed and needs_build():
        build()
    lib = library_path()
    if not lib.exists():
        how = BUILD_SCRIPT or "phantora doctor"
        raise PhantoraError(f"the ns-3 fabric library {lib} is missing: run {how}")
    ns = _quiet_import_ns()
    import cppyy

    cppyy.add_include_path(str(SCRATCH / "model"))
    cppyy.add_include_path(str(SCRATCH / "helper"))
    cppyy.include("phantora-network.h")
    cppyy.load_library(str(lib))
    _RUNTIME = Ns3Runtime(ns, cppyy, lib)
    return _RUNTIME


def _quiet_import_ns() -> Any:
    """`from ns import ns`, hiding the wheel's harmless cling start-up chatter on stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            from ns import ns
        except BaseException:
            os.dup2(saved, 2)
            tmp.seek(0)
            sys.stderr.write(tmp.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)
    return ns


def cpp_message(exc: BaseException) -> str:
    """The what() text of a C++ exception raised through cppyy."""
    text = str(exc)
    if "=>" in text:
        text = text.split("=>", 1)[1].strip()
    for prefix in ("invalid_argument: ", "runtime_error: ", "out_of_range: ", "logic_error: "):
        if text.startswith(prefix):
            return text[len(prefix) :]
    return text


def _finalize_field(message: str) -> str:
    """The PacketConfig field a Finalize() error is about."""
    words = (("LoadBalancing", "lb"), ("Receiver", "rx"), ("Scheduler", "scheduler"), ("kmin", "kmin_map"))
    for word, name in (*words, ("pmax", "pmax_map"), ("Kmax", "kmax_map")):
        if word in message:
            return name
    return "cc_attrs" if "attribute" in message else "cc"


class Ns3Simulator:
    """Packet-level `NetworkSimulator` over the ns-3 phantora fabric."""

    def __init__(self, topology: Topology, config: PacketConfig | None = None, calls: Path | None = None) -> None:
        """`calls`: also write the run's PhantoraNetwork calls there (a script for phantora-ns3-runner)."""
        self.topology = topology
        config = (config or PacketConfig()).validate()
        # The ECMP policy: the config's, else the topology's; Python-side routes follow the same one.
        topology.use_ecmp(config.ecmp_hash or topology.ecmp_hash)
        self.config = config.with_updates(ecmp_hash=topology.ecmp_hash)
        self._rt = load_ns3()
        try:
            self._net = self._rt.gbl.PhantoraNetwork()
            if calls is not None:
                self._net = RecordedNetwork(self._net, calls)
        except Exception as exc:  # noqa: BLE001 - cppyy turns the C++ runtime_error into an Exception subclass
            raise PhantoraError(f"cannot open the ns-3 network: {cpp_message(exc)}") from None
        self._closed = False
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        self._vec = self._rt.cppyy.gbl.std.vector["uint64_t"]
        self._known: set[int] = set()
        self._tags: dict[int, str] = {}
        self._fct: list[FctLine] = []
        self._pfc: list[PfcEvent] = []
        self._queues: list[QueueSample] = []
        self._drops: list[Drop] = []
        self._cnps: list[CnpEvent] = []
        self._marks: list[EcnMark] = []
        self._submitted = 0

    def _build(self) -> None:
        net = self._net
        for key, value in self.config.to_params(link.bandwidth_bps for link in self.topology.links):
            try:
                net.SetParam(key, value)
            except Exception as exc:  # noqa: BLE001 - cppyy raises the C++ exception as any Exception subclass
                raise InputError(cpp_message(exc), field=field_of_param(key)) from None
        for node in self.topology.nodes:
            net.AddNode(node.kind)
        for link in self.topology.links:
            net.AddLink(link.a, link.b, link.bandwidth_bps, link.latency_ns)
        try:
            net.Finalize()
        except Exception as exc:  # noqa: BLE001 - cppyy raises the C++ exception as any Exception subclass
            message = cpp_message(exc)
            raise InputError(message, field=_finalize_field(message)) from None

    # ----- NetworkSimulator --------------------------------------------------------------------
    def submit(self, flows: Sequence[Flow], at: int, dports: Mapping[int, int] | None = None) -> None:
        """Add flows eligible from `at` (>= now()). Deps may name flows of this batch or earlier ones.

        `dports` (flow id -> HPCC destination port) only labels fct.txt records.
        """
        now = self.now()
        if at < now:
            raise CausalityError(f"flows submitted at {at} ns but the network is already at {now} ns")
        self._check_batch(flows)
        net, vec = self._net, self._vec
        for f in flows:
            deps = vec()
            for d in f.deps:
                deps.push_back(d)
            key = (f.id if f.key is None else f.key) & _MASK64
            try:
                dport = dports.get(f.id, 100) if dports else 100
                net.AddFlow(f.id, f.src, f.dst, f.size, at, f.priority, key, deps, f.delay_ns, dport)
            except Exception as exc:  # noqa: BLE001 - cppyy raises the C++ exception as any Exception subclass
                raise InputError(cpp_message(exc), field="flows") from None
            self._known.add(f.id)
            if f.tag:
                self._tags[f.id] = f.tag
        self._submitted += len(flows)

    def advance(self, until: int) -> list[Completion]:
        """Run every event at or before `until`; now() becomes `until`."""
        now = self.now()
        if until < now:
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {now} ns")
        self._net.RunUntil(until)
        return self._take()

    def advance_watching(self, until: int, watch: Collection[int], earliest: int | None = None) -> list[Completion]:
        """`advance(until)`, but return right after the first ns at which a flow in `watch` completes.

        Every event of that ns is run and now() is that ns (the exact co-simulation stepping of
        `phantora.netsim.base.step_watching`, done inside ns-3: the completion stops the simulator).
        `until` >= 2^62 means no limit: then it also returns once nothing is in flight. `earliest`
        (no watched flow completes before it) is accepted for the stepping interface and not needed.
        """
        unbounded = until >= _FOREVER_NS
        if not watch:
            return [] if unbounded else self.advance(until)
        now = self.now()
        if not unbounded and until < now:
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {now} ns")
        ids = self._vec()
        for fid in watch:
            if 0 <= fid <= _MASK64:
                ids.push_back(fid)
        self._net.RunUntilWatched(-1 if unbounded else until, ids)
        return self._take()

    def advance_to_completion(self, until: int) -> list[Completion]:
        """`advance(until)`, but return right after the first ns at which any flow completes (every event of
        that ns run, now() that ns): how a caller that keeps dependencies of its own steps this engine. With
        no limit (`until` >= 2^62) it also returns once nothing is in flight."""
        now = self.now()
        if until < now:
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {now} ns")
        self._net.RunUntilCompletion(-1 if until >= _FOREVER_NS else until)
        return self._take()

    def next_event_time(self) -> int | None:
        """The next pending ns-3 event, or None when no flow is in flight."""
        if self.in_flight() == 0:
            return None
        t = int(self._net.NextEventTime())
        return None if t < 0 else t

    def now(self) -> int:
        return int(self._net.Now())

    def in_flight(self) -> int:
        return int(self._net.InFlight())

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        """Run until nothing is in flight; now() ends at the last completion."""
        limit = _FOREVER_NS if limit_ns is None else limit_ns
        if self.in_flight() and not self._net.RunUntilIdle(max(limit, self.now())):
            left = self.in_flight()
            if self.now() >= limit:
                raise PhantoraError(f"the network did not drain by {limit} ns: {left} flows still in flight")
            raise PhantoraError(f"{left} flows can never start: they wait on flows that never complete")
        return self._take()

    def stats(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for pair in self._net.Stats():
            key = pair.first
            key = key.decode() if isinstance(key, bytes) else str(key)
            value = float(pair.second)
            out[key] = int(value) if value.is_integer() else value
        out["engine"] = "ns3"
        out["cc"] = self.config.cc
        out["ecmp_hash"] = self.topology.ecmp_hash
        out["lb"] = self.config.lb
        out["rx"] = self.config.rx
        out.update(self._switch_link_load())
        out["approximations"] = self.config.approximations()
        return out

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._net.Close()

    def __enter__(self) -> Ns3Simulator:
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - interpreter shutdown: cppyy may already be gone
                pass

    def keepalive(self) -> None:
        """In-process: nobody to tell."""

    def channels(self) -> Ns3Simulator:
        return self

    def fabric(self) -> Ns3Simulator:
        return self

    # ----- packet-level extras -----------------------------------------------------------------
    def finish(self, limit_ns: int | None = None) -> bool:
        """Run until every flow's last ACK has reached its sender (for FCT records); True if so."""
        limit = _FOREVER_NS if limit_ns is None else max(limit_ns, self.now())
        return bool(self._net.RunUntilQuiet(limit))

    def fct_records(self) -> list[FctLine]:
        """HPCC-style FCT records (completion at the sender's last ACK), in completion order."""
        for r in self._net.DrainFct():
            self._fct.append(
                FctLine(
                    int(r.src),
                    int(r.dst),
                    int(r.sport),
                    int(r.dport),
                    int(r.size),
                    int(r.startNs),
                    int(r.fctNs),
                    int(r.standaloneNs),
                    int(r.id),
                )
            )
        return list(self._fct)

    def pfc_events(self) -> list[PfcEvent]:
        for r in self._net.DrainPfc():
            self._pfc.append(
                PfcEvent(
                    int(r.timeNs),
                    int(r.node),
                    int(r.nodeType),
                    int(r.port),
                    int(r.prio),
                    bool(r.pause),
                    int(r.fromNode),
                )
            )
        return list(self._pfc)

    def pfc_lines(self) -> list[PfcLine]:
        """pfc.txt records (HPCC numbers ports from 1)."""
        return [PfcLine(e.time_ns, e.node, e.node_type, e.port + 1, int(e.pause)) for e in self.pfc_events()]

    def queue_samples(self) -> list[QueueSample]:
        for r in self._net.DrainQueueSamples():
            self._queues.append(QueueSample(int(r.timeNs), int(r.node), int(r.port), int(r.prio), int(r.bytes)))
        return list(self._queues)

    def drops(self) -> list[Drop]:
        for r in self._net.DrainDrops():
            self._drops.append(Drop(int(r.timeNs), int(r.node), int(r.port), int(r.prio), int(r.flowId), int(r.seq)))
        return list(self._drops)

    def cnp_events(self) -> list[CnpEvent]:
        """Every CNP so far, in time order (empty with `trace_cnp` off; stats()["cnps"] counts them anyway)."""
        for r in self._net.DrainCnps():
            self._cnps.append(CnpEvent(int(r.timeNs), int(r.node), int(r.flowId), int(r.fromNode), int(r.seq)))
        return list(self._cnps)

    def ecn_mark_events(self) -> list[EcnMark]:
        """Every CE mark so far, in time order (empty with `trace_ecn` off; stats()["ecn_marks"] counts them)."""
        for r in self._net.DrainEcnMarks():
            self._marks.append(
                EcnMark(int(r.timeNs), int(r.node), int(r.port), int(r.prio), int(r.channel), int(r.flowId))
            )
        return list(self._marks)

    def flow_transport(self) -> dict[int, FlowTransport]:
        """Flow id -> retransmissions and reordering, for every flow completed at its receiver so far."""
        return {
            int(r.id): FlowTransport(
                int(r.id), int(r.retxPackets), int(r.retxBytes), int(r.oooPackets), int(r.reorderMaxBytes)
            )
            for r in self._net.FlowTransport()
        }

    def channel_usage(self, elapsed_ns: int | None = None) -> list[PacketChannelUsage]:
        """Per-channel bytes, pauses, marks and utilisation over `elapsed_ns` (default now()), used channels only."""
        elapsed = self.now() if elapsed_ns is None else elapsed_ns
        rows = []
        for r in self._net.ChannelStats():
            if not r.txPackets:
                continue
            bw, nbytes = int(r.bps), int(r.txBytes)
            util = nbytes * 8e9 / (bw * elapsed) if elapsed > 0 else 0.0
            rows.append(
                PacketChannelUsage(
                    int(r.channel),
                    int(r.src),
                    int(r.dst),
                    bw,
                    nbytes,
                    int(r.txPackets),
                    int(r.pausedNs),
                    int(r.ecnMarks),
                    int(r.maxQueueBytes),
                    util,
                )
            )
        return rows

    def route(self, src: int, dst: int, flow_key: int = 0) -> list[int]:
        """Channel ids the switches' own tables and hash give a flow (to compare with Topology.route)."""
        return [int(c) for c in self._net.Route(src, dst, flow_key & _MASK64)]

    def base_rtt_ns(self, src: int, dst: int, flow_key: int = 0) -> int:
        """2 x propagation + one payload's serialisation per hop, as HPCC's base RTT."""
        return int(self._net.BaseRttNs(src, dst, flow_key & _MASK64))

    def flow_rate_bps(self, flow_id: int) -> int:
        """Current pacing rate of an open flow (0 if not sending)."""
        return int(self._net.FlowRateBps(flow_id))

    # ----- internals ---------------------------------------------------------------------------
    def _switch_link_load(self) -> dict[str, int]:
        """Bytes on the busiest and the least busy directed switch-to-switch channel (unused ones count as 0):
        how evenly load balancing spread the traffic over the fabric's equal-cost links."""
        kinds = [n.kind for n in self.topology.nodes]
        used = {int(r.channel): int(r.txBytes) for r in self._net.ChannelStats()}
        loads = [
            used.get(ch, 0)
            for ch in range(self.topology.num_channels)
            if all(kinds[n] == "switch" for n in self.topology.channel_ends(ch))
        ]
        return {"switch_link_bytes_max": max(loads), "switch_link_bytes_min": min(loads)} if loads else {}

    def _take(self) -> list[Completion]:
        out = []
        tags = self._tags
        for r in self._net.DrainCompletions():
            fid = int(r.id)
            out.append(
                Completion(fid, int(r.startNs), int(r.endNs), int(r.size), int(r.src), int(r.dst), tags.pop(fid, ""))
            )
        return out

    def _check_batch(self, flows: Sequence[Flow]) -> None:
        """`check_flow_batch`, plus what C++ needs: 64-bit ids and a data priority class 1..7."""
        for f in flows:
            if not 0 <= f.id <= _MASK64:
                raise InputError(f"flow {f.id}: ids must be in [0, 2^64)", field="id")
            if not 1 <= f.priority <= 7:
                raise InputError(f"flow {f.id}: priority must be 1..7 (0 is the control class)", field="priority")
        check_flow_batch(flows, self.topology, self._known.__contains__)
