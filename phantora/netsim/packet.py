"""`Ns3Simulator`: the packet-level `NetworkSimulator`, an ns-3 RDMA fabric driven in-process through cppyy.

The C++ side (ns3-scratch/, built into libphantora-ns3.so on first use, see `ns3_build`) holds the
whole network: NICs with one queue pair per flow, PFC switches with shared-buffer MMUs, ECN,
INT and the congestion controllers. Python builds it from a `Topology` and a `PacketConfig`,
hands over flows with their dependencies (released inside C++, so there is no Python callback
per flow or per packet), runs it in windows and drains the results.

ns-3 is loaded lazily (its core, network and stats modules: about a CPU second) and once per process; ns-3 has
one global simulator, so only one Ns3Simulator can be open at a time.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import tempfile
import threading
from array import array
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from phantora.errors import InputError, PhantoraError, SimulationInterruptedError
from phantora.netsim import cc_registry, ns3_abi
from phantora.netsim.base import CausalityError, Completion, Flow, check_flow_batch, completion
from phantora.netsim.cpp_errors import cpp_message
from phantora.netsim.cut_windows import NEVER, Peers, WindowStats, run_windows, warm_up
from phantora.netsim.effective import EffectiveSettings
from phantora.netsim.hpcc_io import FctLine, PfcLine, pfc_txt_lines
from phantora.netsim.idset import IdSet
from phantora.netsim.ns3_build import (  # noqa: F401 - re-exported: packet.build, packet.needs_build, ...
    BUILD_SCRIPT,
    SCRATCH,
    build,
    build_dir,
    cc_library,
    library_path,
    needs_build,
    ns3_wheel,
    runner_path,
)
from phantora.netsim.ns3_calls import RecordedNetwork
from phantora.netsim.observe import (
    CnpEvent,
    Drop,
    EcnMark,
    FabricRecords,
    FlowTransport,
    PacketChannelUsage,
    PfcEvent,
    QueueSample,
    Trim,
)
from phantora.netsim.packet_config import PacketConfig, field_of_param
from phantora.netsim.packet_summary import ChannelRow, channel_usage, packet_stats
from phantora.netsim.partition import partition_params
from phantora.netsim.queue_spool import QueueSpool
from phantora.netsim.record_order import RecordKey
from phantora.topology.ecmp import ecmp_input
from phantora.topology.model import Topology

if TYPE_CHECKING:  # numpy is imported where records are read: the netsim CLI's start-up imports none
    import numpy as np

    from phantora.netsim.heartbeat import Heartbeat

_MASK64 = (1 << 64) - 1
_FOREVER_NS = 1 << 62
# The plain structs ns-3 hands back by the vector, as numpy reads them in place (`_rows`): ns3::FlowBound and
# ns3::FlowRecord (phantora-network.h), in declaration order, each at its natural alignment.
_DTYPES: dict[str, np.dtype] = {}


def _dtype(name: str) -> np.dtype:
    """The numpy row type of ns-3's struct `name` ("FlowBound" or "FlowRecord"), built once."""
    if name not in _DTYPES:
        import numpy as np

        _DTYPES["FlowBound"] = np.dtype([("id", "=u8"), ("ns", "=i8")])
        _DTYPES["FlowRecord"] = np.dtype(
            {
                "names": ["id", "src", "dst", "size", "start", "end"],
                "formats": ["=u8", "=u4", "=u4", "=u8", "=i8", "=i8"],
                "offsets": [0, 8, 12, 16, 24, 32],
                "itemsize": 40,
            }
        )
    return _DTYPES[name]


_ROWS_MIN = 8  # fewer records are read one attribute at a time (numpy's fixed cost is about that)
_LAYOUT: dict[str, bool] = {}  # a struct's name -> whether `_rows` may read it (checked once, at its first vector)


@dataclass
class Ns3Runtime:
    """The loaded ns-3 libraries and fabric library (one per process)."""

    cppyy: Any
    lib: Path
    cc_libs: list[Path]  # the user's CC libraries loaded after it ($PHANTORA_CC_DIR), in load order
    _ns: Any = field(default=None, repr=False)

    @property
    def ns(self) -> Any:
        """cppyy.gbl.ns3 with ns-3's core, network and stats headers parsed, on first use (about 1 CPU s). An engine
        needs only their libraries and the facade's header (phantora-network.h includes no ns-3 header), so a run,
        and each partition worker, skips the parse; what drives ns-3's own classes from Python asks for it here."""
        if self._ns is None:
            # a parse of seconds at load: cling releases the GIL meanwhile, so signals are handled (`_load_fabric`)
            self.cppyy.gbl.gInterpreter.Declare.__release_gil__ = True
            self._ns = _quiet_import_ns()
            self.cppyy.gbl.gInterpreter.Declare.__release_gil__ = False  # (not on a signal, as `_load_fabric`)
        return self._ns

    @property
    def gbl(self) -> Any:
        """cppyy.gbl.ns3: PhantoraNetwork, the models, ns-3 itself."""
        return self.cppyy.gbl.ns3

    def include_model_headers(self) -> None:
        """Declare the model classes (CongestionControl, Cc*, ...) to cppyy, for tests that drive them."""
        for header in ["congestion-control.h", *sorted(p.name for p in SCRATCH.glob("model/cc-*.h"))]:
            self.cppyy.include(header)


_RUNTIME: Ns3Runtime | None = None
_KEEP_FCT = True  # whether this process's engines keep FCT records (`keep_fct_records`)


def keep_fct_records(keep: bool) -> None:
    """Whether the Ns3Simulators this process opens keep FCT records for `fct_records` (yes unless told). A
    process that never reads them, a live run's network server, says no: ns-3's are then dropped after each run call
    (else it keeps 72 bytes a flow for the whole run). ns-3 has one network a process: this is the process's setting."""
    global _KEEP_FCT
    _KEEP_FCT = keep


def load_ns3(build_if_needed: bool = True) -> Ns3Runtime:
    """Import ns-3 (once), build the fabric library if it is stale, and load it into cppyy; then the library of
    the user's own CCs ($PHANTORA_CC_DIR, built if needed), unless this process has it already."""
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = _load_fabric(build_if_needed)
    extra = cc_library() if build_if_needed else None
    if extra is not None and extra not in _RUNTIME.cc_libs:
        _RUNTIME.cppyy.load_library(str(extra))
        _RUNTIME.cc_libs.append(extra)
    return _RUNTIME


def _load_fabric(build_if_needed: bool) -> Ns3Runtime:
    """Import ns-3 and load libphantora-ns3.so (built first if stale and allowed)."""
    if build_if_needed and needs_build():
        build()
    lib = library_path()
    if not lib.exists():
        how = BUILD_SCRIPT or "phantora doctor"
        raise PhantoraError(f"the ns-3 fabric library {lib} is missing: run {how}")
    import cppyy

    # cling parses each header in one C++ call (seconds of wall at load 10-15): let it release the GIL, and load
    # in a thread, so this thread keeps running signal handlers (SIGTERM) (only while loading: later declarations
    # stay serialised by the GIL, as before)
    def fabric() -> None:
        cppyy.add_include_path(str(SCRATCH / "model"))
        _checkpoint()
        cppyy.include("phantora-network.h")
        _checkpoint()
        cppyy.load_library(str(lib))

    cppyy.gbl.gInterpreter.Declare.__release_gil__ = True
    _quiet_import_ns(headers=False)  # the libraries; their headers when asked (`Ns3Runtime.ns`)
    ns3_abi.check_library(lib)  # loads it: refused before cling parses its header if it reads another interface
    interruptible(fabric)
    # (not reset on a signal: the loading thread's next parse must not hold the GIL while this one exits)
    cppyy.gbl.gInterpreter.Declare.__release_gil__ = False
    return Ns3Runtime(cppyy, lib, [])


_CANCELLED = threading.Event()  # set when a signal stopped the wait on a load: its thread stops at `_checkpoint`


class _LoadCancelled(BaseException):
    """The loading thread stops between two C++ calls: the main thread is exiting."""


def _checkpoint() -> None:
    """Called by the loading thread between C++ calls: stop there if the main thread was stopped."""
    if _CANCELLED.is_set():
        raise _LoadCancelled


def interruptible(fn: Callable[[], Any], tick_s: float = 0.1) -> Any:
    """fn() run in a thread while the main thread waits in `tick_s` steps, so its signal handlers run (the CLI's
    `Terminated`, KeyboardInterrupt) even while fn sits in a long C++ call that released the GIL. A handler that
    raises sets `_CANCELLED`: fn stops at its next `_checkpoint`, and the interpreter's exit waits for that (not a
    daemon thread: one still inside cling when the interpreter finalises crashes it). Off the main thread: inline."""
    if threading.current_thread() is not threading.main_thread():
        return fn()
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["value"] = fn()
        except _LoadCancelled:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            box["error"] = exc

    t = threading.Thread(target=body, name="phantora-ns3-load")
    t.start()
    try:
        while t.is_alive():
            t.join(tick_s)
    except BaseException:
        _CANCELLED.set()
        raise
    if "error" in box:
        raise box["error"]
    return box.get("value")


NS3_MODULES = ("core", "network", "stats")  # what libphantora-ns3.so links against (ldd), in dependency order


def _quiet_import_ns(headers: bool = True) -> Any:
    """ns-3's core, network and stats modules loaded into cppyy (see `interruptible`), their headers parsed unless
    `headers` is false, hiding cling's harmless start-up chatter on stderr; the chatter is shown if the load fails,
    not when a signal stops the wait.

    Not the wheel's `from ns import ns`, which parses every module's headers (wifi, lte, ...: 11 CPU s, 46 s of
    wall at load 15) where the fabric needs these three (1.2 CPU s, 4.5 s): nothing here uses the others. Each
    library is loaded before its headers are parsed, so their static initialisers resolve."""

    def load() -> Any:
        import cppyy
        import libcppyy

        prefix = _ns3_prefix()
        libcppyy.AddSmartPtrType("Ptr")  # as the wheel does: ns3::Ptr<T> is a smart pointer to Python
        libdir = next((d for d in (prefix / "lib64", prefix / "lib") if d.is_dir()), prefix / "lib64")
        cppyy.add_library_path(str(libdir))
        cppyy.add_include_path(str(prefix / "include"))
        for module in NS3_MODULES:
            found = sorted(libdir.glob(f"libns3*-{module}.so"))
            if not found:
                raise PhantoraError(f"the ns3 wheel has no {module} library in {libdir}: pip install ns3 again")
            _checkpoint()
            cppyy.load_library(str(found[-1]))
        if not headers:
            return None  # (no ns3 namespace yet: phantora-network.h declares it)
        for module in NS3_MODULES:
            _checkpoint()
            cppyy.include(f"ns3/{module}-module.h")
        return cppyy.gbl.ns3

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            return interruptible(load)
        except Exception:
            os.dup2(saved, 2)
            tmp.seek(0)
            sys.stderr.write(tmp.read().decode(errors="replace"))
            raise
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def _ns3_prefix() -> Path:
    """The ns3 wheel's install prefix (its include/ and lib64/)."""
    import importlib.util

    spec = importlib.util.find_spec("ns3")
    if spec is None or not spec.submodule_search_locations:
        raise PhantoraError("the ns3 Python wheel is not installed (pip install ns3)")
    return Path(next(iter(spec.submodule_search_locations)))


def finalize_field(message: str) -> str:
    """The PacketConfig field a Finalize() error is about."""
    words = (("LoadBalancing", "lb"), ("Receiver", "rx"), ("Scheduler", "scheduler"), ("kmin", "kmin_map"))
    for word, name in (*words, ("pmax", "pmax_map"), ("Kmax", "kmax_map")):
        if word in message:
            return name
    return "cc_attrs" if "attribute" in message else "cc"


class Ns3Simulator:
    """Packet-level `NetworkSimulator` over the ns-3 phantora fabric."""

    posts_at_dep_ends = False  # a flow starts where it is handed over: the hybrid holds one until its deps end
    heartbeat: Heartbeat | None = None  # set by a progress display: run calls in chunks, reported between

    def __init__(self, topology: Topology, config: PacketConfig | None = None, calls: Path | None = None) -> None:
        """`calls`: also write the run's PhantoraNetwork calls there (a script for phantora-ns3-runner)."""
        self.topology = topology
        config = (config or PacketConfig()).validate()
        # The ECMP policy: the config's, else the topology's; Python-side routes follow the same one.
        topology.use_ecmp(config.ecmp_hash or topology.ecmp_hash)
        self.config = config.with_updates(ecmp_hash=topology.ecmp_hash)
        self._rt = load_ns3()
        cc_registry.check(self.config.cc, self.config.cc_attrs)  # one-line errors naming cc or cc.ATTR
        try:
            self._net = self._rt.gbl.PhantoraNetwork()
            if calls is not None:
                self._net = RecordedNetwork(self._net, calls, libraries=self._rt.cc_libs)
        except Exception as exc:  # noqa: BLE001 - cppyy turns the C++ runtime_error into an Exception subclass
            raise PhantoraError(f"cannot open the ns-3 network: {cpp_message(exc)}") from None
        self._closed = False
        try:
            self._interruptible = self._net.InterruptedBy() == 0
        except Exception:  # noqa: BLE001 - a library built before interruptible run calls (compare_ns3_builds --old)
            self._interruptible = False
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        # One call a batch (issue 38, a decomposition worker): AddFlows for flows without deps (not when recording a
        # call script: the runner replays AddFlow lines), StepToCompletion for a run to the next completion and its
        # records; a library built before them (compare_ns3_builds --old) keeps a call a flow and a record.
        self._add_packed = calls is None and hasattr(self._net, "AddFlows")
        self._step_packed = hasattr(self._net, "StepToCompletion")
        self._vec = self._rt.cppyy.gbl.std.vector["uint64_t"]
        self._no_deps = self._vec()  # what AddFlow (a const reference) gets for no deps: one, not a new one a flow
        self._known = IdSet()  # a bit a flow: a long live run adds flows for hours
        self.prechecked = False  # set by a caller that checks every batch it hands over (a decomposition worker)
        self._tags: dict[int, str] = {}
        self._fct: list[FctLine] = []
        self._keep_fct = _KEEP_FCT  # else ns-3's are dropped after each run call (`_ran`)
        self._pfc: list[PfcEvent] = []
        self._queues = QueueSpool()  # on disk as drained: after every run call while sampling (queue_spool)
        self._drops: list[Drop] = []
        self._trims: list[Trim] = []
        self._cnps: list[CnpEvent] = []
        self._marks: list[EcnMark] = []
        self._seen = (0, 0, 0, 0, 0)  # records handed out by new_records()
        self._submitted = 0
        self._effective: EffectiveSettings | None = None

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
        fluid = self.config.nvlink == "fluid"
        if self.config.partition_loopback:
            for key, value in partition_params(self.topology, self.config.partition_loopback, nvlink_fluid=fluid):
                net.SetParam(key, value)
        elif self.config.partition_worker >= 0:
            n, g = self.config.partition, self.config.partition_worker
            for key, value in partition_params(self.topology, n, nvlink_fluid=fluid, worker=g):
                net.SetParam(key, value)
        try:
            net.Finalize()
        except Exception as exc:  # noqa: BLE001 - cppyy raises the C++ exception as any Exception subclass
            message = cpp_message(exc)
            raise InputError(message, field=finalize_field(message)) from None

    # ----- NetworkSimulator --------------------------------------------------------------------
    def submit(self, flows: Sequence[Flow], at: int, dports: Mapping[int, int] | None = None) -> None:
        """Add flows eligible from `at` (>= now()). Deps may name flows of this batch or earlier ones.

        `dports` (flow id -> HPCC destination port) only labels fct.txt records.
        """
        now = self.now()
        if at < now:
            raise CausalityError(f"flows submitted at {at} ns but the network is already at {now} ns")
        if not self.prechecked:
            self._check_batch(flows)
        net, no_deps = self._net, self._no_deps
        per_connection = self.config.qp == "connection"
        if self._add_packed and not dports and len(flows) > 1 and not any(f.deps for f in flows):
            self._add_flows(flows, at, per_connection)
            return
        for f in flows:
            # a long deps list crosses in one call (packed 8-byte ids), not one push_back an id
            deps = net.UnpackIds(array("Q", f.deps).tobytes()) if f.deps else no_deps
            key = ns3_key(f)
            try:
                dport = dports.get(f.id, 100) if dports else 100
                net.AddFlow(f.id, f.src, f.dst, f.size, at, f.priority, key, deps, f.delay_ns, dport, f.via_nic)
                _set_extras(net, f, per_connection)
            except Exception as exc:  # noqa: BLE001 - cppyy raises the C++ exception as any Exception subclass
                raise InputError(cpp_message(exc), field="flows") from None
            self._known.add(f.id)
            if f.tag:
                self._tags[f.id] = f.tag
        self._submitted += len(flows)

    def _add_flows(self, flows: Sequence[Flow], at: int, per_connection: bool) -> None:
        """`submit` of flows without deps in one AddFlows call (packed words, `PhantoraNetwork::AddFlows`), each
        flow's extras after it as `submit` sets them; the same calls in the same order but for the packing."""
        net = self._net
        words = array("Q")
        for f in flows:
            key = ns3_key(f)
            words.extend((f.id, f.src, f.dst, f.size, at, f.priority, key, f.delay_ns, int(f.via_nic)))
        try:
            net.AddFlows(words.tobytes())
            for f in flows:
                _set_extras(net, f, per_connection)
        except Exception as exc:  # noqa: BLE001 - cppyy raises the C++ exception as any Exception subclass
            raise InputError(cpp_message(exc), field="flows") from None
        self._known.update(f.id for f in flows)
        tags = self._tags
        for f in flows:
            if f.tag:
                tags[f.id] = f.tag
        self._submitted += len(flows)

    def advance(self, until: int) -> list[Completion]:
        """Run every event at or before `until`; now() becomes `until`."""
        now = self.now()
        if until < now:
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {now} ns")
        if self.heartbeat is not None and until < _FOREVER_NS:
            got: list[Completion] = []

            def step(t: int) -> bool:
                self._ran(self._net.RunUntil(t))
                got.extend(self._take())
                return False

            self.heartbeat.run(self.now, step, until, lambda: False)
            return got
        self._ran(self._net.RunUntil(until))
        return self._take()

    def advance_watching(self, until: int, watch: Collection[int], earliest: int | None = None) -> list[Completion]:
        """`advance(until)`, but return right after the first ns at which a flow in `watch` completes.

        Every event of that ns is run and now() is that ns (the exact co-simulation stepping of
        `phantora.netsim.base.step_watching`, done inside ns-3: the completion stops the simulator), but none
        after a completion that leaves no flow in flight: `drain` stops there. `until` >= 2^62 means no limit:
        then it also returns once nothing is in flight. `earliest` (no watched flow completes before it) is
        accepted for the stepping interface and not needed.
        """
        unbounded = until >= _FOREVER_NS
        if not watch:
            return [] if unbounded else self.advance(until)
        now = self.now()
        if not unbounded and until < now:
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {now} ns")
        if self.heartbeat is not None:  # completion by completion, as the call stops at the first watched or idle
            got: list[Completion] = []

            def step(t: int) -> bool:
                part = self._to_completion(t)
                got.extend(part)
                return any(c.flow_id in watch for c in part) or (unbounded and self.in_flight() == 0)

            if self.heartbeat.run(self.now, step, until, lambda: unbounded and self._stalled()) or not unbounded:
                return got
            return got + self._run_watched(until, watch)
        return self._run_watched(until, watch)

    def _run_watched(self, until: int, watch: Collection[int]) -> list[Completion]:
        ids = self._vec()
        for fid in watch:
            if 0 <= fid <= _MASK64:
                ids.push_back(fid)
        self._ran(self._net.RunUntilWatched(-1 if until >= _FOREVER_NS else until, ids))
        return self._take()

    def advance_to_completion(self, until: int) -> list[Completion]:
        """`advance(until)`, but return right after the first ns at which any flow completes (every event of
        that ns run but those after a completion that leaves no flow in flight, as `advance_watching`; now() that
        ns): how a caller that keeps dependencies of its own steps this engine. With no limit (`until` >= 2^62) it
        also returns once nothing is in flight."""
        now = self.now()
        if until < now:
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {now} ns")
        if self.heartbeat is not None:
            got: list[Completion] = []

            def step(t: int) -> bool:
                got.extend(self._to_completion(t))
                return bool(got)

            if self.heartbeat.run(self.now, step, until, lambda: until >= _FOREVER_NS and self._stalled()):
                return got
            if self.now() >= until:
                return []
        return self._to_completion(until)

    def _to_completion(self, until: int) -> list[Completion]:
        ns = -1 if until >= _FOREVER_NS else until
        if not self._step_packed:
            self._ran(self._net.RunUntilCompletion(ns))
            return self._take()
        words = memoryview(bytes(self._net.StepToCompletion(ns))).cast("Q")
        self._ran(None, int(words[0]) if self._interruptible else 0)
        return unpack_step(words, self._tags)

    def _ran(self, result: Any, sig: int | None = None) -> Any:
        """A run call's result, unless SIGTERM or SIGINT cut the call short (`sig`, else read back): then Python's
        own handler of the signal runs now (the CLI's `Terminated`, KeyboardInterrupt); one that does not raise
        gets `SimulationInterruptedError` here (KeyboardInterrupt for SIGINT), so a cut call never passes for done."""
        if self.config.queue_sample_ns > 0:
            self._spool_samples()
        if not self._keep_fct:
            self._net.DrainFct()
        if sig is None:
            sig = int(self._net.InterruptedBy()) if self._interruptible else 0
        if not sig:
            return result
        # The interpreter may not have noticed the pending signal yet (it looks between some bytecodes only).
        ctypes.pythonapi.PyErr_CheckSignals()
        if sig == signal.SIGINT:
            raise KeyboardInterrupt
        raise SimulationInterruptedError(f"the ns-3 run was interrupted by {signal.Signals(sig).name}")

    def next_event_time(self) -> int | None:
        """The next pending ns-3 event, or None when no flow is in flight."""
        if self.in_flight() == 0:
            return None
        t = int(self._net.NextEventTime())
        return None if t < 0 else t

    def now(self) -> int:
        return int(self._net.Now())

    def quiet(self) -> bool:
        """Nothing in flight and nothing live scheduled: no ACK, PFC frame, timer or queue sample pending
        (cancelled timers, which would do nothing when reached, do not count)."""
        if self.in_flight():
            return False
        t = int(self._net.NextLiveEventTime())
        return t < 0 or t >= _FOREVER_NS  # at most the far-future stop of an unbounded run left

    def in_flight(self) -> int:
        return int(self._net.InFlight())

    def event_count(self) -> int:
        """ns-3's events so far: `stats()["events"]` without the rest (a heartbeat's report reads it)."""
        return next(int(p.second) for p in self._net.Stats() if p.first in (b"events", "events"))

    @property
    def beatable(self) -> bool:
        """Whether a heartbeat may cut its run calls into chunks: not while a call script records every run call
        (ns3-calls.txt would hold the chunks' calls)."""
        return not isinstance(self._net, RecordedNetwork)

    def _stalled(self) -> bool:
        """Nothing in flight, or nothing live left to run (flows that can never start): a heartbeat's chunks stop
        and the whole run call decides (`phantora.netsim.heartbeat`)."""
        return self.in_flight() == 0 or int(self._net.NextLiveEventTime()) < 0

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        """Run until nothing is in flight; now() ends at the last completion."""
        limit = _FOREVER_NS if limit_ns is None else limit_ns
        if self.heartbeat is not None and self.in_flight():  # bounded RunUntilIdle calls: the same stops
            if self.heartbeat.run(self.now, lambda t: bool(self._ran(self._net.RunUntilIdle(t))), limit, self._stalled):
                return self._take()
        if self.in_flight() and not self._ran(self._net.RunUntilIdle(max(limit, self.now()))):
            left = self.in_flight()
            if self.now() >= limit:
                raise PhantoraError(f"the network did not drain by {limit} ns: {left} flows still in flight")
            raise PhantoraError(f"{left} flows can never start: they wait on flows that never complete")
        return self._take()

    def stats(self) -> dict[str, object]:
        raw = []
        for pair in self._net.Stats():
            key = pair.first
            raw.append((key.decode() if isinstance(key, bytes) else str(key), float(pair.second)))
        return packet_stats(raw, self.drops(), self.trims(), self.config, self.topology, self._channel_rows())

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
        return bool(self._ran(self._net.RunUntilQuiet(limit)))

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
        return pfc_txt_lines(self.pfc_events())

    def queue_samples(self) -> Sequence[QueueSample]:
        """Every queue sample so far, in time order: a sequence read back from disk (`QueueSpool`), not a list."""
        self._spool_samples()
        return self._queues

    def _spool_samples(self) -> None:
        """Move ns-3's queue samples so far to the spool (its vector then holds one run call's at most)."""
        rows = self._net.DrainQueueSamples()
        if rows.size():
            self._queues.extend((int(r.timeNs), int(r.node), int(r.port), int(r.prio), int(r.bytes)) for r in rows)

    def drops(self) -> list[Drop]:
        for r in self._net.DrainDrops():
            self._drops.append(Drop(int(r.timeNs), int(r.node), int(r.port), int(r.prio), int(r.flowId), int(r.seq)))
        return list(self._drops)

    def trims(self) -> list[Trim]:
        """Every loss-tolerant packet trimmed to its header so far (DLCP; empty with `trace_drops` off)."""
        for r in self._net.DrainTrims():
            self._trims.append(
                Trim(int(r.timeNs), int(r.node), int(r.port), int(r.prio), int(r.flowId), int(r.seq), int(r.payload))
            )
        return list(self._trims)

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

    def new_records(self) -> FabricRecords:
        """The fabric's records (PFC, queue samples, drops, CNPs, CE marks) since the last call, in time order."""
        self.pfc_events(), self.queue_samples(), self.drops(), self.cnp_events(), self.ecn_mark_events()
        seen = self._seen
        out = FabricRecords(
            self._pfc[seen[0] :], self._queues[seen[1] :], self._drops[seen[2] :], self._cnps[seen[3] :],
            self._marks[seen[4] :],
        )  # fmt: skip
        self._seen = (len(self._pfc), len(self._queues), len(self._drops), len(self._cnps), len(self._marks))
        return out

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
        return channel_usage(self._channel_rows(), self.now() if elapsed_ns is None else elapsed_ns)

    def effective(self) -> EffectiveSettings:
        """What the fabric runs by, read back from ns-3 once (`PhantoraNetwork::EffectiveParams`)."""
        if self._effective is None:
            self._effective = EffectiveSettings.parse(self.config, self.effective_pairs())
        return self._effective

    def route(self, src: int, dst: int, flow_key: int = 0, via_nic: bool = False) -> list[int]:
        """Channel ids the switches' own tables and hash give a flow (to compare with Topology.route)."""
        return [int(c) for c in self._net.Route(src, dst, ecmp_input(flow_key, via_nic) & _MASK64, via_nic)]

    def base_rtt_ns(self, src: int, dst: int, flow_key: int = 0, via_nic: bool = False) -> int:
        """2 x propagation + one payload's serialisation per hop, as HPCC's base RTT."""
        return int(self._net.BaseRttNs(src, dst, ecmp_input(flow_key, via_nic) & _MASK64, via_nic))

    def completion_bounds(self) -> dict[int, int]:
        """Flow id -> the earliest ns it can still complete at its receiver, for every flow started in ns-3 and not
        yet complete there (`PhantoraNetwork::CompletionBounds`: its bytes not yet sent once at its NIC's line rate,
        plus the least propagation to its receiver)."""
        bounds = self._net.CompletionBounds()
        rows = _rows(bounds, _dtype("FlowBound"))
        if rows is None:
            return {int(b.id): int(b.ns) for b in bounds}
        return dict(zip(rows["id"].tolist(), rows["ns"].tolist(), strict=True))

    def completion_bound_columns(self) -> tuple[np.ndarray, np.ndarray]:
        """`completion_bounds` as two int64 columns, ids and ns, in ns-3's order (copies; no dict made). For a
        decomposition's DAG ids (dense from 0): an id of 2^63 or more would wrap, where `completion_bounds` keeps it."""
        import numpy as np

        bounds = self._net.CompletionBounds()
        rows = _rows(bounds, _dtype("FlowBound"))
        if rows is None:
            return np.array([int(b.id) for b in bounds], np.int64), np.array([int(b.ns) for b in bounds], np.int64)
        return rows["id"].astype(np.int64), rows["ns"].astype(np.int64)

    def flow_rate_bps(self, flow_id: int) -> int:
        """Current pacing rate of an open flow (0 if not sending)."""
        return int(self._net.FlowRateBps(flow_id))

    # ----- a partition worker's windows (issue 38, bridge.cut_worker) --------------------------------
    def cut_stats(self) -> list[int]:
        """`PhantoraNetwork::CutStats()`: cut cables, the lookahead (ns), then the messages' counters."""
        return [int(x) for x in self._net.CutStats()]

    def run_cut_windows(
        self,
        peers: Peers,
        until: int | None,
        stats: WindowStats,
        reacting: Sequence[int] | None = None,
        finish: bool = False,
    ) -> int | None:
        """This partition worker's part of one engine's run to `until` (None: until nothing is left anywhere; with
        `finish`, None or not: no further than the last completion's event, as one engine's drain), in barrier windows
        with the other workers (`phantora.netsim.cut_windows.run_windows`); the lookahead is the least cut-cable latency
        (no cable cut: one window). `reacting` (stepped workers), flat [flow id, reaction ns, ...]: the run stops at the
        first such flow's end + its reaction, which is returned (None: not)."""
        group, groups = self._cut_group()
        cables, lookahead = self.cut_stats()[:2]
        if reacting is not None:
            self._net.CutReacting(list(reacting))
        return run_windows(self._net, peers, group=group, groups=groups, lookahead_ns=lookahead if cables else NEVER,
                           until=until, stats=stats, sampling=self.config.queue_sample_ns > 0,
                           reacting=reacting is not None, finish=finish)  # fmt: skip

    def cut_warm_up(self, peers: Peers | None = None) -> None:
        """Call each window method once, doing nothing, so that cppyy's first-call cost is not in the figures of
        `run_cut_windows`, and the C++ loop's (`cut_native`; with `peers` that run it, with their own sockets),
        and the calls a stepped worker's round makes around it."""
        from phantora.netsim import cut_native

        cut_native.warm_up(self._net)
        warm_up(self._net, *self._cut_group())
        self.cut_stats()
        self.quiet()
        self.in_flight()
        self._net.LastSendEndBound()  # (cut_round.last_send_end, at each round's end)
        native = getattr(peers, "warm_up_native", None)
        if native is not None:
            native(self._net)

    def _cut_group(self) -> tuple[int, int]:
        group, groups = self.config.partition_worker, self.config.partition
        if group < 0:
            raise PhantoraError("this engine is not a partition worker (partition_worker < 0): no windows to run")
        return group, groups

    def record_keys(self, kind: str) -> list[RecordKey]:
        """A partition worker's order key of the event that made each record of `kind` ("fct", "pfc", "drops",
        "trims", "cnps", "ecn") since the last call, in the records' order (`PhantoraNetwork::DrainRecordKeys`);
        empty in any other engine."""
        flat = [int(x) for x in self._net.DrainRecordKeys(kind)]
        return [(flat[i], flat[i + 1], flat[i + 2], flat[i + 3]) for i in range(0, len(flat), 4)]

    def channel_rows(self) -> list[ChannelRow]:
        """The fabric's per-channel counters (`packet_summary.ChannelRow`)."""
        return self._channel_rows()

    def cut_transport_tail(self) -> list[int]:
        """A partition worker's `PhantoraNetwork::CutTransportTail`, flat: what the transport record of a flow whose
        sender's last ACK comes after the run's stop needs (`bridge.cut_pool.merged_transport`); empty elsewhere."""
        return [int(x) for x in self._net.CutTransportTail()]

    def take_completions(self) -> list[Completion]:
        """The completions since the last call (what `advance` returns), for a caller that runs the windows."""
        return self._take()

    def effective_pairs(self) -> list[tuple[str, str]]:
        """`PhantoraNetwork::EffectiveParams()` as (key, text) pairs (`EffectiveSettings.parse` reads them)."""
        return [(_text(p.first), _text(p.second)) for p in self._net.EffectiveParams()]

    # ----- internals ---------------------------------------------------------------------------
    def _channel_rows(self) -> list[ChannelRow]:
        """The fabric's ChannelStats() as plain tuples (`packet_summary.ChannelRow`)."""
        return [
            (
                int(r.channel), int(r.src), int(r.dst), int(r.bps), int(r.txBytes), int(r.txPackets), int(r.pausedNs),
                int(r.ecnMarks), int(r.maxQueueBytes),
            )
            for r in self._net.ChannelStats()
        ]  # fmt: skip

    def _take(self) -> list[Completion]:
        out = []
        tags = self._tags
        records = self._net.DrainCompletions()
        lost: dict[int, list[tuple[int, int]]] = {}
        for loss in self._net.DrainLosses():  # drained after the completions: a record's losses are all here
            lost.setdefault(int(loss.flowId), []).append((int(loss.offset), int(loss.bytes)))
        rows = _rows(records, _dtype("FlowRecord")) if len(records) >= _ROWS_MIN else None
        if rows is None:
            for r in records:
                fid = int(r.id)
                holes = tuple(lost.get(fid, ()))
                out.append(
                    completion(
                        fid, int(r.startNs), int(r.endNs), int(r.size), int(r.src), int(r.dst), tags.pop(fid, ""), holes
                    )
                )
            return out
        cols = [rows[name].tolist() for name in ("id", "start", "end", "size", "src", "dst")]
        for fid, start, end, size, src, dst in zip(*cols, strict=True):
            out.append(completion(fid, start, end, size, src, dst, tags.pop(fid, ""), tuple(lost.get(fid, ()))))
        return out

    def _check_batch(self, flows: Sequence[Flow]) -> None:
        check_packet_batch(flows, self.topology, self._known.__contains__)


def ns3_key(f: Flow) -> int:
    """The 64-bit ECMP key word the ns-3 model takes for a flow (`AddFlow`) and its packet headers carry to the
    switches' hash: its key (else its id), with `NIC_HASH_BIT` for a flow through the NICs (`topology.ecmp.ecmp_input`,
    so both engines hash it alike). Only hashed: the route through the NICs is AddFlow's own `viaNic` argument
    (`Flow.via_nic`), so a queue pair index of 64 or more in the key's bits 56-62 moves no flow off its NVSwitch."""
    return ecmp_input(f.id if f.key is None else f.key, f.via_nic) & _MASK64


def _set_extras(net: Any, f: Flow, per_connection: bool) -> None:
    """A just-added flow's optional settings on ns-3's side: loss budget, rate cap, connection and queue."""
    if f.loss_budget:
        net.SetLossBudget(f.id, f.loss_budget)
    if f.rate_bps:
        net.SetMaxRate(f.id, f.rate_bps)
    if f.conn and per_connection:
        net.SetConnection(f.id, f.conn)
    if f.queue:
        net.SetQueue(f.id, f.queue)


def unpack_step(words: memoryview, tags: dict[int, str]) -> list[Completion]:
    """The completions of `PhantoraNetwork::StepToCompletion`'s words (its signal, the two counts, 6 words a
    completion, 3 a loss), in their order, each with its tag popped from `tags` and its lost ranges as drained."""
    n_done, n_lost = words[1], words[2]
    at = 3 + 6 * n_done
    if len(words) != at + 3 * n_lost:
        raise PhantoraError(f"StepToCompletion: {len(words)} words for counts {n_done}/{n_lost}")
    lost: dict[int, list[tuple[int, int]]] = {}
    for i in range(at, len(words), 3):
        lost.setdefault(words[i], []).append((words[i + 1], words[i + 2]))
    if not n_done:
        return []
    flat = words[3:at].tolist()
    it = iter(flat)
    if lost:
        return [
            completion(fid, _signed(start), _signed(end), size, src, dst, tags.pop(fid, ""), tuple(lost.get(fid, ())))
            for fid, src, dst, size, start, end in zip(it, it, it, it, it, it, strict=True)
        ]
    if tags:
        return [
            completion(fid, _signed(start), _signed(end), size, src, dst, tags.pop(fid, ""), ())
            for fid, src, dst, size, start, end in zip(it, it, it, it, it, it, strict=True)
        ]
    return [
        completion(fid, _signed(start), _signed(end), size, src, dst, "", ())
        for fid, src, dst, size, start, end in zip(it, it, it, it, it, it, strict=True)
    ]


def _signed(ns: int) -> int:
    """An int64 read as an unsigned word, back to its sign (a time: never negative in practice)."""
    return ns - (1 << 64) if ns >> 63 else ns


def _rows(vec: Any, dtype: np.dtype) -> np.ndarray | None:
    """A cppyy std::vector of plain structs as numpy rows of `dtype`, read in place (convert them before `vec` goes);
    None when it is empty or its struct is not laid out as `dtype` says (then read it element by element). The
    layout is checked once per struct: its size, and its first element read both ways."""
    n = len(vec)
    if not n:
        return None
    first = vec[0]
    name = type(first).__name__
    ok = _LAYOUT.get(name)
    if ok is False:
        return None
    import cppyy
    import numpy as np

    if ok is None and cppyy.sizeof(first) != dtype.itemsize:
        _LAYOUT[name] = False
        return None
    buf = (ctypes.c_char * (n * dtype.itemsize)).from_address(cppyy.addressof(vec.data()))
    rows = np.frombuffer(memoryview(buf), dtype=dtype)
    if ok is None:
        row = rows[0]
        _LAYOUT[name] = ok = all(
            int(row[field]) == int(getattr(first, attr))
            for field, attr in zip(dtype.names or (), _ATTRS[name], strict=True)
        )
        if not ok:
            return None
    return rows


_ATTRS = {"FlowBound": ("id", "ns"), "FlowRecord": ("id", "src", "dst", "size", "startNs", "endNs")}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def check_packet_batch(flows: Sequence[Flow], topology: Topology, known: Callable[[int], bool]) -> set[int]:
    """`check_flow_batch`, plus what the C++ fabric needs: 64-bit ids, a data priority class 1..7, a loss
    budget within the flow and a 64-bit rate cap."""
    check_packet_fields(flows)
    return check_flow_batch(flows, topology, known)


def check_packet_fields(flows: Sequence[Flow]) -> None:
    """What the C++ fabric needs of each flow: 64-bit ids, a data priority class 1..7, a loss budget within it, a
    rate cap (bits/s) in [0, 2^64)."""
    for f in flows:
        if not 0 <= f.id <= _MASK64:
            raise InputError(f"flow {f.id}: ids must be in [0, 2^64)", field="id")
        if not 1 <= f.priority <= 7:
            raise InputError(f"flow {f.id}: priority must be 1..7 (0 is the control class)", field="priority")
        if not 0 <= f.loss_budget <= max(f.size, 0):
            raise InputError(f"flow {f.id}: loss_budget must be in [0, size], got {f.loss_budget}", field="loss_budget")
        if not 0 <= f.rate_bps <= _MASK64:
            raise InputError(
                f"flow {f.id}: rate_bps must be in [0, 2^64) (0 = no cap), got {f.rate_bps}", field="rate_bps"
            )
