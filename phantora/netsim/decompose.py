"""`DecomposedSimulator`: the packet side split into link-disjoint pieces, run by parallel ns-3 workers.

Each worker hosts an ordinary `NicLatencySimulator` over the FULL topology (same node ids, ECMP hashes and
per-switch random streams as one engine), fed only the flows of its pieces (`phantora.netsim.pieces`; pieces go
round-robin onto workers). This engine keeps every dependency itself and hands each worker its flows without
deps, each with the ns it is posted at. It starts no process itself: the caller passes a `Spawner`, which starts
the workers and carries the rounds to them (`bridge.workers.spawn_workers`: network server processes over our
ZeroMQ bridge, msgpack, the run's token, heartbeats, timeouts).

Synchronisation is conservative, with the NIC latency L as lookahead: a flow posted at P sends its first
packet at P + L, and nothing is posted before the completion (or submission) that releases it. If E is
the earliest time anything can still happen (the minimum of the workers' next event times, the flows not
yet handed over and the caller's `until`), every flow not yet known starts at E + L or later, so all
workers may run, in parallel, every event up to E + L - 1 (a "round": send every worker its request,
then gather; in between the caller does its own work, `meanwhile`: the fluid NVLink side runs ahead to the
earliest packet completion it reacts to, asynchronous rounds). The flows' earliest ends are refined as they
run: each reply carries the workers' completion bounds (unsent bytes at line rate + least propagation), so a
round ends near the next completion that matters.
Completions wait here and are handed out one ns at a time, as `advance_to_completion`
promises, so nvlink=fluid (`phantora.netsim.hybrid`) sits on top unchanged. The result equals one engine
with the same nic_latency to the ns (docs/packet-model.md, "Decomposition").

Placement is the spawner's: the bridge's starts local subprocesses (`workers=N`, ipc in a private directory),
or processes started by Ray actors (`ray=local|auto|ADDRESS`, tcp; beyond loopback CurveZMQ). A worker that
dies ends the run within about a second, named (`WorkerDiedError`); workers exit with this process.
"""

from __future__ import annotations

import dataclasses
import operator
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from itertools import compress, repeat
from typing import Any, Protocol

from phantora.errors import PhantoraError
from phantora.netsim.base import INF_NS, Completion, Flow, RunsByCompletion
from phantora.netsim.blockers import Blockers
from phantora.netsim.completion_buffer import CompletionBuffer, Segment, built
from phantora.netsim.completion_columns import CompletionColumns
from phantora.netsim.effective import EffectiveSettings
from phantora.netsim.flow import CausalityError
from phantora.netsim.gc_pause import Freezer
from phantora.netsim.hybrid import SHARED_DEPS_MIN, WideDeps, topological_order  # the wide-deps rules: one for both
from phantora.netsim.least_bounds import least_ends
from phantora.netsim.nic_latency import JOIN_BASE, Releases, gate_key, outer_key  # (JOIN_BASE: joins)
from phantora.netsim.observe import (
    CnpEvent,
    Drop,
    EcnMark,
    FlowTransport,
    PacketChannelUsage,
    PfcEvent,
    QueueSample,
    Trim,
    fields_getter,
)
from phantora.netsim.packet import check_packet_batch, check_packet_fields
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.pieces import NO_PIECE, PieceRoutes, fabric_pieces
from phantora.netsim.pulled_bounds import Wide, pull
from phantora.netsim.reach_steps import Reach, least_reach
from phantora.topology.model import Topology

DRIVER = -1  # the owner of markers (no NIC): they complete in the driver
# A batch of this many flows or more is handed to the workers before the driver keeps its books on it (`_placing`:
# the workers place their flows meanwhile); a smaller one goes out with the next round (a round trip saved).
HAND_OVER_MIN = 4096
# A batch this large (a DAG's worth, kept for the run) is frozen out of the cyclic garbage collector's full passes
# (`gc.freeze`: no cycle among these objects is collected until `gc.unfreeze`), in the driver after its books and in
# each worker after placing it: otherwise every full pass, each time a quarter more objects survive, walks them all
# (0.2-0.4 CPU s of the driver's serial part on bench_decompose's 64 MiB hierarchical DAG, none of it collected).
FREEZE_MIN = HAND_OVER_MIN
_drop: Callable[[Iterable[Any]], None] = deque(maxlen=0).extend  # runs an iterator to its end, keeping nothing
WORKER_PEER_TIMEOUT_S = 120.0  # a worker exits after this much silence from us (we also heartbeat it)
CALL_TIMEOUT_S = 3600.0  # one round may legitimately run this long
KEEPALIVE_S = 0.5  # the driver's heartbeats to its workers go out at most this often (their limit is minutes)


@dataclasses.dataclass(frozen=True)
class _SharedDeps:
    """A deps list as `submit` reads it for one worker: the latest end of its ended deps (-1: none), the highest
    bound of all (ends included), its unfinished deps on that worker and elsewhere, and their waiting lists."""

    deps: tuple[int, ...]  # the list itself (one object for the batch's flows that share it on this worker)
    ended: int
    lb: int
    local: list[int]
    cross: list[int]
    waiting: list[list[int]]


class WorkerDiedError(PhantoraError):
    """A decomposition worker exited (or stopped answering) mid-run."""


@dataclasses.dataclass
class Outbox:
    """What a worker gets in the next round: flows (with their submit ns; `gated` ones wait for a gate too) and
    gates opened, [flow id, ns]."""

    flows: list[tuple[Flow, Sequence[int]]] = dataclasses.field(default_factory=list)  # (flow, its deps on this worker)
    at: list[int] = dataclasses.field(default_factory=list)
    gated: list[int] = dataclasses.field(default_factory=list)
    gates: list[list[int]] = dataclasses.field(default_factory=list)

    def empty(self) -> bool:
        return not self.flows and not self.gates


@dataclasses.dataclass
class RoundReply:
    """A worker's answer to a round: its completions, its completion bounds ([id, ns, ...], those that rose), the
    CPU and wall seconds it took, and its state after it."""

    completions: Sequence[Completion]  # (a `CompletionColumns` from the bridge's pools: objects built when read)
    bounds: list[int]
    cpu: float
    wall: float
    now: int
    next_event: int | None
    in_flight: int


class WorkerPool(Protocol):
    """Started workers, each the packet side over the full topology, and the round trips to them."""

    @property
    def workers(self) -> Sequence[Any]:
        """One handle per worker, in index order (with index, pid and pieces)."""
        ...

    @property
    def curve(self) -> bool:
        """Whether the workers' sockets are encrypted (CurveZMQ)."""
        ...

    def round(self, posts: dict[int, tuple[int, Outbox, int]]) -> Iterator[tuple[int, RoundReply]]:
        """Send each worker of `posts` (index -> (the ns every completion is known to, its outbox, run until)) its
        round; yield (index, reply) as the replies come. WorkerDiedError if a worker dies meanwhile."""
        ...

    def stats(self, index: int) -> dict[str, object]:
        """A worker's engine counters."""
        ...

    def records(self, index: int, now: int, elapsed: int) -> dict[str, list[Any]]:
        """A worker's fabric records (usage, pfc, queues, drops, trims, cnps, marks, transport) and its engine's
        effective settings (effective: (attribute, text) pairs)."""
        ...

    def keepalive(self) -> None: ...

    def close(self) -> None:
        """Tell every worker to exit and end the ones that do not."""
        ...


# (topology, config, pieces per worker[, the workers' engine: EngineSpec.side, "packet" unless said])
Spawner = Callable[..., WorkerPool]


class DecomposedSimulator(RunsByCompletion):
    """A `CompletionStepper` (and `FabricObserver`) over N workers, each running some pieces; `spawn` starts them."""

    posts_at_dep_ends = True  # as `NicLatencySimulator` (its workers' engine): a flow's deps are resolved as there
    # A flow of a wide deps list has its bound raised by each of its deps' completions (False: by none; a subclass
    # that pulls bounds up from the unfinished deps when it reads them, whose latest bound is past the ended ones)
    raises_wide = True
    # A completion raises the bounds of the flows waiting on it, kept in waiting lists (False: neither; a subclass
    # whose bounds read the ends of the deps they are pulled from, `HybridDecomposedSimulator`)
    raises_dependents = True
    worker_side = "packet"  # what each worker hosts (`EngineSpec.side`)
    hands_over = True  # a large batch goes to the workers in a round of its own (`_placing`; not for other rounds)
    # each worker's unfinished flows, and a flow's step until it ends, kept (`_horizon` and `_raise` read them; False:
    # a subclass whose horizon and raises read neither, `HybridDecomposedSimulator`: a per-completion cost saved)
    tracks_unfinished = True
    # Bounds pulled up the DAG where a round reads them (`pulled_bounds`: the same values), not pushed down it at every
    # rise; then neither raise above applies (False: a subclass that reads `_lb` itself or keeps its own bounds)
    pulls_bounds = True
    # A flow may wait on deps outside the packet side, the caller's (`submit_outer`: the fluid NVLink side's), behind
    # a gate the caller opens (`open_outer`); until then it and the flows waiting on it here are not read by the horizon
    # (False: a subclass whose horizon reads other books, `HybridDecomposedSimulator`, `SteppedPartition`)
    opens_outer = True

    def __init__(self, topology: Topology, config: PacketConfig, spawn: Spawner) -> None:
        self._check_config(config)
        topology.use_ecmp(config.ecmp_hash or topology.ecmp_hash)  # as Ns3Simulator does: the workers' routes
        self.topology = topology
        self.config = config.with_updates(ecmp_hash=topology.ecmp_hash)
        self.latency = config.nic_latency
        # every worker may run up to E + ahead - 1 (`_horizon`): the NIC latency, or with none (a subclass whose
        # workers start a flow at its post ns, after every event of that ns ran, as one engine does) E itself
        self._ahead = max(self.latency, 1)
        self._routes, self._piece_worker, n = self._layout()
        self._now = 0
        self._wtime = 0  # every completion at or before this ns is gathered (the workers ran that far)
        # gathered completions not handed out: each reply a run of its own in end order, its objects built when
        # handed out (`completion_buffer.built`: in (end, id) order across the runs)
        self._buffer = CompletionBuffer()
        # while `drain` runs: what it handed out whose objects are not built yet (built while the workers run the next
        # round, `_while_round`), and those built
        self._handed: list[Segment] | None = None
        self._drained: list[Completion] = []
        self._owner: dict[int, int] = {}  # flow id -> its worker, DRIVER for markers (they complete here)
        self._ends: dict[int, int] = {}  # flow id -> end ns, as gathered
        self._lb: dict[int, int] = {}  # unfinished flow -> the earliest ns it can complete (`_horizon`); only grows
        self._step: dict[int, int] = {}  # unfinished flow -> delay_ns + its transfer bound: lb >= a dep's lb + step
        self._dependents: dict[int, list[int]] = {}  # unfinished flow -> the flows waiting on it
        # (`pulls_bounds`) unfinished flow -> its deps, while any is unfinished; L pulled (`pulled_bounds.pull`) and
        # long lists' terms, valid until a bound rises or a flow ends
        self._up: dict[int, tuple[int, ...]] = {}
        self._memo: dict[int, int] = {}
        self._memo_wide: Wide = {}
        self._unfinished: list[set[int]] = [set() for _ in range(n)]  # per worker
        # (`pulls_bounds`) of those, what the horizon reads first and what it reads under a flow (`blockers`)
        self._blockers = Blockers(n) if self.pulls_bounds and self.tracks_unfinished else None
        self._ext: set[int] = set()  # unfinished fabric flows a gate or a marker here waits on
        self._zero: set[int] | None = None  # flows with no lookahead (started at their post ns), when there are any
        self._deps_of: dict[int, tuple[int, ...]] | None = None  # flow -> its deps, for a subclass that pulls bounds
        # flow of `_ext` -> the (worker, no lookahead) of the gated flows waiting on it (worker DRIVER: a marker), and
        # each worker's horizon of the round to come, for a subclass that gives each worker its own
        self._targets: dict[int, set[tuple[int, bool]]] | None = None
        self._hz: list[int] | None = None
        self._rel = Releases()  # gates (pseudo flows, id gate_key(flow)) and markers, waiting on their deps
        # (`opens_outer`) the flows of the batch being submitted that wait on an outer gate; the flows deferred: not
        # read by the horizon while an outer gate they wait on, theirs or a dep's, is closed (flow -> how many of its
        # own gate and its deferred deps are still so); a deferred flow -> the deferred flows waiting on it
        self._outer: Collection[int] = ()
        self._outer_at: dict[int, int] = {}  # a flow behind its outer gate alone (no dep on another worker) -> its ns
        self._deferred: dict[int, int] = {}
        self._deferring: dict[int, list[int]] = {}
        self._out: list[Outbox] = [Outbox() for _ in range(n)]
        self._wnow = [0] * n  # each worker's now()
        self._next: list[int | None] = [None] * n
        self._in_flight = [0] * n
        self._gates_held = 0
        self._joins_held = 0
        self._next_join = JOIN_BASE
        self.reacts: Callable[[int], bool] | None = None  # set by the caller: does it act on this completion?
        # set by the caller with `reacts`: a count that moves whenever the flows it reacts to may grow (it places flows,
        # or watches some); without it no reach is kept
        self.react_epoch: Callable[[], int] | None = None
        # (`pulls_bounds` with blockers) R of each unfinished flow (`reach_steps`) and the caller's `react_epoch` it
        # holds for, kept from a submit while nothing else was unfinished; None: not kept (a later submit)
        self._reach: Reach | None = None
        self._reach_epoch = -1
        # a subclass's placement of a flow: (its worker, or DRIVER; delay-free least time from post to end)
        self._place: Callable[[Flow], tuple[int, int]] | None = None
        # set by the caller: the earliest ns it may submit a flow other than after a completion it `reacts` to
        # (at least the `until` of the advance in progress; the fluid NVLink side's `submit_floor`)
        self.floor: Callable[[], int] | None = None
        self.prechecked = False  # set by a caller that runs `check_flow_batch` on every batch it submits (hybrid)
        # a batch of `submit_ordered` in progress: in topological order already, not searched again
        self._in_order = False
        # (src, dst) -> (its worker, latency + propagation, bottleneck bps) of a fabric pair `PieceRoutes` summarises
        self._pair_xfer: dict[tuple[int, int], tuple[int, int, int]] = {}
        # set by the caller: its own work while the workers run a round (asynchronous rounds), given the earliest
        # ns a completion it `reacts` to can come and `earliest_end` (the fluid NVLink side's `run_ahead`)
        self.meanwhile: Callable[[int, Callable[[int, int], int]], None] | None = None
        # set by the caller whose `meanwhile` waits on processes of its own (the fluid side's shards, `fluid_procs`):
        # their CPU so far on its critical path (per exchange the busiest, summed), counted beside its own meanwhile
        self.helper_cpu: Callable[[], float] | None = None
        self._react_ns = INF_NS  # the earliest ns a completion the caller reacts to can come (`_horizon`)
        self.rounds = 0
        self.round_wall_s = 0.0
        self.bound_wall_s = 0.0
        self.horizon_reads = 0  # (`pulls_bounds`) flows the horizon read past its first test, summed over rounds
        self.critical_cpu_s = 0.0  # per round, the CPU of its busiest worker, summed: the wall on free cores
        self.critical_wall_s = 0.0  # per round, the wall its slowest worker took to serve it, summed
        self.gather_wall_s = 0.0  # inside rounds: reading replies, bounds and releases here
        self.meanwhile_cpu_s = 0.0  # the caller's CPU while the workers ran (`meanwhile`), summed over rounds
        self.built_cpu_s = 0.0  # a drain's completions built while the workers ran (`_while_round`), summed
        self.overlap_cpu_s = 0.0  # per round, max(its busiest worker's CPU, the caller's meanwhile CPU + built), summed
        self.helper_meanwhile_cpu_s = 0.0  # (`helper_cpu`) its helpers' critical CPU while the workers ran, summed
        self.between_wall_s = 0.0  # between rounds: the caller (fluid NVLink side, submits) and the bound
        self.plan_cpu_s = 0.0  # (`plan_groups`) the busiest worker's CPU planning the caller's groups of ops, summed
        self.plan_wall_s = 0.0  # ... and the wall the caller waited for them (their start included)
        self._round_end: float | None = None
        self._rounding = False  # a round's replies are awaited (its `meanwhile` runs)
        self._beat = time.monotonic()  # when the workers last heard from us (`keepalive`)
        self._round_cpu = [0.0] * n  # per worker, the CPU its rounds took
        self._records: dict[str, list[Any]] | None = None
        self._records_at = -1
        self._closed = False
        self._freezer = Freezer()  # a large submit freezes the process's objects (`FREEZE_MIN`): thawed at close
        assignment = [[p for p, w in enumerate(self._piece_worker) if w == i] for i in range(n)]
        sides = () if self.worker_side == "packet" else (self.worker_side,)
        self._pool = spawn(self.topology, self.config, assignment, *sides)  # it cleans up after itself if it fails

    def plan_groups(self, jobs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """Groups of a workload's ops planned on the workers (`phantora.plan_split`: `replay.plan_split_by`'s `run`),
        the busiest one's CPU kept (`plan_cpu_s`, on the critical path); None when the pool cannot plan."""
        plan = getattr(self._pool, "plan", None)
        if plan is None:
            return None
        t0 = time.perf_counter()
        replies, cpu = plan(jobs)
        self.plan_cpu_s += cpu
        self.plan_wall_s += time.perf_counter() - t0
        return replies  # type: ignore[no-any-return]

    def _check_config(self, config: PacketConfig) -> None:
        if config.workers < 1 or config.nic_latency < 1:
            raise PhantoraError("decomposition needs workers >= 1 and nic_latency > 0")

    def _layout(self) -> tuple[Any, list[int], int]:
        """(what summarises a fabric flow's route as (piece, propagation ns, bottleneck bps): `of(flow)`, the
        worker of each piece, the number of workers): the fabric's pieces, round-robin on the workers."""
        self.pieces = fabric_pieces(self.topology)
        count = max(self.pieces) + 1
        n = min(self.config.workers, max(count, 1))
        return PieceRoutes(self.topology, self.pieces), [p % n for p in range(count)], n

    @property
    def workers(self) -> Sequence[Any]:
        """The workers' handles (the spawner's), in index order."""
        return self._pool.workers

    def shard_links(self) -> list[Callable[[], Any]] | None:
        """One connector a worker to a fluid shard served in its process (`bridge.workers.ServerPool.fluid_shard`:
        `fluid_procs.ProcShardedFluid`'s ``links``); None if its workers serve none (Ray's, or a pool without)."""
        get = getattr(self._pool, "fluid_shard", None)
        if get is None:
            return None
        links = [get(w.index) for w in self._pool.workers]
        return None if any(link is None for link in links) else links

    @property
    def beat_source(self) -> WorkerPool:
        """The pool, which passes on its workers' progress from inside a round if it can (`on_beat`,
        `phantora.netsim.heartbeat.attach_beats`)."""
        return self._pool

    # ----- rounds ------------------------------------------------------------------------------
    def _round(self, horizon: int) -> None:
        """Hand every worker its new flows and gates and run all of them, in parallel, to `horizon` (INF_NS:
        until idle); gather the completions. A worker whose next event is past `horizon` is skipped."""
        self._rounded(horizon, None)

    def _rounded(self, horizon: int, own: Callable[[], None] | None) -> None:
        """`_round`; with `own` (`_placing`), only the workers with new flows, each to its now(), while this driver
        runs `own`."""
        t0 = time.perf_counter()
        if self._round_end is not None:
            self.between_wall_s += t0 - self._round_end
        posts: dict[int, tuple[int, Outbox, int]] = {}
        for i in range(len(self._out)):
            out = self._out[i]
            nxt = self._next[i]
            h = horizon if self._hz is None or own is not None else self._hz[i]  # (each at least `horizon`)
            if (own is not None and not out.flows) or (out.empty() and nxt is not None and nxt > h):
                continue  # (None: no flow in flight, but ACKs and timers may still run: records count them)
            self._out[i] = Outbox()
            posts[i] = (self._wtime, out, max(h, self._wnow[i]))
        replies = self._pool.round(posts)  # sent: the workers run while the caller does its own work
        self._rounding = True
        mine = helped = 0.0
        if own is not None:
            c0 = time.process_time()
            own()
            mine = time.process_time() - c0
        elif self.meanwhile is not None and posts:
            helper = self.helper_cpu
            h0 = 0.0 if helper is None else helper()
            c0 = time.process_time()
            self.meanwhile(self._react_ns, self.earliest_end)
            mine = time.process_time() - c0
            if helper is not None:  # (the caller waited on its helpers: their CPU is on its path, after its own)
                helped = helper() - h0
                self.helper_meanwhile_cpu_s += helped
                mine += helped
        built = 0.0
        if own is None and self._handed is not None:  # (a drain: its completions built meanwhile)
            c0 = time.process_time()
            self._while_round()
            built = time.process_time() - c0
        busiest = slowest = gather = 0.0
        for i, reply in replies:
            g0 = time.perf_counter()
            self._gathered(reply.completions, i)
            self._bounds(reply.bounds)
            gather += time.perf_counter() - g0
            self._round_cpu[i] += reply.cpu
            busiest = max(busiest, reply.cpu)
            slowest = max(slowest, reply.wall)
            self._wnow[i] = reply.now
            self._next[i] = reply.next_event
            self._in_flight[i] = reply.in_flight
        self._rounding = False
        if own is None:
            self._wtime = horizon if horizon < INF_NS else max(self._wtime, *self._wnow)
        self.rounds += 1
        self.critical_cpu_s += busiest
        self.meanwhile_cpu_s += mine - helped
        self.built_cpu_s += built
        self.overlap_cpu_s += max(busiest, mine + built)
        self.critical_wall_s += slowest
        self.gather_wall_s += gather
        self._round_end = time.perf_counter()
        self.round_wall_s += self._round_end - t0

    def _placing(self, own: Callable[[], None]) -> None:
        """A round that only hands the workers their new flows (each runs to its now(), where it already is: no
        event of a new flow comes before it, `_check_post`), while this driver runs `own`: the books of a large
        batch (`submit`) are kept while the workers place their flows, not before."""
        self._rounded(-1, own)

    def _while_round(self) -> None:
        """This engine's own work while the workers run a round: what `drain` handed out, built (nothing of it
        gates the round after: the drain's caller reacts to no completion)."""
        self._build_handed()

    def _build_handed(self) -> None:
        if self._handed:
            self._drained += built(self._handed)
            self._handed = []

    def _gathered(self, done: Sequence[Completion], worker: int) -> None:
        """Completions from a worker: buffered for the caller; what they release here (gates, markers) goes out.
        A reply's `CompletionColumns` are booked from its id and end columns and buffered unbuilt."""
        if isinstance(done, CompletionColumns):
            ids, ends = done.ids, done.ends
        else:
            ids = [c.flow_id for c in done]
            ends = [c.end_ns for c in done]
        bounds = list(map(self._lb.pop, ids, repeat(0)))  # (their bounds, dropped: per completion at C speed)
        if any(map(operator.lt, ends, bounds)):
            k = next(k for k, (e, b) in enumerate(zip(ends, bounds, strict=True)) if e < b)
            raise PhantoraError(f"internal: flow {ids[k]} ended at {ends[k]} ns, before its bound {bounds[k]} ns")
        self._buffer.add(ends, ids, done)  # (a run of its own: no per-completion work here but a check of its order)
        self._arrived(done, ids, ends, worker)

    def _bounds(self, flat: list[int]) -> None:
        """A worker's completion bounds of its started flows ([id, ns, ...], those that rose): lb only grows."""
        lbs, waiting = self._lb, self._dependents
        if self.pulls_bounds:  # (C of `pulled_bounds`: one max a bound, nothing walked)
            if flat:
                self._memo, self._memo_wide = {}, {}
            for fid, ns in zip(flat[0::2], flat[1::2], strict=True):
                if ns > lbs.get(fid, INF_NS):
                    lbs[fid] = ns
            return
        for fid, ns in zip(flat[0::2], flat[1::2], strict=True):
            if ns > lbs.get(fid, INF_NS):
                if fid in waiting:
                    self._raise(fid, ns)
                else:
                    lbs[fid] = ns  # (what `_raise` does for a flow nothing waits on)

    def _raise(self, fid: int, ns: int) -> None:
        """lb(fid) >= ns, and so on down its dependents: each ends no earlier than a dep's lb + its step. A dependent
        whose lb is already as high is not pushed (lb only grows: it would be skipped when popped)."""
        lbs, waiting, step = self._lb, self._dependents, self._step
        get, step_of = lbs.get, step.get
        todo = [(fid, ns)]
        pop, push = todo.pop, todo.append
        while todo:
            f, t = pop()
            if t <= get(f, INF_NS):
                continue
            lbs[f] = t
            for j in waiting.get(f, ()):
                s = step_of(j)
                if s is not None and t + s > get(j, INF_NS):
                    push((j, t + s))

    def _arrived(
        self,
        done: Sequence[Completion],
        ids: list[int] | None = None,
        stamps: list[int] | None = None,
        worker: int = -1,
    ) -> None:
        """Record ends; open the gates and complete the markers they release (markers may release more). `ids` and
        `stamps`: the flow ids and ends of `done`, when the caller has them (and has dropped their bounds), all of
        `worker`'s flows if it is given."""
        popped = ids is not None
        lbs, step, waiting = self._lb, self._step, self._dependents
        while done:
            if ids is None or stamps is None:
                ids = [c.flow_id for c in done]
                stamps = [c.end_ns for c in done]
            # (first all ends, so that no flow done here has its bound raised below; per completion: at C speed)
            self._ends.update(zip(ids, stamps, strict=True))
            self._ended(ids, stamps)
            if not popped:
                _drop(map(lbs.pop, ids, repeat(None)))
            if self.tracks_unfinished:
                _drop(map(step.pop, ids, repeat(None)))
                for unfinished in self._unfinished if worker < 0 else (self._unfinished[worker],):
                    unfinished.difference_update(ids)  # (a marker's id is in none: its owner is the driver)
                if self._blockers is not None:
                    if worker < 0:
                        self._blockers.ended_anywhere(ids, self._unfinished, self._up)
                    else:
                        self._blockers.ended(ids, worker, self._unfinished[worker], self._up)
            self._ext.difference_update(ids)
            if self.pulls_bounds:
                _drop(map(self._up.pop, ids, repeat(None)))
                self._memo, self._memo_wide = {}, {}
            for fid, end in zip(ids, stamps, strict=True) if self.raises_dependents and not self.pulls_bounds else ():
                for j in waiting.pop(fid, ()):  # (per dependency edge: `_raise` inlined where nothing waits)
                    s = step.get(j)
                    if s is None:  # (done already)
                        continue
                    t = end + s
                    if t <= lbs.get(j, INF_NS):
                        continue
                    if j in waiting:
                        self._raise(j, t)
                    else:
                        lbs[j] = t
            markers = []
            rel = self._rel
            waited = list(rel.waited_on(ids))  # (a gate or marker waits on few: by id and end, nothing built)
            released = rel.ended(compress(ids, waited), compress(stamps, waited)) if any(waited) else []
            k = 0
            while k < len(released):
                g, p = released[k]
                k += 1
                if g.id >= JOIN_BASE:  # the deps of a wide list are done at p: its gates open
                    self._joins_held -= 1
                    released += rel.complete([Completion(g.id, p, p, 0, g.src, g.dst)])
                elif g.id < 0:  # a gate: the flow's deps on other workers and markers are done at p
                    fid = -1 - g.id
                    self._gates_held -= 1
                    self._check_post(fid, p)
                    self._out[self._owner[fid]].gates.append([fid, p])
                else:
                    c = Completion(g.id, p, p, g.size, g.src, g.dst, g.tag)
                    self._buffer.add_one(p, g.id, c)
                    markers.append(c)
            done, ids, stamps, popped, worker = markers, None, None, False, -1

    def _ended(self, ids: list[int], ends: list[int]) -> None:
        """Flows done at `ends` (recorded): for a subclass that carries bounds across rounds."""

    def _check_post(self, fid: int, p: int) -> None:
        """A flow released at p sends from p + L: its worker must not have run past p + L - 1 (p, for a flow with
        no lookahead)."""
        w = self._owner[fid]
        ahead = 1 if self._zero is not None and fid in self._zero else self._ahead
        if p + ahead - 1 < self._wnow[w]:
            raise CausalityError(f"internal: flow {fid} posted at {p} ns, but worker {w} is at {self._wnow[w]} ns")

    # ----- NetworkSimulator --------------------------------------------------------------------
    def submit(self, flows: Sequence[Flow], at: int) -> None:
        """Add flows eligible from `at` (>= now()); a fabric flow must stay inside one piece."""
        if at < self._now:
            raise CausalityError(f"flows submitted at {at} ns but the network is already at {self._now} ns")
        self.keepalive()
        if self.prechecked:
            check_packet_fields(flows)
        else:
            check_packet_batch(flows, self.topology, self._owner.__contains__)
        xfer = {}
        owner, routes, piece_worker, latency = self._owner, self._routes, self._piece_worker, self.latency
        place, pairs = self._place, self._pair_xfer
        for f in flows:  # (per flow: kept lean)
            if place is not None:
                owner[f.id], xfer[f.id] = place(f)
            elif f.size > 0 and f.src != f.dst:  # (`uses_nic`)
                got = pairs.get((f.src, f.dst))
                if got is None:
                    piece, propagation, bottleneck = routes.of(f)
                    got = (piece_worker[piece], latency + propagation, bottleneck)
                    if routes.summary(f.src, f.dst) is not None:  # (the same for every flow of the pair)
                        pairs[(f.src, f.dst)] = got
                owner[f.id] = got[0]
                xfer[f.id] = got[1] + f.size * 8_000_000_000 // got[2]
            else:
                owner[f.id] = DRIVER
                xfer[f.id] = 0
        if self._wtime >= INF_NS:
            self._wtime = self._now
        order = flows if self._in_order else topological_order(flows, {f.id: f for f in flows})
        fresh = not self._lb  # (nothing else unfinished: the reach of this batch is every flow's)
        self._reach = None
        if not self.hands_over or len(order) < HAND_OVER_MIN or self._rounding:  # (`meanwhile` may submit)
            self._book(order, at, xfer, handed=False)
            self._reached(order, fresh)
            return
        # A large batch: hand the workers their flows first, in a round that runs none of them further than it is
        # (`_placing`), and keep the books while they place them (the driver's bounds, gates and joins).
        self._freezer.freeze()  # (the caller's DAG: `FREEZE_MIN`)
        try:
            self._hand_over(order, at)

            def books() -> None:
                self._book(order, at, xfer, handed=True)
                self._reached(order, fresh)

            if getattr(self._pool, "starting", False):  # the workers still start: the books now, beside their start
                books()
                self._placing(lambda: None)
            else:
                self._placing(books)
        except BaseException:  # (a failed submit thaws what it froze, closed or not: the freeze is process-wide)
            self._thaw()
            raise
        self._freezer.freeze()  # (the books)

    def submit_outer(self, flows: Sequence[Flow], at: int, outer: Collection[int]) -> None:
        """`submit`; each flow in `outer` also waits on deps outside the packet side (not among its `deps`), behind an
        outer gate the caller opens at their last end (`open_outer`): it is posted at max(`at`, its deps' ends, that
        ns), exactly as if it were submitted then with its deps here."""
        if not self.opens_outer:
            raise PhantoraError(f"internal: {type(self).__name__} takes no flow behind an outer gate")
        self._outer = outer
        try:
            self.submit(flows, at)
        finally:
            self._outer = ()

    def submit_ordered(self, flows: Sequence[Flow], at: int, outer: Collection[int] = ()) -> None:
        """`submit` (`submit_outer` with `outer`) of a batch its caller put in topological order, every flow after
        its deps in the batch (the hybrid's `_place` hands its flows so): the order is not searched again."""
        self._in_order = True
        try:
            if outer:
                self.submit_outer(flows, at, outer)
            else:
                self.submit(flows, at)
        finally:
            self._in_order = False

    def open_outer(self, ids: Sequence[int], at: int) -> list[int]:
        """The outer deps of flows `ids` (`submit_outer`) have all ended by `at`: each one's gate opens once its deps
        on other workers have ended too, and its bound is at least `at` + its step. Returns the flows the horizon
        reads from now on: those of `ids` and the flows waiting on them whose last closed outer gate was theirs."""
        lbs, step, owner, unfinished = self._lb, self._step, self._owner, self._unfinished
        deferred, deferring, blockers = self._deferred, self._deferring, self._blockers
        woke: list[int] = []
        pushes = self.raises_dependents and not self.pulls_bounds  # (the pushed walk: the rise down its dependents)
        for fid in ids:
            t = at + step[fid]
            if t > lbs[fid]:
                if pushes:
                    self._raise(fid, t)
                else:
                    lbs[fid] = t
            todo = [fid]
            while todo:
                j = todo.pop()
                n = deferred[j] - 1
                if n:
                    deferred[j] = n
                    continue
                del deferred[j]
                w = owner[j]
                unfinished[w].add(j)
                if blockers is not None:
                    blockers.add(j, w, self._up.get(j, ()), unfinished[w])
                woke.append(j)
                nxt = deferring.pop(j, None)
                if nxt is not None:
                    todo += nxt
        self._memo, self._memo_wide = {}, {}  # (bounds rose)
        alone, outs, keyed = self._outer_at, self._out, []
        for fid in ids:
            a = alone.pop(fid, None)
            if a is None:  # (a gate in `_rel`: on its deps on other workers too)
                keyed.append(outer_key(fid))
                continue
            p = a if a > at else at
            self._check_post(fid, p)
            outs[owner[fid]].gates.append([fid, p])
        for g, p in self._rel.ended(keyed, repeat(at, len(keyed))):
            fid = -1 - g.id  # (a gate: only gates wait on an outer key)
            self._gates_held -= 1
            self._check_post(fid, p)
            outs[owner[fid]].gates.append([fid, p])
        return woke

    def _hand_over(self, order: Sequence[Flow], at: int) -> None:
        """Each flow of a batch (in topological order) into its worker's outbox: its deps on that worker not done,
        its posting ns (`at` or its done deps' latest end), gated if it waits on a flow elsewhere or a marker."""
        owner, ends, outs = self._owner, self._ends, self._out
        wide: dict[tuple[tuple[int, ...], int], tuple[int, Sequence[int], bool]] = {}
        flows = [out.flows for out in outs]
        posts = [out.at for out in outs]
        gateds = [out.gated for out in outs]
        none: tuple[int, ...] = ()
        for f in order:  # (per flow: kept lean; a flow with one dep, most of a ring's, without a loop)
            fid = f.id
            w = owner[fid]
            if w == DRIVER:
                continue
            deps = f.deps
            if len(deps) == 1:
                d = deps[0]
                end = ends.get(d)
                if end is not None:
                    flows[w].append((f, none))
                    posts[w].append(end if end > at else at)
                elif owner[d] == w:
                    flows[w].append((f, deps))
                    posts[w].append(at)
                else:
                    flows[w].append((f, none))
                    posts[w].append(at)
                    gateds[w].append(fid)
                continue
            if not deps:
                flows[w].append((f, none))
                posts[w].append(at)
                continue
            many = len(deps) >= SHARED_DEPS_MIN
            got = wide.get((deps, w)) if many else None
            if got is None:
                a, local, gated = at, [], False
                for d in dict.fromkeys(deps):
                    end = ends.get(d)
                    if end is not None:
                        if end > a:
                            a = end
                    elif owner[d] == w:
                        local.append(d)
                    else:
                        gated = True
                got = (a, local, gated)
                if many:
                    wide[(deps, w)] = got
            a, loc, gated = got
            flows[w].append((f, loc))
            posts[w].append(a)
            if gated:
                gateds[w].append(fid)
        if self._outer:  # (flows behind an outer gate and not gated above: gated too)
            outer, done = self._outer, set().union(*gateds)
            for f in order:
                if f.id in outer and f.id not in done:
                    gateds[owner[f.id]].append(f.id)

    def _book(self, order: Sequence[Flow], at: int, xfer: dict[int, int], *, handed: bool) -> None:
        """The driver's books for a batch in topological order: bounds, dependents, gates and joins; markers
        completed; into the outboxes too unless `_hand_over` put the flows there (`handed`)."""
        released: list[Completion] = []
        owner, zero, deps_of, targets = self._owner, self._zero, self._deps_of, self._targets
        ends, lbs, waiting, steps = self._ends, self._lb, self._dependents, self._step
        lists = WideDeps()  # wide deps lists repeated in this batch, by (list, worker)
        shared: dict[tuple[int, int], _SharedDeps] = {}  # what `_shared_deps` read of each
        joins: dict[int, int] = {}  # id of a wide list's `_SharedDeps` -> the join its gates wait on
        targeted: set[tuple[int, bool]] = set()  # (id of a `_SharedDeps`, no lookahead) whose targets are set
        kin, track = self.raises_dependents and not self.pulls_bounds, self.tracks_unfinished
        up = self._up if self.pulls_bounds else None
        outer, deferred, deferring, blockers = self._outer, self._deferred, self._deferring, self._blockers
        held_wide: dict[int, list[int]] = {}  # id of a `_SharedDeps` -> its deferred deps (none opens while booking)
        ext, unfinished, wnow, ahead, outs = self._ext, self._unfinished, self._wnow, self._ahead, self._out
        none: tuple[int, ...] = ()
        for f in order:  # (per flow, and per dependency edge: kept lean, a flow of one dep without a loop)
            fid = f.id
            w = owner[fid]
            deps = f.deps
            local: Sequence[int]
            cross: Sequence[int]
            memo: _SharedDeps | None = None
            if len(deps) >= SHARED_DEPS_MIN:
                wide, key = lists.key(deps, w)
                memo = shared.get(key)
                if memo is None:
                    memo = shared[key] = self._shared_deps(wide, w)
                a, lb = max(at, memo.ended), max(at, memo.lb)
                for dependents in memo.waiting:
                    dependents.append(fid)
                local, cross = memo.local, memo.cross
            elif len(deps) == 1:  # (`else`'s loop for one dep)
                d = deps[0]
                end = ends.get(d)
                if end is not None:
                    a = lb = end if end > at else at
                    local = cross = none
                else:
                    a = at
                    x = lbs[d]
                    lb = x if x > at else at
                    if kin:
                        ws = waiting.get(d)
                        if ws is None:
                            waiting[d] = [fid]
                        else:
                            ws.append(fid)
                    if w != DRIVER and owner[d] == w:
                        local, cross = [d], none
                    else:
                        local, cross = none, [d]
                        if owner[d] != DRIVER:
                            ext.add(d)
            else:
                a, lb = at, at
                local, cross = [], []
                for d in dict.fromkeys(deps):  # (per dependency edge: kept lean)
                    end = ends.get(d)
                    if end is not None:
                        if end > a:  # (lb >= a: so end <= a leaves both)
                            a = end
                            lb = max(lb, end)
                        continue
                    x = lbs[d]
                    if x > lb:
                        lb = x
                    if kin:
                        ws = waiting.get(d)
                        if ws is None:
                            waiting[d] = [fid]
                        else:
                            ws.append(fid)
                    (local if w != DRIVER and owner[d] == w else cross).append(d)
                if cross:
                    ext.update(d for d in cross if owner[d] != DRIVER)
            if zero is not None and cross:
                z = w == DRIVER or fid in zero
                if targets is not None and (memo is None or (id(memo), z) not in targeted):
                    if memo is not None:  # (the same for every flow of the batch sharing the list)
                        targeted.add((id(memo), z))
                    for d in cross:
                        if owner[d] != DRIVER:
                            targets.setdefault(d, set()).add((w, z))
            if deps_of is not None:
                deps_of[fid] = deps if memo is None else memo.deps
            if up is not None and (local or cross):  # (unfinished deps: L pulled through them)
                up[fid] = deps if memo is None else memo.deps
            s = steps[fid] = f.delay_ns + xfer[fid]
            lbs[fid] = lb + s
            mine = bool(outer) and fid in outer  # (behind an outer gate, closed)
            shut = 1 if mine else 0
            if w == DRIVER:
                if shut:
                    raise PhantoraError(f"internal: marker {fid} submitted behind an outer gate")
                bare = f if len(cross) == len(deps) else f.with_deps(tuple(cross))
                for m, p in self._rel.add([bare], a):
                    c = Completion(m.id, p, p, m.size, m.src, m.dst, m.tag)
                    self._buffer.add_one(p, m.id, c)
                    released.append(c)
                continue
            if a + (1 if zero is not None and fid in zero else ahead) - 1 < wnow[w]:  # (`_check_post`, inline)
                self._check_post(fid, a)
            if deferred:  # (a flow waiting on a deferred flow is deferred with it)
                got = None if memo is None else held_wide.get(id(memo))
                if got is not None:
                    waits = got
                elif memo is None:
                    waits = [d for d in (*local, *cross) if d in deferred] if local or cross else []
                else:
                    waits = held_wide[id(memo)] = [d for d in (*memo.local, *memo.cross) if d in deferred]
                for d in waits:
                    deferring.setdefault(d, []).append(fid)
                shut += len(waits)
            if shut:
                deferred[fid] = shut
            elif track:
                mates = unfinished[w]
                mates.add(fid)
                if blockers is not None:
                    blockers.add(fid, w, deps, mates)
            if not handed:
                out = outs[w]
                out.flows.append((f, local))
                out.at.append(a)
                if cross or mine:
                    out.gated.append(fid)
            if mine and not cross:  # (its outer gate alone: opened at max(a, the caller's ns), no pseudo flow)
                self._outer_at[fid] = a
            elif cross or mine:
                gate_deps = tuple(cross)
                if memo is not None and cross:  # the gates sharing a wide list wait on one join of it
                    j = joins.get(id(memo))
                    if j is None:
                        j = joins[id(memo)] = self._next_join
                        self._next_join += 1
                        self._joins_held += 1
                        self._rel.add([Flow(j, f.src, f.dst, 0, gate_deps)], a)
                    gate_deps = (j,)
                if mine:
                    gate_deps = (*gate_deps, outer_key(fid))
                self._rel.add([Flow(gate_key(fid), f.src, f.dst, 0, gate_deps)], a)
                self._gates_held += 1
        self._arrived(released)

    def _reached(self, order: Sequence[Flow], fresh: bool) -> None:
        """Keep R of a batch just booked (`reach_steps`) if nothing else was unfinished and the horizon reads the
        blockers' lists with a caller that says when its reactions may grow."""
        react, epoch = self.reacts, self.react_epoch
        if not fresh or self._blockers is None or react is None or epoch is None:
            return
        ext = self._ext
        self._reach = least_reach(order, self._up, self._step, lambda f: f in ext or react(f))
        self._reach_epoch = epoch()

    def _shared_deps(self, deps: tuple[int, ...], w: int) -> _SharedDeps:
        """What `submit` reads from a deps list, read once for the flows of a batch that share it (an all-to-all's
        dependents each wait on every flow of the one before): nothing changes the ends, bounds and waiting lists
        it reads while the batch is placed (its flows come after their deps; completions are handled after)."""
        ends, lbs, waiting, owner = self._ends, self._lb, self._dependents, self._owner
        ended = lb = -1
        local: list[int] = []
        cross: list[int] = []
        lists: list[list[int]] = []
        for d in dict.fromkeys(deps):
            end = ends.get(d)
            if end is not None:
                ended = max(ended, end)
                continue
            lb = max(lb, lbs[d])
            if self.raises_wide and not self.pulls_bounds:
                lists.append(waiting.setdefault(d, []))
            (local if w != DRIVER and owner[d] == w else cross).append(d)
        self._ext.update(d for d in cross if owner[d] != DRIVER)
        return _SharedDeps(deps, ended, max(ended, lb), local, cross, lists)

    def earliest_end(self, fid: int, need: int = INF_NS) -> int:
        """The earliest ns flow `fid` can complete (its bound; its end once gathered); if that is `need` or later, a
        lower bound of it at least `need` may come instead (the pull stops there: a caller after the least of some
        flows' ends passes the least so far)."""
        end = self._ends.get(fid)
        if end is not None:
            return end
        if self.pulls_bounds:
            return pull(fid, self._lb, self._ends, self._up, self._step, self._memo, self._memo_wide, need)
        return self._lb[fid]

    def advance_to_completion(self, until: int) -> list[Completion]:
        """Run to `until` but return right after the first ns at which any flow completes (now() is that ns).
        With no limit it also returns once nothing can happen any more."""
        return built(self._handout(until, False))

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        """Run until nothing is in flight; now() ends at the last completion. Raise past limit_ns. The rounds of
        `drain_by_completions` (one `advance_to_completion` after another), but what is gathered up to the workers'
        time is handed out at once, not a ns at a time, and its objects are built while the workers run the next
        round (`_while_round`): a drain's caller reacts to no completion, so nothing of it gates a round."""
        limit = INF_NS if limit_ns is None else limit_ns
        self._handed, self._drained = [], []
        try:
            while self.in_flight():
                got = self._handout(limit, True)
                if not got:
                    left = self.in_flight()
                    if limit < INF_NS and self._now >= limit:
                        raise PhantoraError(f"the network did not drain by {limit} ns: {left} flows still in flight")
                    raise PhantoraError(f"{left} flows can never start: they wait on flows that never complete")
                self._handed += got
            self._build_handed()  # (the last round's)
            return self._drained
        finally:
            self._handed, self._drained = None, []

    def _handout(self, until: int, bulk: bool) -> list[Segment]:
        """`advance_to_completion`'s completions, unbuilt (segments of the buffer's runs); with `bulk`, every one
        gathered up to min(`until`, the workers' time) at once (now() is the last one's end)."""
        if until < self._now:
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {self._now} ns")
        self.keepalive()  # (the caller may step a long fluid stretch between rounds, one call per step)
        while True:
            buf = self._buffer
            t = min(self._wtime, until)
            first = buf.earliest()
            if first is not None and first <= t:
                got, self._now = buf.take(t if bulk else first)
                return got
            if until < INF_NS and self._wtime >= until:
                self._now = until
                return []
            if until >= INF_NS and (self.in_flight() == 0 or self._earliest() is None):
                return []
            horizon, ended = self._horizon(until), len(self._ends)
            self._round(horizon)
            if horizon >= INF_NS and len(self._ends) == ended and not self._buffer:
                if all(o.empty() for o in self._out):
                    if until >= INF_NS:
                        return []  # nothing moved in an unbounded round: what is left waits forever
                    # Every worker ran until idle and nothing completed: no completion can come before the caller's
                    # next flow, which it posts at `until` or later. (The caller's floor may be past `until`, e.g.
                    # the fluid side's last flows: then E is unbounded and this round ran with no horizon.)
                    self._wtime = max(self._wtime, until)

    def _horizon(self, until: int) -> int:
        """How far every worker may run: up to E + L - 1, E the earliest ns at which a flow could be handed to
        any worker: `until` (the caller submits nothing before; its `floor` when it says more: no submission
        before it but after a completion it reacts to), or the earliest end of a flow a gate or a
        marker here waits on, or one the caller acts on (`reacts`; every flow when unset), or a marker ahead
        in the buffer. A flow's earliest end is max(its bound lb, its worker's next event, now + 1); lb starts
        static (at submit) and rises with the workers' completion bounds (`_bounds`) and its deps' (`_raise`; with
        `pulls_bounds`, the same values pulled from its deps where read, `_least_ends`).
        The least of those ends over the flows the caller reacts to is kept for `meanwhile` (`_react_ns`)."""
        t0 = time.perf_counter()
        react, ext, lbs = self.reacts, self._ext, self._lb
        e = until if self.floor is None else max(until, self.floor())
        r = INF_NS  # the earliest end of a flow the caller reacts to
        for t, fid in self._buffer.pairs():  # (first: the least so far bounds each worker's read below)
            if react is None or react(fid):
                r = min(r, t)
                if t > self._wtime:
                    e = min(e, t)
        for w, ids in enumerate(self._unfinished):
            if not ids:
                continue
            nxt = self._next[w]
            floor = self._wtime + 1 if not self._out[w].empty() or nxt is None else max(self._wtime + 1, nxt)
            if self.pulls_bounds:  # (read from (e, r): only a flow that lowers them is read to its end)
                # (each buffered end is past _wtime here, `_handout`'s, so each reacting one lowered e; m <= mr)
                assert e <= r, f"internal: horizon read from e {e} ns past r {r} ns (`least_ends` needs s <= sr)"
                m, mr = self._least_ends(ids, floor, (e, r))
            elif react is None:
                m = mr = min(lbs[f] for f in ids)
            else:
                mr = min((lbs[f] for f in ids if react(f)), default=INF_NS)
                m = min(mr, min((lbs[f] for f in ids if f in ext), default=INF_NS))
            if m >= INF_NS:
                continue
            e = min(e, max(m, floor))
            r = min(r, max(mr, floor))
        self._react_ns = r
        self.bound_wall_s += time.perf_counter() - t0
        return e + self._ahead - 1 if e < INF_NS else INF_NS

    def _least_ends(self, ids: set[int], floor: int, start: tuple[int, int] = (INF_NS, INF_NS)) -> tuple[int, int]:
        """`_horizon`'s (m, mr) of one worker's unfinished flows `ids` (`pulls_bounds`): the least L of those the
        caller reacts to or a gate or marker here waits on, and of those it reacts to (INF_NS: none); both exact unless
        both are at most `floor`, all the horizon reads (max(., floor)); with `start`, the horizon's least so far
        (e, r), each capped by it (`least_ends`): min(e, max(m, floor)) and min(r, max(mr, floor)) are the same. By
        `least_bounds.least_ends`."""
        books = (self._lb, self._ends, self._up, self._step, self._memo, self._memo_wide)
        got = self._blockers
        if got is None:
            m, mr, reads = least_ends(ids, floor, self.reacts, self._ext, *books, start=start)
        else:  # (its free flows, and the flows under a flow read where it cannot bound them: `blockers`)
            w = next(w for w, mine in enumerate(self._unfinished) if mine is ids)
            reach = self._reach
            if reach is not None and (self.react_epoch is None or self.react_epoch() != self._reach_epoch):
                reach = self._reach = None  # (the caller's reactions may have grown: R no longer bounds them)
            m, mr, reads = least_ends(got.free[w], floor, self.reacts, self._ext, *books, got.below, reach, start)
        self.horizon_reads += reads
        return m, mr

    def _earliest(self) -> int | None:
        """The earliest ns anything can still happen: workers' next events, flows not handed over, buffered ends."""
        times = [t for t in self._next if t is not None]
        times += [a + self.latency for out in self._out for a in out.at]
        times += [p + self.latency for out in self._out for _, p in out.gates]
        first = self._buffer.earliest()
        if first is not None:
            times.append(first)
        return min(times) if times else None

    def next_event_time(self) -> int | None:
        return self._earliest()

    def now(self) -> int:
        return self._now

    def in_flight(self) -> int:
        markers = self._rel.held() - self._gates_held - self._joins_held
        return markers + sum(self._in_flight) + sum(len(o.flows) for o in self._out) + len(self._buffer)

    def stats(self) -> dict[str, object]:
        """The workers' counters summed (busiest switch link: max, least busy: min), per worker in `workers`."""
        per = []
        out: dict[str, object] = {}
        for w in self.workers:
            s = self._pool.stats(w.index)
            s = {k: v for k, v in s.items() if k not in ("decompose", "approximations")}
            per.append({"worker": w.index, "pid": w.pid, "pieces": w.pieces, **s})
            for k, v in s.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or k == "nic_latency_ns":
                    out.setdefault(k, v)
                elif k == "switch_link_bytes_min":
                    out[k] = min(v, out.get(k, v))  # type: ignore[call-overload]
                elif k == "switch_link_bytes_max":
                    out[k] = max(v, out.get(k, v))  # type: ignore[call-overload]
                else:
                    out[k] = out.get(k, 0) + v  # type: ignore[operator]
        out["workers"] = per
        out["decompose"] = {
            **self.config.decompose_settings(),
            "workers": len(self.workers),
            "curve": self._pool.curve,  # the workers' sockets are CurveZMQ (encrypted, allow-listed)
            "pieces": max(self.pieces) + 1,
            "rounds": self.rounds,
            "round_wall_s": round(self.round_wall_s, 6),
            "bound_wall_s": round(self.bound_wall_s, 6),
            "critical_cpu_s": round(self.critical_cpu_s, 6),
            "critical_wall_s": round(self.critical_wall_s, 6),  # per round, the slowest worker's serving wall
            "gather_wall_s": round(self.gather_wall_s, 6),  # inside rounds: replies, bounds, releases here
            "meanwhile_cpu_s": round(self.meanwhile_cpu_s, 6),  # the caller's own work while the workers ran
            "built_cpu_s": round(self.built_cpu_s, 6),  # a drain's completions built while the workers ran
            "overlap_cpu_s": round(self.overlap_cpu_s, 6),  # per round max(busiest worker, meanwhile + built), summed
            # (`helper_cpu`: the fluid side's shard processes) their critical CPU in all, and while the workers ran
            # (inside overlap_cpu_s; the rest is on the path between rounds)
            "helper_cpu_s": round(0.0 if self.helper_cpu is None else self.helper_cpu(), 6),
            "helper_meanwhile_cpu_s": round(self.helper_meanwhile_cpu_s, 6),
            "between_wall_s": round(self.between_wall_s, 6),  # between rounds: the caller and the bound
            "round_cpu_s": [round(c, 6) for c in self._round_cpu],
            "plan_cpu_s": round(self.plan_cpu_s, 6),  # groups of ops planned on the workers: the busiest one's CPU
            "plan_wall_s": round(self.plan_wall_s, 6),
        }
        out["approximations"] = self.config.approximations()  # decomposition is exact: not listed
        return out

    def close(self) -> None:
        """Tell every worker to exit; the pool ends the ones still there."""
        if self._closed:
            return
        self._closed = True
        self._thaw()
        if getattr(self, "_pool", None) is not None:
            self._pool.close()

    def _thaw(self) -> None:
        """What a large submit froze goes back to the collector (cycles among it are collected again), unless objects
        were frozen before it (`Freezer`)."""
        if getattr(self, "_freezer", None) is not None:  # (None until __init__ sets it)
            self._freezer.thaw()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            try:
                self.close()
            except Exception:  # noqa: BLE001 - interpreter shutdown
                pass

    def keepalive(self) -> None:
        """Heartbeat every worker if we have been silent `KEEPALIVE_S` (cheap otherwise: the caller may call it
        at every step of a long stretch of its own work, e.g. the fluid NVLink side's `run_ahead`), so no worker
        waiting for its next round passes its silence limit (`WORKER_PEER_TIMEOUT_S`)."""
        t = time.monotonic()
        if t - self._beat >= KEEPALIVE_S:
            self._beat = t
            self._pool.keepalive()

    def channels(self) -> DecomposedSimulator:
        return self

    def fabric(self) -> DecomposedSimulator:
        return self

    # ----- FabricObserver: each link's records come from the worker owning it ---------------------------
    def _gather(self, elapsed: int | None = None) -> dict[str, list[Any]]:
        at = self._now if elapsed is None else elapsed
        if self._records is not None and self._records_at == at:
            return self._records
        merged: dict[str, list[Any]] = {}
        for w in self.workers:
            for k, rows in self._pool.records(w.index, self._now, at).items():
                merged.setdefault(k, []).extend(rows)
        now = self._now  # the workers may have run up to L - 1 ns further: hand out what happened by now only
        for k, rows in merged.items():
            if k == "effective":  # (attribute, text) pairs, not timed records
                continue
            if k == "transport":
                rows[:] = [t for t in rows if self._ends.get(t.flow_id, INF_NS) <= now]
            elif k != "usage":
                rows[:] = [r for r in rows if r.time_ns <= now]
            if rows:  # (in astuple's order: the records are flat)
                rows.sort(key=fields_getter(type(rows[0])))
        self._records, self._records_at = merged, at
        return merged

    def channel_usage(self, elapsed_ns: int | None = None) -> list[PacketChannelUsage]:
        return list(self._gather(elapsed_ns)["usage"])

    def pfc_events(self) -> list[PfcEvent]:
        return list(self._gather()["pfc"])

    def queue_samples(self) -> list[QueueSample]:
        return list(self._gather()["queues"])

    def drops(self) -> list[Drop]:
        return list(self._gather()["drops"])

    def trims(self) -> list[Trim]:
        return list(self._gather()["trims"])

    def cnp_events(self) -> list[CnpEvent]:
        return list(self._gather()["cnps"])

    def ecn_mark_events(self) -> list[EcnMark]:
        return list(self._gather()["marks"])

    def flow_transport(self) -> dict[int, FlowTransport]:
        return {t.flow_id: t for t in self._gather()["transport"]}

    def effective(self) -> EffectiveSettings:
        """The workers' reports (each worker's engine is built over the full topology with this config)."""
        return EffectiveSettings.parse(self.config, self._gather().get("effective", []))


__all__ = [
    "NO_PIECE",
    "DecomposedSimulator",
    "Outbox",
    "RoundReply",
    "Spawner",
    "WorkerDiedError",
    "WorkerPool",
]
