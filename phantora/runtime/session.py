"""The per-rank simulation state: virtual clock, bridge client, in-flight collectives, records.

One `RankSession` lives in each rank process (`current()`). The backend issues collectives through
it, the dispatch mode charges compute ops to it, and `finish()` hands the rank's results to the
coordinator. A collective in flight is a `Pending`: its bridge handles (the simulated timing), the
inner gloo work (the real data) and the storages it reads or writes. Any compute op that touches
one of those storages first joins the collective, as a CUDA stream wait would.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import resource
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from phantora.collectives.flow_tags import call_name, collective_tag, group_tag
from phantora.collectives.nccl.host_launch import HOST_LAUNCH_US
from phantora.collectives.slot_window import Slots, SlotWindow
from phantora.collectives.spec import HOST_ALGO
from phantora.errors import PhantoraError
from phantora.procmem import proportional_set_mb
from phantora.results.run_dir import RunDir
from phantora.runtime import data_shapes, flex_chunks, nccl_launch, program_env
from phantora.runtime.any_source import AnyRecvs
from phantora.runtime.clock import VirtualClock
from phantora.runtime.compute import ROOFLINE_FALLBACK, OpCost, Roofline
from phantora.runtime.memory import MemoryTracker
from phantora.runtime.program_env import NcclEnv
from phantora.runtime.send_copies import SendCopies
from phantora.runtime.simcuda import cuda_only, kept_values, simapex, simflash
from phantora.runtime.stream_deps import COMPUTE_STREAM, StreamDeps
from phantora.runtime.timepatch import REAL_PERF_COUNTER_NS
from phantora.runtime.trace import TraceRecorder
from phantora.runtime.traffic import TrafficMarker, zero_ranges
from phantora.units import plural

if TYPE_CHECKING:
    from phantora.runtime.hostwork import HostCopy, HostModel
    from phantora.runtime.rank_scenario import RankScenario

BARRIER_BYTES = 4  # the float ProcessGroupNCCL::barrier all-reduces (at::zeros({1}), kFloat)
SYNC_WIRE = ("all_reduce", 0, "uint8")  # a plain gloo group's call: no network bytes, done at the latest member's issue

# A compute op reads the real clock (for the clock report) once in this many ops: at about 10 us an op, well
# inside the report's 200 us period, and a clock read fewer on the other ops.
REPORT_CHECK_OPS = 8
NCCL_LAUNCH = "nccl:host_launch"  # the trace's name of the host's launch of an NCCL call (nccl_launch.py)
HOST_WORK = "host:"  # the trace's name prefix of the GPU's idle wait for a host op (runtime/hostwork.py)


def _default_stream_id() -> int:
    """The calling thread's current CUDA stream id while no thread has set a stream: the default stream's, 0."""
    return 0


# The calling thread's current stream id; simcuda/streams.py, a layer above, installs its own at its first set_stream.
current_stream_id: Callable[[], int] = _default_stream_id


class StorageLike(Protocol):
    """The storage a checkpoint file goes through (`runtime.storage.StorageModel`, which calls the session)."""

    @property
    def host_bps(self) -> float: ...

    @property
    def shared_bps(self) -> float | None: ...

    def lone_ns(self, nbytes: int) -> int: ...


class ClientLike(Protocol):
    """The rank-side bridge API (`bridge.client.RankClient`)."""

    def collective(
        self,
        *,
        group: Sequence[int],
        seq: int,
        kind: str,
        nbytes: int,
        dtype: str,
        root: int | None,
        t_issue_ns: int,
        name: str = "",
        algo: dict[str, Any] | None = None,
        stream: int | None = None,
        launch: int | None = None,
        after: Sequence[int] = (),
        redop: str = "sum",
        pg: int = 0,
    ) -> int: ...

    def lost(self, handle: int) -> list[tuple[int, int]]: ...

    def p2p(
        self,
        *,
        peer: int,
        is_send: bool,
        tag: int,
        seq: int,
        nbytes: int,
        t_issue_ns: int,
        name: str = "",
        algo: dict[str, Any] | None = None,
        stream: int | None = None,
        launch: int | None = None,
        after: Sequence[int] = (),
        handoff: int | None = None,
        gate: Sequence[int] = (),
        pg: int = 0,
    ) -> int: ...

    def wait(self, handle: int, deadline: float | None = None) -> int: ...

    def test(self, handle: int, t_now_ns: int) -> int | None: ...

    def advance_clock(self, t_ns: int) -> None: ...

    def finish(self, t_ns: int, results: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Transfer:
    """One point-to-point message of a collective that phantora expresses as transfers."""

    peer: int  # global rank
    is_send: bool
    nbytes: int


@dataclass(eq=False)
class Pending:
    """A collective (or send/recv) issued but not yet joined."""

    id: int
    name: str
    kind: str
    nbytes: int
    t_issue: int
    handles: list[int]
    inner: list[Any]  # gloo works that move the real data
    keys: tuple[int, ...]  # storages it reads or writes
    finalize: Callable[[], None] | None = None
    group: tuple[int, ...] = ()
    t_done: int | None = None
    tensors: list[torch.Tensor] = field(default_factory=list)  # kept alive so their memory is not reused
    t_handoff: int | None = None  # a send within its connection's buffer: when its kernel ends (its streams see)
    handoff_ns: int | None = None  # such a send's kernel time, from its start on its stream to its hand-off
    handoff_after: list[Pending] = field(default_factory=list)  # what its kernel's start waits for (`handoff_at`)
    handoff_gate: list[Pending] = field(default_factory=list)  # earlier sends whose flows it waits for (slot_window)
    handoff_back: int = 0  # ns after those flows' ends that their slots are its (`Slots.back_ns`)
    reads_user: bool = False  # a handed-off send whose data moves from its caller's tensors: taken before its join
    stream: int | None = None  # the NCCL stream it runs on: its communicator (ProcessGroupNCCL's, one stream each)
    host_ns: int = 0  # a plain gloo group's host cost, added to its end (runtime/gloo_cost.py; opt-in)
    launched_h: int = 0  # the host time of its launch, on its thread's host clock (a thread's synchronise: lane_marks)


@dataclass
class CommStats:
    count: int = 0
    nbytes: int = 0
    busy_ns: int = 0  # sum over calls of (completion - issue)


def storage_key(t: torch.Tensor) -> int | None:
    """A key for the memory a tensor lives in (shared by its views), or None if it has none."""
    try:
        st = t.untyped_storage()
        if not st.nbytes():
            return None
        return st.data_ptr() or st._cdata  # meta storages (phantom mode) have no address: use the StorageImpl
    except (RuntimeError, NotImplementedError):  # no storage, or an invalid one (a functional wrapper's)
        return None


@dataclass(frozen=True, slots=True)
class Issued:
    """One call of the rank to the bridge: a collective, or one side of a transfer (`peer` set)."""

    handle: int  # the bridge's handle for the call
    kind: str  # the collective kind, or "send" / "recv"
    seq: int
    nbytes: int
    t_issue_ns: int
    group: tuple[int, ...] = ()
    dtype: str = ""
    root: int | None = None  # global rank
    peer: int | None = None
    tag: int = 0
    stream: int | None = None  # the NCCL stream it runs on (bridge/stream_order.py), None: no stream order
    launch: int | None = None  # the NCCL group launch it is part of
    after: tuple[int, ...] = ()  # handles of the rank's calls its CUDA stream waited for (stream_deps)
    redop: str = "sum"  # the reduction of an all-reduce, reduce-scatter or reduce (Collective.redop)
    handoff: int | None = None  # a lone send within its connection's buffer: its kernel's ns (collectives/handoff.py)
    conn: int | None = None  # such a send's communicator (the NCCL stream it would run on): its connection's window
    comm: tuple[int, ...] = ()  # that communicator's global ranks when it is not the pair's own (eager init)
    nccl_env: NcclEnv | None = None  # the NCCL_* its communicator was created with, where the program set its own
    # a transfer of an NCCL group (a batch, a coalescing block, a pairwise collective's): the communicator's ranks
    launch_comm: tuple[int, ...] = ()
    released_ns: int | None = None  # window mode: the network's ns the rank was last released at (RankClient)
    pg: int = 0  # which process group over its ranks (a transfer: holding both ends) it runs on (RankSession.comm_of)
    group_sizes: tuple[int, ...] = ()  # a coalesced call's calls' bytes (Collective.group_sizes)
    group_dtypes: tuple[str, ...] = ()  # their dtypes, where they differ (Collective.group_dtypes)
    # their kinds, reductions and roots (global ranks), where they differ (Collective.group_kinds, ...)
    group_kinds: tuple[str, ...] = ()
    group_redops: tuple[str, ...] = ()
    group_roots: tuple[int | None, ...] = ()
    host: bool = False  # a plain gloo group's call (backend.py `gloo_sync`): no NCCL kernel, no cost (Coll/P2P.host)


class SessionListener(Protocol):
    """Told, in order, of what moves a rank's time, as an ns-3 trace source tells its sinks.

    `RankSession.add_listener` connects one (the execution-graph recorder of phantora.egraph.live does).
    Waits come with the bridge handles joined. A lone send joined at its hand-off (`Pending.t_handoff`) comes to the
    listener's `on_handoff(handles, t_handoff_ns)` where it has one (else to `on_wait`); its later join at a
    synchronise, to `on_wait`.
    """

    def on_compute(self, name: str, start_ns: int, duration_ns: int) -> None: ...

    def on_issue(self, call: Issued) -> None: ...

    def on_wait(self, handles: Sequence[int], t_done_ns: int) -> None: ...

    def on_step(self, index: int, end_ns: int) -> None: ...

    def on_finish(self, end_ns: int) -> None: ...


class StepLimitReached(SystemExit):
    """The job's step count is reached: the script ends here, as if it had exited (code 0)."""

    def __init__(self, text: str) -> None:
        super().__init__(0)
        self.text = text


class RankSession:
    """Everything one rank knows about its simulated run."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        client: ClientLike,
        model: Roofline,
        *,
        trace_level: str = "ops",
        trace_steps: int = 0,
        out_dir: str | Path | None = None,
        network: str = "",
        report_every_us: float = 200.0,
        phantom: bool = False,
        start_ns: int = 0,
        max_steps: int | None = None,
        scenario: RankScenario | None = None,
    ) -> None:
        self.rank = rank
        self.scenario = scenario  # slow-GPU windows and step reports of a scenario (runtime/rank_scenario.py)
        self.nccl_env_at_start = program_env.at_start()  # the run's NCCL_* variables, before the program runs
        self.world_size = world_size
        self.client = client
        self.model = model
        self.network = network
        self.phantom = phantom  # tensors are meta: collectives move no data (phantom_mode.py)
        self.start_ns = start_ns  # the clock starts here (a job starting later in a run of several jobs)
        self.max_steps = max_steps  # the script ends after this many steps (StepLimitReached)
        self.clock = VirtualClock(compute_ns=start_ns, comm_ns=start_ns)
        self.trace = TraceRecorder(rank, trace_level)
        self._trace_ops = self.trace.op if trace_level != "none" else None  # an op's event, unless no trace
        self.trace_steps = trace_steps  # ops traced for this many steps, then steps and collectives only (0: all)
        self.out_dir = Path(out_dir) if out_dir else None
        self.pending: dict[int, Pending] = {}
        self.thread = threading.get_ident()  # the program's thread: it alone talks to the coordinator
        self.streams: StreamDeps[Pending] = StreamDeps()  # what each simulated CUDA stream's next collective follows
        self.by_storage: dict[int, set[int]] = {}
        self.aborted: dict[int, str] = {}  # NCCL stream (a communicator) -> why it was aborted (`abort`)
        self.abandoned: list[Pending] = []  # calls of aborted communicators, never joined (`abort`)
        self._ids = itertools.count(1)
        self._seq: dict[tuple[tuple[int, ...], int], int] = {}  # (group, pg) -> its next collective's seq
        self._p2p_seq: dict[tuple[int, int, bool, int], int] = {}  # (peer, tag, is_send, pg) -> its next seq
        self.comms: list[tuple[int, ...]] = []  # the global ranks of each process group made here, in creation order
        self._windows: dict[tuple[int | None, int], SlotWindow[int]] = {}  # (communicator, peer) -> its connection's
        # handed-off sends (by Pending id)
        self._handed: dict[int, Pending] = {}  # window key -> a send in a window
        self._nccl_tails: dict[int, tuple[int | None, list[Pending]]] = {}  # NCCL stream -> its last launch's calls
        self._window_ids = itertools.count()
        self.handoff_copies = 0  # real data: lone sends handed off before their receive was issued, copied at issue
        self.handoff_copy_bytes = 0  # ... and their bytes in all (`send_copies` frees each once its receive took it)
        self.send_copies = SendCopies()
        self.any_recvs = AnyRecvs(self)  # receives from any source (gloo's recvAnysource; runtime/any_source.py)
        self._launches = itertools.count(1)  # the group launches of transfers' collectives (negative ids: own space)
        self._internal = 0
        self.ops = 0
        self.flops_by_dtype: dict[str, int] = {}
        self.untimed: dict[str, dict[str, Any]] = {}  # kernels the compute model cannot time: count, how charged
        self.tier_ns: dict[str, int] = {}  # kernel time (launch overhead not included) by the tier that timed it
        self._launch_ns = int(getattr(model, "launch_ns", 0))
        self._nccl_launch_ns = nccl_launch.launch_ns()  # the host's launch of an NCCL call (0 if opted out)
        self._nccl_charged: int | None = None  # the group launch last charged it (its later calls are not)
        self._group_ops: dict[int, list[tuple[int, int, bool]]] = {}  # a group launch's p2p (peer, bytes, send)
        self.host_ns = start_ns  # the host's clock as its NCCL launches see it (`_nccl_launch`)
        # the host clocks of the threads the program started, while any lives (host_clocks.py): the program's thread
        # waits where its host clock moves on until they have caught up
        self.host_clocks: Any = None
        # the latest stamp a thread's collective was issued at: the program's later ones are no earlier (a rank's
        # stamps never go back, bridge/client.py)
        self._stamp_floor = 0
        self.nccl_launches = 0  # the host launches charged so far ...
        self.nccl_launch_total_ns = 0  # ... their host time ...
        self.nccl_launch_idle_ns = 0  # ... and the compute lane's idle time waiting for them (the exposed part)
        self.host: HostModel | None = None  # the target host, which times host ops and copies (runtime/hostwork.py)
        self.host_ops = 0  # host ops charged so far ...
        self.host_work_ns = 0  # ... their host time ...
        self.host_idle_ns = 0  # ... and the compute lane's idle time waiting for them
        self.pcie: dict[str, list[int]] = {}  # "h2d" | "d2h" -> [copies, bytes, ns] over the GPU's PCIe link
        self.comm: dict[str, CommStats] = {}
        self.step_ends: list[int] = []
        self.step_flops: list[int] = []  # counted FLOPs so far, at each step end
        self.step_busy: list[int] = []  # compute-lane busy time so far, at each step end
        self.step_storage: list[int] = []  # checkpoint I/O time so far, at each step end (runtime/storage.py)
        self.workload: dict[str, Any] = {}
        self.finished = False
        self.memory = MemoryTracker.from_env(getattr(model, "gpu", ""), rank)  # simulated device memory
        # Compute ops report the clock to the bridge at most every `report_every_us` of real time:
        # a report only lets other ranks' network time move on sooner; every issue, wait and step
        # reports anyway, so simulated results do not depend on it.
        self.report_every_ns = int(report_every_us * 1000)
        self._last_report = 0
        self._report_in = 1  # compute ops until the real clock is read again (1: at the next)
        self.listeners: list[SessionListener] = []
        self._steps_file: Any = None  # out_dir/steps/rank<R>.jsonl, opened at the first step
        self._comm_at_step: dict[str, int] = {}
        self._wait_at_step = 0
        self.traffic = TrafficMarker.from_env()  # class and loss tolerance of each collective (issue 17)
        self._lost_at_step = 0
        self._lossy: set[int] = set()  # handles of loss-tolerant collectives not yet completed
        # checkpoint files read and written (runtime/storage.py): {"write"|"read": [bytes, ns]}
        self.storage: dict[str, list[int]] = {}
        self._storage_at_step = (0, 0)  # (bytes, ns) at the last step end

    def add_listener(self, listener: SessionListener) -> None:
        """Tell `listener` of every compute op, issue, wait, step and the finish from now on."""
        self.listeners.append(listener)

    # ----- compute ---------------------------------------------------------------------------------
    @property
    def internal_active(self) -> bool:
        return self._internal > 0

    @contextlib.contextmanager
    def internal(self) -> Iterator[None]:
        """Ops run inside are phantora's own bookkeeping: neither charged nor joined."""
        self._internal += 1
        try:
            yield
        finally:
            self._internal -= 1

    def charge(self, name: str, cost: OpCost) -> None:
        """Run one compute op on the compute lane. (Every op of the simulated GPU comes here: few steps.)"""
        self.ops += 1
        flops = cost.flops
        if flops:
            by_dtype = self.flops_by_dtype
            by_dtype[cost.dtype] = by_dtype.get(cost.dtype, 0) + flops
        ns = cost.ns
        if not ns:
            return
        kernel = ns - self._launch_ns
        if kernel > 0:
            tiers = self.tier_ns
            tiers[cost.tier] = tiers.get(cost.tier, 0) + kernel
        clock = self.clock
        if self.scenario is not None:
            ns = self.scenario.stretch(clock.compute_ns, ns)
        if type(ns) is int and ns > 0:  # `clock.charge(ns)`, inline
            start = clock.compute_ns
            clock.compute_ns = end = start + ns
            clock.compute_busy_ns += ns
        else:
            start, end = clock.charge(ns)
        if self._trace_ops is not None:
            self._trace_ops(name, start, end)
        if self.listeners:
            for listener in self.listeners:
                listener.on_compute(name, start, end - start)
        self._report_in -= 1
        if not self._report_in:  # the real clock is read every REPORT_CHECK_OPS ops, not on every op
            self._report_check(end)

    def _report_check(self, end: int) -> None:
        """Every REPORT_CHECK_OPS compute ops (`charge`, and its compiled copy in simcuda/_fastop.c): report the
        clock (`end`, the last op's end) to the bridge if `report_every_ns` of real time passed since the last."""
        self._report_in = REPORT_CHECK_OPS if self.report_every_ns else 1
        wall = REAL_PERF_COUNTER_NS()
        if wall - self._last_report >= self.report_every_ns:
            self._last_report = wall
            self.client.advance_clock(end)

    def charge_on(self, stream: int, floor_ns: int, name: str, cost: OpCost) -> bool:
        """Run one compute op of a thread other than the program's (dispatch.py) on the lane of its current
        `stream`: the compute lane for the default stream (0), in turn with the program's ops, else that stream's
        side lane (clock.py), not before `floor_ns` (the thread's host time at its launch, host_clocks.py). It
        reports no clock to the bridge: only the program's thread talks to the coordinator. Whether it ran a kernel
        (a time to charge)."""
        self.ops += 1
        if cost.flops:
            self.flops_by_dtype[cost.dtype] = self.flops_by_dtype.get(cost.dtype, 0) + cost.flops
        ns = int(cost.ns)
        if ns <= 0:
            return False
        if ns > self._launch_ns:
            self.tier_ns[cost.tier] = self.tier_ns.get(cost.tier, 0) + ns - self._launch_ns
        clock = self.clock
        marks = self.host_clocks.marks if self.host_clocks is not None else None
        if marks is not None:
            marks.before(stream)
        start = max(clock.lanes.get(stream, 0) if stream else clock.compute_ns, floor_ns)
        if self.scenario is not None:
            ns = int(self.scenario.stretch(start, ns))
        end = clock.occupy(stream, start, ns)
        if marks is not None:
            marks.after(stream, floor_ns)
        if self._trace_ops is not None:  # the compute lane's track, or the side stream's own
            if stream:
                self.trace.lane_op(stream, name, start, end)
            else:
                self._trace_ops(name, start, end)
        return True

    def charge_untimed(self, name: str, cost: OpCost, how: str) -> None:
        """Run a kernel the compute model cannot time, charged `cost` as `how` says; it is listed in results."""
        entry = self.untimed.setdefault(name, {"count": 0, "charged": how})
        entry["count"] += 1
        self.charge(name, cost)

    def untimed_kernels(self) -> dict[str, dict[str, Any]]:
        """Kernels not timed by the compute model: those charged by `charge_untimed`, and the ops the
        calibrated model could not describe (charged by the roofline)."""
        out = {k: dict(v) for k, v in self.untimed.items()}
        for name, count in sorted(getattr(self.model, "fallbacks", {}).items()):
            out.setdefault(name, {"count": count, "charged": ROOFLINE_FALLBACK})
        return out

    def now(self) -> int:
        return self.clock.now()

    def storage_io(self, name: str, kind: str, nbytes: int, model: StorageLike) -> None:
        """The host reads or writes a checkpoint file (`kind` "read" or "write"): a host stall, so the compute lane
        waits (nothing is issued meanwhile); not compute time (runtime/storage.py). Through the bridge, the file
        is a transfer on the storage all ranks share (bridge.storage_io); without one, it has the storage alone."""
        start = self.issue_at()
        issue = getattr(self.client, "storage_io", None)
        if issue is None:
            end = start + model.lone_ns(nbytes)
        else:
            h = issue(
                kind=kind,
                nbytes=int(nbytes),
                t_issue_ns=start,
                host_bps=model.host_bps,
                shared_bps=model.shared_bps,
                name=name,
            )
            end = max(start, self.client.wait(h))
        self.clock.compute_ns = end
        self._host_moves()
        self.host_ns = max(self.host_ns, end)  # the host did the I/O: its next launch starts after it
        entry = self.storage.setdefault(kind, [0, 0])
        entry[0] += int(nbytes)
        entry[1] += end - start
        self.trace.io(name, start, end, {"bytes": int(nbytes)})
        self.client.advance_clock(end)

    # ----- issuing ---------------------------------------------------------------------------------
    def new_comm(self, ranks: tuple[int, ...]) -> int:
        """A process group over global `ranks` is made on this rank: its number in creation order (`comm_of`)."""
        self.comms.append(ranks)
        return len(self.comms) - 1

    def comm_of(self, comm: int, peer: int | None = None) -> int:
        """Which process group the one made `comm`-th is among this rank's over the same ranks (0: the first), or,
        given a `peer`, among those holding both this rank and `peer`: its `pg`. Every member makes a group with
        the others, in the same order (torch's new_group and split_group are collective), so all members number
        it alike, as NCCL makes each group its own communicator, whose calls run in its own order."""
        mine = self.comms[comm]
        if peer is None:
            return sum(1 for g in self.comms[:comm] if g == mine)
        return sum(1 for g in self.comms[:comm] if self.rank in g and peer in g)

    def next_seq(self, group: tuple[int, ...], pg: int = 0) -> int:
        """The bridge identifies a collective by (group ranks, seq, pg): each process group over those ranks (`pg`,
        `comm_of`) numbers its own calls, as each is its own NCCL communicator."""
        seq = self._seq.get((group, pg), 0)
        self._seq[(group, pg)] = seq + 1
        return seq

    def issue(
        self,
        *,
        kind: str,
        name: str,
        group: tuple[int, ...],
        nbytes: int,
        dtype: str,
        root: int | None,
        tensors: Iterable[torch.Tensor],
        start_inner: Callable[[], list[Any]],
        transfers: Sequence[Transfer] | None = None,
        finalize: Callable[[], None] | None = None,
        stream: int | None = None,
        launch: int | None = None,
        cuda_stream: int = COMPUTE_STREAM,
        sync: bool = False,
        nccl_env: NcclEnv | None = None,
        redop: str = "sum",
        pg: int = 0,
        group_sizes: Sequence[int] = (),
        group_dtypes: Sequence[str] = (),
        host: bool = False,
        group_kinds: Sequence[str] = (),
        group_redops: Sequence[str] = (),
        group_roots: Sequence[int | None] = (),
    ) -> Pending:
        """Tell the bridge about a collective, then start the real data movement; return it in flight.

        With `transfers`, the collective is sent as point-to-point transfers (scatter, gather,
        uneven all-to-all), tagged per group so they never meet user sends, in one NCCL group launch on `stream` (as
        ProcessGroupNCCL runs them: ncclSend/ncclRecv between a group start and end). `stream`: the process group's
        NCCL stream, on which the coordinator runs the rank's collectives one after another (bridge/stream_order.py);
        `launch`: the NCCL group launch (coalescing block) it is part of, whose calls start together.
        `cuda_stream`: the caller's current CUDA stream, whose pending collectives it starts after (`after`);
        `sync` (async_op=False): it runs on that stream, so the stream's later collectives follow it (stream_deps).
        `nccl_env`: the NCCL_* variables its communicator was created with, when the program changed them
        (`program_nccl_env`); the coordinator's model then takes them instead of the run's. `redop`: the reduction
        of a reducing collective (Collective.redop), which decides some of NCCL's choice. `pg`: which of this rank's
        process groups over `group` it runs on (`comm_of`); with transfers, their (`comm_of` with the peer) are given
        by `transfer_pg`, the peer -> pg of those holding this rank and the peer. `group_sizes`: a coalesced call's
        calls' bytes (Collective.group_sizes: one NCCL group of them), sent in its `algo` map, with `group_dtypes`
        (their dtypes, Collective.group_dtypes) where they differ, and `group_kinds`, `group_redops`, `group_roots` (a
        device block's calls of several kinds, reductions or roots, the roots global ranks) where those do. `host`:
        a plain gloo group's call (backend.py, `gloo_sync`), a host-side synchronisation of zero network bytes that
        follows no CUDA stream.
        """
        part = self._thread_part() if self.host_clocks is not None else None
        if part is not None:  # a thread's collective: in its turn, from its stream's lane (host_clocks.py)
            t = self._thread_issue(part, cuda_stream, launch, host)
        else:
            if not host:
                self._nccl_launch(launch)
            t = self.issue_at()
        seq = self.next_seq(group, pg)
        label = call_name(name, seq, pg=pg)
        if self.host_clocks is not None and not host and transfers is None:  # whose call, for a mismatch's error
            label += f" from {part.name if part is not None else self.host_clocks.main.name}"
        after = [] if host else self.streams.after(cuda_stream)
        if transfers is None:
            # what the network sees: ProcessGroupNCCL::barrier all-reduces one float on the group's stream
            wire, wire_bytes, wire_dtype = (
                SYNC_WIRE
                if host
                else ("all_reduce", BARRIER_BYTES, "fp32")
                if kind == "barrier"
                else (kind, nbytes, dtype)
            )
            # a gloo call is no NCCL kernel: outside the NCCL model (before 2.20 NCCL launches an empty collective)
            extras = dict(HOST_ALGO) if host else self.traffic.extras(wire, wire_dtype, wire_bytes)
            if nccl_env is not None:
                extras = {**extras, "nccl_env": [list(kv) for kv in nccl_env]}
            sizes = tuple(int(b) for b in group_sizes) if len(group_sizes) > 1 and kind != "barrier" else ()
            types = tuple(group_dtypes) if sizes and len(set(group_dtypes)) > 1 else ()
            if sizes:
                extras = {**extras, "group_sizes": list(sizes)}
            if types:
                extras = {**extras, "group_dtypes": list(types)}
            kinds, redops, roots = (
                tuple(got) if sizes and len(got) == len(sizes) and len(set(got)) > 1 else ()
                for got in (group_kinds, group_redops, group_roots)
            )
            for field_name, got in (("group_kinds", kinds), ("group_redops", redops), ("group_roots", roots)):
                if got:
                    extras = {**extras, field_name: list(got)}
            optional: dict[str, Any] = {"algo": extras} if extras else {}
            if stream is not None:
                optional["stream"] = stream
            if launch is not None:
                optional["launch"] = launch
            if after:
                optional["after"] = after
            if redop != "sum":
                optional["redop"] = redop
            if pg:
                optional["pg"] = pg
            h = self.client.collective(
                group=group,
                seq=seq,
                kind=wire,
                nbytes=wire_bytes,
                dtype=wire_dtype,
                root=root,
                t_issue_ns=t,
                name=label,
                **optional,
            )
            if "loss_tolerance" in extras:
                self._lossy.add(h)
            handles = [h]
            if self.listeners:
                call = Issued(h, wire, seq, wire_bytes, t, group, wire_dtype, root)
                self._tell(
                    replace(
                        call,
                        stream=stream,
                        launch=launch,
                        after=tuple(after),
                        redop=redop,
                        nccl_env=nccl_env,
                        pg=pg,
                        group_sizes=sizes,
                        group_dtypes=types,
                        group_kinds=kinds,  # type: ignore[arg-type]
                        group_redops=redops,  # type: ignore[arg-type]
                        group_roots=roots,  # type: ignore[arg-type]
                        host=host,
                    )
                )
        else:
            tag = group_tag(group, kind)
            one = launch if launch is not None else -next(self._launches)  # its transfers: one group launch
            named = collective_tag(label, group)  # its transfers' flows: this collective's tag and their pair
            handles = [
                self._p2p(x.peer, x.is_send, tag, seq, x.nbytes, t, named, nccl_env, stream, one, after, pg=pg)
                for x in transfers
                if x.nbytes > 0
            ]
        p = self._register(kind, label, nbytes, t, handles, start_inner, tensors, finalize, group)
        p.stream = stream
        self._nccl_launched(stream, launch, p)
        if sync and not host:
            self.streams.launched(cuda_stream, p)
        return p

    def issue_at(self) -> int:
        """The stamp of the program's thread's next call to the coordinator: the compute lane's time, not before the
        latest time the rank reported for a thread's call or wait (a rank's stamps never go back)."""
        return max(self.clock.issue(), self._stamp_floor)

    def _thread_part(self) -> Any:
        """The host clock of the calling thread if it is one the program started (host_clocks.py), else None."""
        me = threading.get_ident()
        return None if me == self.thread else self.host_clocks.part_of(me)

    def _thread_issue(self, part: Any, cuda_stream: int, launch: int | None, host: bool) -> int:
        """A thread's NCCL call, in its turn in simulated time: its host launches it (the host launch's time on the
        thread's host clock); it is stamped at its stream's lane (the compute lane for the default stream), not
        before its launch, nor before the rank's last stamp. The program's later stamps are no earlier."""
        clocks = self.host_clocks
        clocks.turn_outside_ops(part)
        ns = 0 if host or (launch is not None and launch == self._nccl_charged) else self._nccl_launch_ns
        if launch is not None and not host:
            self._nccl_charged = launch
        clocks.spend(part, ns)
        clock = self.clock
        lane = clock.lanes.get(cuda_stream, 0) if cuda_stream else clock.compute_ns
        said = getattr(self.client, "clock", 0)
        t = max(lane, part.h, said if isinstance(said, int) else 0)
        self._stamp_floor = max(self._stamp_floor, t)
        return t

    def _thread_learn(self, part: Any, handle: int, deadline: float | None = None) -> int:
        """When `handle` (a collective a thread the program started waits for) completes, learned without holding
        the rank up: the thread waits as blocked (host_clocks.py), outside the rank's op lock, in waits on the
        coordinator that let the network run only up to the earliest time another running thread of the rank can
        still call at (`HostClocks.floor`), with the client free between them, so the program's calls go on (a
        wait that needs the program's next call on another communicator completes). Its host time stays (the
        device waits, not the host); the program's later stamps are no earlier than the rank's reported time.
        `deadline`: as `complete`'s."""
        clocks, mode = self.host_clocks, self.host_clocks.mode
        wait_within = getattr(self.client, "wait_within", None)
        if wait_within is None:  # a client of its own (no coordinator, or no thread of the rank ever met it)
            return int(self.client.wait(handle) if deadline is None else self.client.wait(handle, deadline))
        with mode.ops_released():  # inside an op of its own: the others' ops run meanwhile
            clocks.block(part)
            try:
                quiet, last = time.monotonic(), None
                while True:
                    floor = clocks.floor(part)
                    t = wait_within(handle, floor, deadline)
                    if t is not None:
                        return t
                    if floor != last:
                        quiet, last = time.monotonic(), floor
                    clocks.idle(part, quiet)
            finally:
                clocks.resume(part)
                said = getattr(self.client, "clock", 0)
                self._stamp_floor = max(self._stamp_floor, said if isinstance(said, int) else 0)

    def _host_moves(self) -> None:
        """The program's thread's host time is about to move on: its compute lane work so far was launched before
        (lane_marks.py; nothing while no thread the program started lives)."""
        if self.host_clocks is not None:
            self.host_clocks.marks.main_moves()

    @contextlib.contextmanager
    def lane_write(self, stream: int) -> Iterator[None]:
        """The calling thread moves `stream`'s lane inside (a join, a wait on another stream): marked with its host
        time while threads the program started live (lane_marks.py)."""
        clocks = self.host_clocks
        me = threading.get_ident()
        part = None if clocks is None or me == self.thread else clocks.part_of(me)
        if clocks is None or (part is None and me != self.thread):
            yield
            return
        if part is not None:
            clocks.marks.before(stream)
        yield
        clocks.marks.after(stream, None if part is None else part.h)

    def _thread_join(self, p: Pending, stream: int, deadline: float | None = None) -> int:
        """A thread's CUDA stream `stream` waits for `p` (its Work.wait, a data dependency of its kernel): that
        stream's lane (the compute lane for the default stream) joins its completion, which the thread's wait for
        the coordinator learns. `deadline`: as `complete`'s."""
        handoff = self.handoff_at(p)
        t_done = self.complete(p, deadline) if handoff is None else handoff
        if p.reads_user and p.inner:
            with self.internal():
                for work in p.inner:
                    work.wait()
            p.inner = []
        with self.lane_write(stream):
            if stream:
                self.clock.lanes[stream] = max(self.clock.lanes.get(stream, 0), t_done)
            else:
                self.clock.join(t_done)
        for listener in self.listeners:
            listener.on_wait(p.handles, t_done)
        return t_done

    def issue_p2p(
        self,
        *,
        peer: int,
        is_send: bool,
        tag: int,
        nbytes: int,
        tensors: Iterable[torch.Tensor],
        start_inner: Callable[[], list[Any]],
        finalize: Callable[[], None] | None = None,
        nccl_env: NcclEnv | None = None,
        stream: int | None = None,
        launch: int | None = None,
        cuda_stream: int = COMPUTE_STREAM,
        eager: bool = False,
        start_copied: Callable[[list[torch.Tensor]], list[Any]] | None = None,
        comm_ranks: Sequence[int] | None = None,
        pg: int = 0,
        host: bool = False,
    ) -> Pending:
        """A user send or recv: matched with its peer by (src, dst, tag, seq, pg); `finalize` runs once it is done.
        `pg`: which of this rank's process groups holding it and `peer` it is issued on (`comm_of`): each numbers
        its own sends and receives, as each is its own NCCL communicator.
        `nccl_env`: as `issue`'s. `stream`: the NCCL stream it runs on (ProcessGroupNCCL's pointToPoint: its peer
        pair's, or its group's when batched or under eager init), after what the caller's current CUDA stream
        `cuda_stream` waits for (syncStream); `launch`: its batch's NCCL group launch. Its Work's wait() makes the
        current stream wait for it, as a collective's does (`stream_wait`). `eager`: a lone send, which hands off if its
        own slots fit its connection's NCCL_STEPS a channel (`Slots.fits`, the only size limit; or the model gives it
        no slots): its kernel starts after the calls before it on its NCCL stream (`_nccl_prior`: NCCL runs a
        communicator's kernels in turn, whichever CUDA stream or thread issued them) and ends at its hand-off
        (`handoff_at`), which is what its waits, and the calls after it on that stream, see, once the earlier such
        sends to `peer` on the same communicator whose slots it needs are received (`gate`,
        phantora/collectives/slot_window.py). The communicator is named
        by `stream`: ProcessGroupNCCL gives each of its communicators its own stream (ncclStreams_ beside
        devNCCLCommMap_, one pair of maps a process group), so two groups' sends to one peer have two connections.
        A send whose own slots do not fit waits for its receiver on its stream. `start_copied` (real data): the
        inner half of a send given the copies it moves instead of its tensors, which a handed-off send uses when its
        receive is not issued yet, since its waits may return, and its caller overwrite the tensors, before the
        receiver takes them (`send_copies` drops each copy once its receiver has); a send whose receive is already
        issued moves its caller's tensors, taken before its join returns.
        `comm_ranks`: the global ranks of the communicator a lone send runs on when not the pair's own (eager init: its
        group's), which decides whether NCCL uses PXN; a send NCCL moves zero-copy between registered buffers
        (`Slots.zero_copy`) does not hand off: it waits for its receiver on its stream. `host`: as `issue`'s (a plain
        gloo group's send or recv: `nbytes` 0, not `eager`)."""
        if not is_send:
            self.any_recvs.check_named(peer, tag, pg)
        part = self._thread_part() if self.host_clocks is not None else None
        if not host and launch is not None and self._nccl_launch_ns:
            self._group_ops.setdefault(launch, []).append((peer, nbytes, is_send))
        if part is not None:  # a thread's send or recv: in its turn, from its stream's lane, as its collectives
            t = self._thread_issue(part, cuda_stream, launch, host)
        else:
            if not host:
                self._nccl_launch(launch)
            t = self.issue_at()
        key = (peer, tag, is_send, pg)
        seq = self._p2p_seq.get(key, 0)
        self._p2p_seq[key] = seq + 1
        label = call_name("send" if is_send else "recv", seq, tag, pg)
        if self.host_clocks is not None and not host:  # whose call, for the records
            label += f" from {part.name if part is not None else self.host_clocks.main.name}"
        after = [] if host else self.streams.after(cuda_stream)
        match = (tag, seq, pg) if start_copied is not None else None
        on = tuple(comm_ranks) if comm_ranks and set(comm_ranks) != {self.rank, peer} else ()  # (): the pair's own
        ns, slots, ready = (None, None, False)
        if eager and is_send:
            ns, slots, ready = self._handoff(peer, nbytes, nccl_env, match, on)
        comm = stream
        if not (eager and is_send and (slots is None or slots.fits)):
            ns = None
        # a send that hands off stays on its NCCL stream: its kernel starts after the calls before it there, and the
        # calls after it there start at its hand-off (bridge/stream_order.py), as NCCL runs a communicator's kernels
        ahead = self.streams.tail(cuda_stream) + self._nccl_prior(stream) if ns is not None else []
        gate: list[Pending] = []
        ident = next(self._window_ids)
        if ns is not None and slots is not None:
            held = self._windows.setdefault((comm, peer), SlotWindow())
            gate = [self._handed.pop(i) for i in held.admit(ident, slots)]
        handles = [q.handles[0] for q in gate]
        conn = comm if ns is not None else None
        h = self._p2p(
            peer, is_send, tag, seq, nbytes, t, label, nccl_env, stream, launch, after, ns, handles, conn, on, pg, host
        )
        kind = "send" if is_send else "recv"
        copied = ns is not None and start_copied is not None and not ready
        copies: list[torch.Tensor] = []
        if copied:
            assert start_copied is not None
            tensors = list(tensors)
            with self.internal():
                copies = SendCopies.clone(tensors)
            start_inner = functools.partial(start_copied, copies)
            self.handoff_copies += 1
            self.handoff_copy_bytes += nbytes
        p = self._register(kind, label, nbytes, t, [h], start_inner, tensors, finalize, (peer,))
        p.stream = stream
        self._nccl_launched(stream, launch, p)
        if copied:  # its copies go with their gloo sends, dropped once the receiver took them
            self.send_copies.add(p.id, (comm, peer, tag), p.inner, copies)
            p.inner = []
        if ns is not None:
            p.reads_user = start_copied is not None and not copied
            p.handoff_ns, p.handoff_after, p.handoff_gate = ns, ahead, gate
            p.handoff_back = slots.back_ns if slots is not None and gate else 0
            if slots is not None:
                self._handed[ident] = p
            if not ahead and not gate:
                p.t_handoff = t + ns
        return p

    def _nccl_launch(self, launch: int | None) -> None:
        """The host launches an NCCL call (`launch` None: a lone one) or the group launch `launch` (at its first call:
        one plan at its ncclGroupEnd), unless PHANTORA_NCCL_HOST_LAUNCH=off (runtime/nccl_launch.py). The host's
        clock runs on from its last launch (or the last device synchronise, where it waited for the GPU) by the
        launch; the GPU cannot run the call, nor later work, before it: the compute lane moves up to it if behind.
        A GPU busy past it hides the launch, as a host running ahead of its GPU does."""
        ns = self._nccl_launch_ns
        if not ns:
            return
        if launch is not None:
            if launch == self._nccl_charged:
                return
            self._nccl_charged = launch
        self._host_launches(ns, 1)

    def nccl_group_end(self, launch: int | None, comm: Sequence[int], env: NcclEnv | None = None) -> None:
        """Group launch `launch` (a batch of sends and receives, a coalescing block) on the communicator of global
        ranks `comm` reached its ncclGroupEnd: NCCL launches each plan it cut this rank's p2p operations into
        (collectives/nccl/live_launches.py, asked of the client where a peer has several), so the host pays one more
        launch (host_launch.py's per-call part) for each plan after the first. Nothing when opted out."""
        ops = self._group_ops.pop(launch, []) if launch is not None else []
        ask = getattr(self.client, "group_plans", None)
        if not ops or ask is None or not self._nccl_launch_ns:
            return
        peers = [(peer, is_send) for peer, _, is_send in ops]
        if len(set(peers)) == len(peers):  # one operation a peer and side: one plan (as the coordinator cuts)
            return
        algo = {"nccl_env": [list(kv) for kv in env]} if env is not None else None
        plans = int(ask(comm=list(comm), ops=[[peer, n, bool(send)] for peer, n, send in ops], algo=algo))
        if plans > 1:
            self._host_launches(round(HOST_LAUNCH_US * 1000), plans - 1)

    def _host_launches(self, ns: int, count: int) -> None:
        """`count` NCCL launches of `ns` each on the host clock; the GPU cannot run later work before them: the
        compute lane moves up to the host if behind (an idle gap, traced as the host's launch)."""
        clock = self.clock
        self._host_moves()
        self.host_ns = end = self.host_ns + ns * count
        if self.host_clocks is not None:  # the threads catch up first (host_clocks.py)
            self.host_clocks.moved()
        self.nccl_launches += count
        self.nccl_launch_total_ns += ns * count
        start = clock.compute_ns
        if end > start:  # the GPU waits for the host: an idle gap on the compute lane
            clock.compute_ns = end
            self.nccl_launch_idle_ns += end - start
            if self._trace_ops is not None:
                self._trace_ops(NCCL_LAUNCH, start, end)

    def host_work(self, name: str, ns: int) -> None:
        """The host ran an op of `ns` (a CPU tensor op, DeepSpeed's CPU Adam: runtime/hostwork.py). The host's clock
        runs on by it (from its last launch, op or wait, as `_host_launches`); the GPU runs no later work before its
        end: the compute lane moves up to it if behind (an idle gap, traced as `host:NAME`). Another thread's host
        ops run on another CPU thread: not on the program's host clock."""
        if ns <= 0 or threading.get_ident() != self.thread:
            return
        self.host_ops += 1
        self.host_work_ns += ns
        self._host_moves()
        self.host_ns = end = self.host_ns + ns
        if self.host_clocks is not None:  # the threads catch up first (host_clocks.py)
            self.host_clocks.moved()
        clock = self.clock
        start = clock.compute_ns
        if end > start:  # the GPU waits for the host
            clock.compute_ns = end
            self.host_idle_ns += end - start
            if self._trace_ops is not None:
                self._trace_ops(HOST_WORK + name, start, end)

    def host_copy(self, t: HostCopy, ns: int) -> None:
        """A copy between host memory and the GPU over its PCIe link, `ns` long: on the compute lane (stream order);
        a blocking one (runtime/hostwork.py) makes the host wait for its end."""
        self.charge(t.name, OpCost(0, t.nbytes, "", ns, "pcie"))  # its own tier: not a kernel timed by a GPU model
        entry = self.pcie.setdefault(t.kind, [0, 0, 0])
        entry[0] += 1
        entry[1] += t.nbytes
        entry[2] += ns
        if t.blocking:
            self.host_waits()

    def _nccl_prior(self, stream: int | None) -> list[Pending]:
        """The calls of the last launch on NCCL stream `stream` (None: on none), which a call launched there next
        starts after (NCCL runs a communicator's kernels in turn)."""
        tail = self._nccl_tails.get(stream) if stream is not None else None
        return list(tail[1]) if tail is not None else []

    def _nccl_launched(self, stream: int | None, launch: int | None, p: Pending) -> None:
        """`p` was launched on NCCL stream `stream` (None: on none), in group launch `launch` (None: its own)."""
        if stream is None:
            return
        tail = self._nccl_tails.get(stream)
        if tail is not None and launch is not None and tail[0] == launch:
            tail[1].append(p)
        else:
            self._nccl_tails[stream] = (launch, [p])

    def _handoff(
        self,
        peer: int,
        nbytes: int,
        env: NcclEnv | None,
        match: tuple[int, int, int] | None = None,
        comm: tuple[int, ...] = (),
    ) -> tuple[int | None, Slots | None, bool]:
        """The ns a send of `nbytes` to `peer` on no stream takes from its kernel's start to handing its last byte
        to its connection, and the connection slots it takes (bridge `handoff`, collectives/handoff.py); None
        where the client or the model does not time it (its waits then see its flow's end, as before). With the
        send's `match` (tag, seq, pg), also whether its receive is already issued (else False). `comm`: its
        communicator's ranks when not the pair's own."""
        algo = {"nccl_env": [list(kv) for kv in env]} if env is not None else None
        plan = getattr(self.client, "handoff_plan", None)
        if plan is not None:
            more: dict[str, Any] = {"tag": match[0], "seq": match[1]} if match is not None else {}
            if match is not None and match[2]:
                more["pg"] = match[2]
            if comm:
                more["comm"] = list(comm)
            got = plan(peer=peer, nbytes=nbytes, algo=algo, **more)
            ns, steps, one_op = got[0], got[1], got[2]
            zero_copy = bool(got[4]) if len(got) > 4 else False
            back = int(got[5]) if len(got) > 5 else 0
            slots = Slots(tuple(steps), bool(one_op), zero_copy, back) if steps is not None else None
            return (None if ns is None else int(ns)), slots, bool(got[3]) if len(got) > 3 else False
        ask = getattr(self.client, "handoff", None)
        if ask is None:
            return None, None, False
        ns = ask(peer=peer, nbytes=nbytes, algo=algo)
        return (None if ns is None else int(ns)), None, False

    def handoff_at(self, p: Pending) -> int | None:
        """When `p`, a lone send within its connection's buffer, hands off: its kernel starts once the work its CUDA
        stream had in flight at its issue has ended there (a collective's end, or an earlier such send's own
        hand-off), then runs `handoff_ns`, and not before the flows of the earlier sends whose slots it needs have
        ended (`handoff_gate`: their receivers consumed them) and the news is back (`handoff_back`, `Slots.back_ns`);
        None for any other call. Learning those ends may
        wait on the bridge, as a join does (`complete`), never on `p`'s own receiver."""
        if p.t_handoff is not None or p.handoff_ns is None:
            return p.t_handoff
        start = p.t_issue
        for q in p.handoff_after:
            end = self.handoff_at(q)
            start = max(start, self.complete(q) if end is None else end)
        for q in p.handoff_gate:
            start = max(start, self.complete(q) + p.handoff_back)
        p.t_handoff, p.handoff_after, p.handoff_gate = start + p.handoff_ns, [], []
        return p.t_handoff

    def _p2p(
        self,
        peer: int,
        is_send: bool,
        tag: int,
        seq: int,
        nbytes: int,
        t: int,
        label: str,
        env: NcclEnv | None = None,
        stream: int | None = None,
        launch: int | None = None,
        after: Sequence[int] = (),
        handoff: int | None = None,
        gate: Sequence[int] = (),
        conn: int | None = None,
        comm: tuple[int, ...] = (),
        pg: int = 0,
        host: bool = False,
    ) -> int:
        """One transfer to the bridge (on `stream`, in `launch`, after the rank's calls `after`; a lone send's
        kernel ns `handoff`, which the bridge's stream order follows, after the flows of its earlier sends `gate`
        on its communicator `conn`; on process group `pg`, `comm_of`); its handle. `host`: a plain gloo group's, which
        the bridge plans outside the NCCL model (`HOST_ALGO`): no NCCL kernel, so none of NCCL's launch of an empty
        send (collectives/nccl/empty_kernel.py), and zero bytes, so no flows: it ends at its later end's issue."""
        more: dict[str, Any] = {"algo": {"nccl_env": [list(kv) for kv in env]}} if env is not None else {}
        if host:
            more["algo"] = dict(HOST_ALGO)
        if stream is not None:
            more["stream"] = stream
        if launch is not None:
            more["launch"] = launch
        if after:
            more["after"] = list(after)
        if handoff is not None:
            more["handoff"] = handoff
        if gate:
            more["gate"] = list(gate)
        if pg:
            more["pg"] = pg
        h = self.client.p2p(
            peer=peer, is_send=is_send, tag=tag, seq=seq, nbytes=nbytes, t_issue_ns=t, name=label, **more
        )
        if self.listeners:
            kind = "send" if is_send else "recv"
            call = Issued(
                h,
                kind,
                seq,
                nbytes,
                t,
                peer=peer,
                tag=tag,
                stream=stream,
                launch=launch,
                after=tuple(after),
                nccl_env=env,
                launch_comm=tuple(getattr(self.client, "p2p_comm", None) or ()),  # the group open on the client
                released_ns=getattr(self.client, "released_ns", None),
                pg=pg,
                host=host,
            )
            self._tell(replace(call, handoff=handoff, conn=conn, comm=comm) if handoff is not None else call)
        return h

    def _tell(self, call: Issued) -> None:
        for listener in self.listeners:
            listener.on_issue(call)

    def _register(
        self,
        kind: str,
        label: str,
        nbytes: int,
        t: int,
        handles: list[int],
        start_inner: Callable[[], list[Any]],
        tensors: Iterable[torch.Tensor],
        finalize: Callable[[], None] | None,
        group: tuple[int, ...],
    ) -> Pending:
        with self.internal():
            inner = start_inner()
        held = list(tensors)
        keys = tuple({k for k in (storage_key(x) for x in held) if k is not None})
        p = Pending(next(self._ids), label, kind, nbytes, t, handles, inner, keys, finalize, group, tensors=held)
        part = self._thread_part() if self.host_clocks is not None else None
        p.launched_h = self.host_ns if part is None else part.h
        self.pending[p.id] = p
        for k in keys:
            self.by_storage.setdefault(k, set()).add(p.id)
        stats = self.comm.setdefault(kind, CommStats())
        stats.count += 1
        stats.nbytes += nbytes
        return p

    # ----- joining ---------------------------------------------------------------------------------
    def complete(self, p: Pending, deadline: float | None = None) -> int:
        """Learn when `p` completes and make its data valid, without stalling the compute lane. `deadline`: the
        host's wall-clock instant (`time.monotonic()`) past which a wait for the coordinator raises WaitTimedOut."""
        if p.t_done is not None:
            return p.t_done
        part = self._thread_part() if self.host_clocks is not None else None
        if part is None:
            self.client.advance_clock(self.clock.now())
        t_done = p.t_issue
        for h in p.handles:
            if part is not None:  # a thread the program started: the rank runs on meanwhile
                t_done = max(t_done, self._thread_learn(part, h, deadline))
            else:
                t_done = max(t_done, self.client.wait(h) if deadline is None else self.client.wait(h, deadline))
        t_done += p.host_ns
        with self.internal():  # ops that gloo or the finaliser run here are not GPU work
            for work in p.inner:
                work.wait()
            p.inner = []
            self.send_copies.wait(p.id)
            if p.finalize is not None:
                p.finalize()
            lost = [r for h in p.handles if h in self._lossy for r in self.client.lost(h)]
            self._lossy.difference_update(p.handles)
            if lost:  # DLCP: the bytes the network dropped arrive as zeros
                self.traffic.lost_bytes += zero_ranges(p.tensors, lost)
                self.traffic.last_lost = sorted(lost)
        p.t_done = t_done
        p.tensors = []
        self._forget(p)
        self.clock.complete(t_done)
        self.comm[p.kind].busy_ns += t_done - p.t_issue
        self.trace.comm(p.name, p.t_issue, t_done, {"bytes": p.nbytes, "group": list(p.group)})
        return t_done

    def _forget(self, p: Pending) -> None:
        """`p` is no longer in flight: no op's data waits for it."""
        self.pending.pop(p.id, None)
        for k in p.keys:
            ids = self.by_storage.get(k)
            if ids is not None:
                ids.discard(p.id)
                if not ids:
                    del self.by_storage[k]

    def abort(self, p: Pending, reason: str) -> None:
        """A wait on `p` passed its timeout (torch's `Work.wait(timeout)`), which fails it and aborts the communicator
        it ran on, as ProcessGroupNCCL's wait does: `p` is dropped unjoined (it counts as ended at its issue, so no
        stream or lane waits for it; its tensors and gloo works are kept, since gloo may still write them when the
        peers join), and every later call on its NCCL stream is refused with `reason` (`aborted`). The compute lane
        moves to where the coordinator let the rank run again (the network's time, if it moved on while the rank
        waited: RankClient's `_cancel`)."""
        if p.stream is not None:
            self.aborted.setdefault(p.stream, reason)
        p.t_done = p.t_issue
        self._forget(p)
        self.abandoned.append(p)
        resumed = getattr(self.client, "clock", None)  # a client without a coordinator (nonet) never times out
        if isinstance(resumed, int):
            self.clock.join(resumed)

    def join(self, p: Pending, deadline: float | None = None) -> int:
        """The compute lane waits for `p` (Work.wait, a data dependency); return its completion. A send handed off
        within its connection's buffer (`t_handoff`) ends there for the lane, without waiting for its receiver:
        its flow's end is learned later (`sync`, the end of the run). `deadline`: as `complete`'s. From a thread the
        program started, its current stream's lane joins `p` instead (`_thread_join`)."""
        if self.host_clocks is not None and threading.get_ident() != self.thread:
            part = self._thread_part()
            if part is not None:
                self.host_clocks.turn_outside_ops(part)
                return self._thread_join(p, current_stream_id(), deadline)
        handoff = self.handoff_at(p)
        t_done = self.complete(p, deadline) if handoff is None else handoff
        if p.reads_user and p.inner:  # its receive is issued (its receiver's gloo recv is in): the bytes go now
            with self.internal():
                for work in p.inner:
                    work.wait()
            p.inner = []
        self.clock.join(t_done)
        handed = p.t_handoff is not None and p.t_done is None  # joined at its hand-off, its flow still running
        for listener in self.listeners:
            on_handoff = getattr(listener, "on_handoff", None) if handed else None
            if on_handoff is not None:
                on_handoff(p.handles, t_done)
            else:
                listener.on_wait(p.handles, t_done)
        return t_done

    def stream_wait(self, stream: int, pending: Iterable[Pending]) -> None:
        """CUDA stream `stream` waits for `pending` (Work.wait, wait_stream, wait_event): the compute stream joins
        them; another stream's later collectives, sends and receives follow them. Not from a thread other than the
        program's (as `join_tensors`) unless the program started it: its stream's lane joins them (`_thread_join`)."""
        if threading.get_ident() != self.thread:
            part = self._thread_part() if self.host_clocks is not None else None
            if part is not None:
                self.host_clocks.turn_outside_ops(part)
                for p in list(pending):
                    self._thread_join(p, stream)
            return
        for p in list(pending):
            if stream == COMPUTE_STREAM:
                self.join(p)
            else:
                self.streams.follow(stream, [p])

    def poll(self, p: Pending) -> bool:
        """Has `p` completed by the compute lane's current time? (Work.is_completed; no stall.)"""
        if p.t_done is not None:
            return p.t_done <= self.clock.now()
        now = max(self.clock.now(), self._stamp_floor)
        return all(self.client.test(h, now) is not None for h in p.handles)

    def join_tensors(self, tensors: Iterable[Any]) -> None:
        """Join every collective in flight that reads or writes the memory of one of `tensors`. From a thread the
        program started, on its current stream's lane (`_thread_join`); from another thread (gloo's), none."""
        join: Callable[[Pending], Any] = self.join
        if threading.get_ident() != self.thread:
            part = self._thread_part() if self.host_clocks is not None else None
            if part is None:
                return
            join = functools.partial(self._thread_join, stream=current_stream_id())
        ids: set[int] = set()
        for t in tensors:
            if isinstance(t, torch.Tensor):
                k = storage_key(t)
                if k is not None and k in self.by_storage:
                    ids |= self.by_storage[k]
        for i in sorted(ids):
            p = self.pending.get(i)
            if p is not None:
                join(p)

    def host_waits(self) -> None:
        """The host blocked until the compute lane got here (a barrier's wait, a wait with a timeout, a plain gloo
        group's call: a join on the host): the host clock of its NCCL launches moves up to the lane. From a thread
        the program started, its host clock moves up to its current stream's lane."""
        if self.host_clocks is not None and threading.get_ident() != self.thread:
            part = self._thread_part()
            if part is not None:  # up to the end of its stream's work launched at its host time or before
                self.host_clocks.spend(part, self.host_clocks.marks.upto(part.h, (current_stream_id(),)) - part.h)
                return
        self._host_moves()
        self.host_ns = max(self.host_ns, self.clock.compute_ns)
        if self.host_clocks is not None:
            self.host_clocks.moved()

    def thread_sync(self, lane: int | None = None, calls: list[Pending] | None = None, at: int | None = None) -> None:
        """A device synchronise from a thread the program started (none from another thread): in its turn, its host
        clock moves up to the end of the work launched before it, at its host time or earlier, by any thread of the
        rank (as CUDA's waits for the work launched before it): each lane's (lane_marks.py), each collective's, send's
        and receive's in flight (a send handed off: its hand-off, where its kernel ends), learned as its waits learn
        them (`_thread_learn`), without joining them: the thread waits, not the lanes, and a call's data is still
        made valid by a wait or a read. Work the program's thread launched at a later host time (it runs ahead while
        this thread waits for its collective) is not waited for. A stream's synchronise waits for its `lane` and the
        `calls` its next work follows alone; an event's for its recorded time `at` and its `calls`."""
        part = self._thread_part() if self.host_clocks is not None else None
        if part is None:
            return
        self.host_clocks.turn_outside_ops(part)
        h = part.h
        end = at if at is not None else self.host_clocks.marks.upto(h, None if lane is None else (lane,))
        for p in [self.pending.get(i) for i in sorted(self.pending)] if calls is None else calls:
            if p is None or p.launched_h > h:
                continue
            done = p.t_done if p.t_done is not None else self.handoff_at(p)
            if done is None:
                done = max([p.t_issue, *(self._thread_learn(part, h) for h in p.handles)]) + p.host_ns
            end = max(end, done)
        self.host_clocks.spend(part, end - part.h)

    def sync(self) -> int:
        """Join every lane and every collective in flight (a device synchronise): the host waits there too."""
        for i in sorted(self.pending):
            p = self.pending.get(i)
            if p is not None:
                self.complete(p)
                self.join(p)
        end = self.clock.sync()
        self._host_moves()
        self.host_ns = max(self.host_ns, end)
        if self.host_clocks is not None:
            self.host_clocks.moved()
        return end

    # ----- steps and results -------------------------------------------------------------------------
    def step(self) -> int:
        """End of a training iteration: synchronise; return this step's simulated duration (ns)."""
        start = self.step_ends[-1] if self.step_ends else self.start_ns
        end = self.sync()
        self.client.advance_clock(end)
        self.trace.step(len(self.step_ends), start, end)
        if self.out_dir is not None:  # before the step's line in steps/: a step listed there has its trace
            self.trace.append_to(RunDir(self.out_dir).rank_trace(self.rank), len(self.step_ends))
        self.step_ends.append(end)
        if len(self.step_ends) == self.trace_steps and self.trace.level != "none":
            if self._trace_ops == self.trace.op:  # not a profiler window's tap (gpu_window.py), which stays
                self._trace_ops = None  # the later steps: their step and collective spans only (--trace-steps)
            self.trace.stop_ops()
        self.step_flops.append(sum(self.flops_by_dtype.values()))
        self.step_busy.append(self.clock.compute_busy_ns)
        self.step_storage.append(sum(v[1] for v in self.storage.values()))
        self.memory.end_step()
        self.traffic.end_step()
        self._log_step(start, end)
        for listener in self.listeners:
            listener.on_step(len(self.step_ends) - 1, end)
        if self.scenario is not None:
            self._scenario_step(len(self.step_ends), end)
        if self.max_steps is not None and len(self.step_ends) >= self.max_steps:
            raise StepLimitReached(f"rank {self.rank}: {plural(self.max_steps, 'step')} done")
        return end - start

    def _scenario_step(self, step: int, t: int) -> None:
        """Step `step` starts at t: slow-GPU windows at that step begin, and the coordinator hears of it if the
        scenario has network events at a step."""
        assert self.scenario is not None
        self.scenario.step_started(step, t)
        tell = getattr(self.client, "step_boundary", None)
        if self.scenario.wants_steps and tell is not None:
            tell(step, max(t, self._stamp_floor))

    def _log_step(self, start: int, end: int) -> None:
        """Append this step's line to out_dir/steps/rank<R>.jsonl at once, so it survives a crash later."""
        if self.out_dir is None:
            return
        busy = self.step_busy[-1] - (self.step_busy[-2] if len(self.step_busy) > 1 else 0)
        comm = {k: v.nbytes for k, v in self.comm.items()}
        line = {
            "step": len(self.step_ends) - 1,
            "end_ns": end,
            "time_ns": end - start,
            "compute_ns": busy,
            "memory_peak_bytes": self.memory.step_peaks[-1] if self.memory.step_peaks else 0,
            "reserved_peak_bytes": self.memory.reserved_step_peaks[-1] if self.memory.reserved_step_peaks else 0,
            "comm_bytes": {k: n - self._comm_at_step.get(k, 0) for k, n in sorted(comm.items())},
            "comm_wait_ns": self.clock.waited_ns - self._wait_at_step,
            "lost_bytes": self.traffic.lost_bytes - self._lost_at_step,
        }
        if self.storage:  # checkpoint reads and writes in this step (runtime/storage.py)
            nbytes, ns = (sum(v[i] for v in self.storage.values()) for i in (0, 1))
            line["storage_bytes"], line["storage_ns"] = nbytes - self._storage_at_step[0], ns - self._storage_at_step[1]
            self._storage_at_step = (nbytes, ns)
        self._lost_at_step = self.traffic.lost_bytes
        self._comm_at_step, self._wait_at_step = comm, self.clock.waited_ns
        if self._steps_file is None:
            path = RunDir(self.out_dir).rank_steps(self.rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._steps_file = open(path, "a", buffering=1)  # kept open for the session: one line per step
        self._steps_file.write(json.dumps(line) + "\n")

    def results(self) -> dict[str, Any]:
        """This rank's results (msgpack-able, string keys)."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "gpu": self.model.gpu.display_name,
            "tensors": "phantom" if self.phantom else "real",
            "start_ns": self.start_ns,
            "end_ns": self.clock.now(),
            "step_ends_ns": list(self.step_ends),
            "step_flops": list(self.step_flops),
            "step_busy_ns": list(self.step_busy),
            "compute_busy_ns": self.clock.compute_busy_ns,
            "comm_wait_ns": self.clock.waited_ns,
            "nccl_host_launch": {
                "launches": self.nccl_launches,
                "host_ns": self.nccl_launch_total_ns,
                "idle_ns": self.nccl_launch_idle_ns,
            },
            "ops": self.ops,
            "flops_by_dtype": dict(self.flops_by_dtype),
            "untimed_kernels": self.untimed_kernels(),
            "kernel_ns_by_tier": dict(self.tier_ns),
            "comm": {
                k: {"count": v.count, "bytes": v.nbytes, "busy_ns": v.busy_ns} for k, v in sorted(self.comm.items())
            },
            "workload": dict(self.workload),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "host_workspace_bytes": flex_chunks.workspace_bytes(),  # real-mode CPU kernels' own (memcheck.py)
            "pss_mb": proportional_set_mb(),
            "memory": self.memory.results(),
            **(
                {
                    "storage": {k: {"bytes": v[0], "ns": v[1]} for k, v in sorted(self.storage.items())},
                    "step_storage_ns": list(self.step_storage),
                }
                if self.storage
                else {}
            ),
            **({"host_work": self.host_results()} if self.host_ops or self.pcie else {}),
            **({"scenario": self.scenario_results()} if self.scenario is not None else {}),
            **({"moe_routing": routing} if (routing := kept_values.routing()) is not None else {}),
            **({"moe_routing_sites": sites} if (sites := kept_values.sites()) is not None else {}),
            **({"phantom_shapes": shapes} if (shapes := data_shapes.assumed()) is not None else {}),
            **(
                {"simulated_packages": pk}
                if (pk := (simapex.simulated_packages() or []) + simflash.simulated_packages())
                else {}
            ),
            **({"simulated_packages_unused": un} if (un := simflash.unused_packages()) else {}),
        }

    def host_results(self) -> dict[str, Any]:
        """This rank's host work: its host ops (count, host time, the compute lane's wait for them), its copies over
        PCIe by direction, and the host they were timed on."""
        return {
            "host": self.host.host.name if self.host is not None else None,
            "ops": self.host_ops,
            "host_ns": self.host_work_ns,
            "idle_ns": self.host_idle_ns,
            "pcie": {k: {"copies": v[0], "bytes": v[1], "ns": v[2]} for k, v in sorted(self.pcie.items())},
        }

    def scenario_results(self) -> dict[str, Any]:
        """This rank's part of a scenario: its slow-GPU windows and the compute time they added."""
        assert self.scenario is not None
        return {"gpu_slow": self.scenario.windows(), "slowed_ns": self.scenario.slowed_ns}

    def finish(self) -> dict[str, Any]:
        """Synchronise, write this rank's trace, and hand the results to the coordinator."""
        if self.finished:
            raise PhantoraError(f"rank {self.rank}: the session already finished")
        end = self.sync()
        res = self.results()
        if self.out_dir is not None:
            self.trace.append_to(RunDir(self.out_dir).rank_trace(self.rank), None)
        self.client.finish(max(end, self._stamp_floor), res)  # a thread's wait may have reported a later time
        self.finished = True
        for listener in self.listeners:
            listener.on_finish(self.clock.now())
        return res


_current: RankSession | None = None


def current() -> RankSession | None:
    """The session of this process, or None outside a phantora run."""
    return _current


cuda_only.use_session(current)  # its one-kernel ops charge this process's session


def install(session: RankSession | None) -> None:
    global _current
    _current = session


def require() -> RankSession:
    if _current is None:
        raise PhantoraError(
            "no phantora session in this process: start the script with `phantora run` "
            "(or create one with phantora.runtime.bootstrap.start_session())"
        )
    return _current
