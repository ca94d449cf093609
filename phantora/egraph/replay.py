"""Re-time an execution graph on a topology and a network engine (no torch, no live process).

The graph becomes one static flow DAG, like `phantora.replay` does for workloads, with zero-byte
*marker* flows (src == dst) standing for compute and synchronisation:
- a run of back-to-back compute nodes on a stream is one marker whose delay is their summed
  duration, depending on whatever ended the stream before;
- a Coll/P2P node is an *issue* marker; once every member has issued, a *start* marker depends on
  all issue markers (the collective starts at the latest issue, as NCCL does) and on each member's last flows of
  the nodes in its `after` (the calls before it on its NCCL stream, as the live run ordered them), and gates the
  flows of `phantora.collectives.decompose`; a collective whose `after` has not started yet waits for it;
- a Wait marker depends on the stream and on the waiting rank's last flows of each collective; a hand-off Wait,
  on a marker per send that ends its hand-off time (`phantora.collectives.handoff`) after the send's kernel starts:
  after its issue and its `after` nodes on this rank (their last flows, or, for a send a hand-off Wait names, its
  own hand-off marker), and after the flows of the earlier such sends to its peer on its communicator (`P2P.conn`)
  whose connection slots it needs (`phantora.collectives.slot_window`, from the replayed network's channels and
  chunks), not on its own flows. A
  call issued after such a send is issued at once, as live; only its start waits for the send's hand-off, so a
  rank is never held at an issue for a call that is not launched yet (only at a wait, as a live rank is).

Ranks are expanded side by side, each until it waits on a collective that some member has not
issued yet, so flow ids are allocated in dependency order. If every rank is stuck, the graph is
inconsistent (mismatched collectives) and the error says who waits for whom.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from phantora.collectives.dag_memo import DagMemo
from phantora.collectives.flow_tags import call_name, collective_tag, pairwise_groups, transfer_tag
from phantora.collectives.handoff import handoff_ns, send_slots, slot_back_ns
from phantora.collectives.nccl import nccl_env, summarize_choices
from phantora.collectives.slot_window import Slots, SlotWindow
from phantora.collectives.spec import HOST_MODEL, AlgoOptions, Collective
from phantora.egraph.call_env import CallOptions, over, recorded_env
from phantora.egraph.format import (
    EAGER_STREAM,
    LAUNCH_ISSUE,
    P2P,
    Coll,
    Compute,
    ExecGraph,
    NcclEnv,
    Program,
    Step,
    Wait,
    step_times,
)
from phantora.egraph.p2p_calls import Call, CallGroups
from phantora.egraph.p2p_launches import LaunchGroups
from phantora.egraph.step_events import has_step_events, run_with_step_events
from phantora.errors import InputError
from phantora.netsim.base import Completion, Flow, NetworkSimulator
from phantora.netsim.gc_pause import gc_paused
from phantora.netsim.scenario import Scenario
from phantora.p2p_knowledge import PairKey
from phantora.replay import MAX_FLOWS, fresh_like, run_engine
from phantora.topology.model import Topology

MAX_RUNS = 32  # replay_graph_settled: runs before the transfers held on their streams must have settled


@dataclass
class Instance:
    """One collective (or transfer) across its members."""

    key: tuple[Any, ...]
    kind: str
    group: tuple[int, ...]
    nbytes: int
    dtype: str
    root: int | None
    redop: str = "sum"  # a reducing collective's reduction (Collective.redop)
    nccl_env: NcclEnv | None = None  # its communicator's NCCL_* where the live program set its own (Coll.nccl_env)
    host: bool = False  # a plain gloo group's call (Coll/P2P.host): planned outside the NCCL model, as live
    group_sizes: tuple[int, ...] = ()  # a coalesced call's calls' bytes (Coll.group_sizes)
    group_dtypes: tuple[str, ...] = ()  # their dtypes where they differ (Coll.group_dtypes)
    # their kinds, reductions and roots where they differ (Coll.group_kinds, group_redops, group_roots)
    group_calls: tuple[tuple[str, ...], tuple[str, ...], tuple[int | None, ...]] = ((), (), ())
    issue: dict[int, int] = field(default_factory=dict)  # rank -> issue marker
    start: int = -1  # start marker, once launched
    flows: range = range(0)
    rank_last: dict[int, list[int]] = field(default_factory=dict)
    choice: dict[str, Any] | None = None  # NCCL's algorithm, protocol and channels for it (collectives.nccl)
    after: dict[int, list[Instance]] = field(default_factory=dict)  # member -> the instances it starts after there
    after_handoffs: list[int] = field(default_factory=list)  # markers of lone sends' hand-offs it starts after
    # lone sends it starts after whose hand-off markers wait for a call not launched yet: (rank run, send node)
    pending_handoffs: list[tuple[_RankRun, int]] = field(default_factory=list)
    call: Call | None = None  # a pairwise collective's transfer: its call (p2p_calls), rated in the call's group
    handed: bool = False  # a lone send that hands off: its sender's end is its data's arrival (`launch`)

    @property
    def launched(self) -> bool:
        return self.start >= 0

    def signature(self) -> tuple[Any, ...]:
        """What every member must have issued alike: kind, bytes, dtype, root, reduction and the group's calls."""
        return (
            self.kind, self.nbytes, self.dtype, self.root, self.redop, self.group_sizes, self.group_dtypes,
            self.group_calls,
        )  # fmt: skip

    @property
    def pg(self) -> int:
        """Which process group over its ranks (a transfer: holding both ends) it runs on (Coll.pg, P2P.pg)."""
        n = 4 if self.key[0] == "c" else 6
        return int(self.key[n - 1]) if len(self.key) >= n else 0

    def label(self) -> str:
        on = f" (process group {self.pg})" if self.pg else ""
        if self.key[0] == "p":
            src, dst, tag, seq = self.key[1:5]
            return f"send_recv {src}->{dst}{on} tag {tag} #{seq}"
        return f"{self.kind} on {list(self.group)}{on} #{self.key[2]}"


@dataclass
class GraphPlan:
    """The flat DAG of a graph, and the markers that report its timing."""

    flows: list[Flow]
    instances: list[Instance]
    step_markers: list[list[int]]  # per rank, in step order
    end_markers: list[int]  # per rank
    markers: int


@dataclass
class GraphReplayResult:
    """Timing of a replayed graph: step ends as the runtime defines them, per-rank detail, engine stats."""

    step_ends_ns: list[int]
    step_times_ns: list[int]
    rank_step_ends_ns: list[list[int]]
    rank_end_ns: list[int]
    makespan_ns: int
    comm: dict[str, dict[str, int]]  # kind -> count, bytes, busy_ns (sum of start..end)
    engine_stats: dict[str, object]
    flows: int
    markers: int
    plan_s: float
    wall_s: float
    completions: list[Completion] = field(default_factory=list)  # every flow, markers included
    plan_flows: list[Flow] = field(default_factory=list)  # the DAG that ran (its flows' keys and priorities)
    nccl: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> "algorithm/protocol[/kernel]" -> calls
    steps_started: dict[int, int] = field(default_factory=dict)  # a scenario's steps with events: ns they started

    def to_dict(self) -> dict[str, Any]:
        """Deterministic results (no wall-clock figure)."""
        return {
            "step_ends_ns": self.step_ends_ns,
            "step_times_ns": self.step_times_ns,
            "rank_step_ends_ns": self.rank_step_ends_ns,
            "rank_end_ns": self.rank_end_ns,
            "makespan_ns": self.makespan_ns,
            "comm": self.comm,
            "nccl": self.nccl,
            "flows": self.flows,
            "markers": self.markers,
            "engine_stats": {k: v for k, v in self.engine_stats.items() if _plain(v)},
        }


def _plain(v: object) -> bool:
    """A stat results.json keeps: a scalar, or a list or str-keyed map of such (the approximations an engine
    used, its decomposition settings, per-worker counters)."""
    if isinstance(v, (int, float, str)):
        return True
    if isinstance(v, list):
        return all(_plain(x) for x in v)
    return isinstance(v, dict) and all(isinstance(k, str) and _plain(x) for k, x in v.items())


def _pinned(prog: Program) -> set[int]:
    """Nodes whose end another node names explicitly (their end needs a marker of its own)."""
    return {d for n in prog.nodes for d in n.deps}


def _folds(prog: Program, pinned: set[int]) -> dict[int, tuple[int, tuple[tuple[int, int], ...]]]:
    """A program's runs of two or more back-to-back Compute nodes that make no marker (no explicit deps, not
    pinned), by first index: (the index after the run, each stream's summed duration in first-use order). Such a
    node only adds its duration to its stream's pending delay, so a run adds the sums: computed once a program,
    not once a rank (every rank of a program walks the same nodes)."""
    out: dict[int, tuple[int, tuple[tuple[int, int], ...]]] = {}
    nodes, i, n = prog.nodes, 0, len(prog.nodes)
    while i < n:
        j = i
        while j < n and isinstance(x := nodes[j], Compute) and not x.deps and j not in pinned:
            j += 1
        if j - i >= 2:
            sums: dict[int, int] = {}
            for k in range(i, j):
                c = nodes[k]
                sums[c.stream] = sums.get(c.stream, 0) + c.dur_ns  # type: ignore[union-attr]
            out[i] = (j, tuple(sums.items()))
        i = max(j, i + 1)
    return out


class _RankRun:
    """The expansion state of one rank."""

    def __init__(
        self,
        rank: int,
        prog: Program,
        slots: list[tuple[int, ...]],
        ep: int,
        pinned: set[int],
        folds: dict[int, tuple[int, tuple[tuple[int, int], ...]]] | None = None,
    ) -> None:
        self.rank = rank
        self.prog = prog
        self.slots = slots
        self.ep = ep
        self.pinned = pinned
        self.folds = folds or {}  # `_folds` of its program
        self.pc = 0
        self.streams: dict[int, tuple[tuple[int, ...], int]] = {}  # stream -> (deps, delay): free at max(deps)+delay
        self.ends: dict[int, int] = {}  # node -> marker that ends it
        self.inst: dict[int, Instance] = {}  # Coll/P2P node -> its instance
        self.steps: list[int] = []
        self.end = -1  # the marker joining every stream at the end
        self.blocked: Instance | None = None
        self.handoff_at: dict[int, int] = {}  # send node -> the marker at its hand-off (`_Planner.handoff_marker`)
        self.handed_sends: frozenset[int] = frozenset()  # the sends a hand-off wait names (`_handed_sends`)
        self.windows: dict[tuple[int, int], SlotWindow[int]] = {}  # (P2P.conn, peer) -> its handed-off send nodes
        self.gates: dict[int, list[int]] = {}  # send node -> the earlier send nodes whose flows it waits for
        self.unfit: set[int] = set()  # handed sends whose own slots overflow their connection here: not handed


def _handed_sends(prog: Program) -> frozenset[int]:
    """The send nodes a hand-off wait names: lone sends within their buffer (the live run joined them at their
    hand-off, or marked them so on `EAGER_STREAM`), which the calls after them follow to their hand-off."""
    return frozenset(r for n in prog.nodes if isinstance(n, Wait) and n.handoff for r in n.refs)


class _Planner:
    def __init__(
        self,
        graph: ExecGraph,
        topo: Topology,
        algo: AlgoOptions,
        max_flows: int,
        tick: Callable[[], None] | None,
        held: dict[PairKey, int] | None = None,
    ) -> None:
        self.graph, self.topo, self.algo, self.max_flows = graph, topo, algo, max_flows
        self.opts = CallOptions(algo)  # each call's options: the run's, or its own NCCL_* under the replay's
        self.pairwise: dict[int, tuple[str, tuple[int, ...]]] | None = None  # p2p tag -> pairwise collective's
        self.tick = tick
        self.flows: list[Flow] = []
        self.markers = 0
        self.instances: dict[tuple[Any, ...], Instance] = {}
        self.order: list[Instance] = []
        self.dags = DagMemo(topo)  # each call's flows (a repeat's copied), the message counters over the whole replay
        self.waiters: dict[tuple[Any, ...], list[int]] = {}
        self._launched: list[Instance] = []
        self.held: dict[tuple[Any, ...], list[Instance]] = {}  # instance key -> those held until it starts
        # (src, dst, bytes, communicator's ranks or ()) -> a lone send's hand-off ns, and its connection slots
        self.handoffs: dict[tuple[tuple[int, int, int, tuple[int, ...]], NcclEnv | None], int | None] = {}
        self.slots: dict[tuple[tuple[int, int, int, tuple[int, ...]], NcclEnv | None], Slots | None] = {}
        self.calls = CallGroups(graph)
        self.launches = LaunchGroups(graph, held)

    def marker(self, ep: int, deps: tuple[int, ...], delay: int, tag: str) -> int:
        fid = len(self.flows)
        self.flows.append(Flow(fid, ep, ep, 0, deps, delay, tag))
        self.markers += 1
        return fid

    def plan(self) -> GraphPlan:
        g, topo = self.graph, self.topo
        self.opts.check_registration(g)
        if g.world > topo.num_ranks:
            raise InputError(
                f"the graph has {g.world} ranks but the topology '{topo.name}' has {topo.num_ranks} endpoints; "
                "use a topology with enough GPUs (or --scale-dp to re-target the graph)",
                field="topology",
            )
        pinned = [_pinned(p) for p in g.programs]
        handed_sends = [_handed_sends(p) for p in g.programs]
        folds = [_folds(p, pins) for p, pins in zip(g.programs, pinned, strict=True)]
        runs = []
        for r, e in enumerate(g.ranks):
            slots = [g.groups[i] for i in e.groups]
            runs.append(
                _RankRun(r, g.programs[e.program], slots, topo.node_of_rank(r), pinned[e.program], folds[e.program])
            )
            runs[-1].handed_sends = handed_sends[e.program]
        ready = deque(range(g.world))
        beat = time.monotonic()
        while ready:
            if self.tick is not None and time.monotonic() - beat >= 1.0:
                beat = time.monotonic()
                self.tick()
            run = runs[ready.popleft()]
            self.advance(run)
            if run.blocked is not None:
                self.waiters.setdefault(run.blocked.key, []).append(run.rank)
            else:
                self.finish(run)
            for inst in self.take_launched():
                for w in self.waiters.pop(inst.key, []):
                    runs[w].blocked = None
                    ready.append(w)
        self.check_complete(runs)
        return GraphPlan(self.flows, self.order, [x.steps for x in runs], [x.end for x in runs], self.markers)

    # ----- one rank -----------------------------------------------------------------------------------------------
    def ready(self, run: _RankRun, node: Any) -> tuple[tuple[int, ...], int]:
        deps, delay = run.streams.get(node.stream, ((), 0))
        if node.deps:
            if delay:
                deps, delay = (self.marker(run.ep, deps, delay, f"r{run.rank}/run"),), 0
            deps = deps + tuple(run.ends[d] for d in node.deps)
        return deps, delay

    def advance(self, run: _RankRun) -> None:
        nodes, folds, streams = run.prog.nodes, run.folds, run.streams
        while run.pc < len(nodes):
            i, n = run.pc, nodes[run.pc]
            fold = folds.get(i)
            if fold is not None:  # back-to-back compute making no marker: each stream's delay grows by its sum
                for stream, dur in fold[1]:
                    deps, delay = streams.get(stream, ((), 0))
                    streams[stream] = (deps, delay + dur)
                run.pc = fold[0]
                continue
            if isinstance(n, Compute):
                deps, delay = self.ready(run, n)
                run.streams[n.stream] = (deps, delay + n.dur_ns)
                if i in run.pinned:
                    m = self.marker(run.ep, deps, delay + n.dur_ns, f"r{run.rank}/{n.name}")
                    run.streams[n.stream] = ((m,), 0)
                    run.ends[i] = m
            elif isinstance(n, (Coll, P2P)):
                at_handoff: dict[int, int] = {}  # its `after` sends a hand-off wait names: their hand-off markers
                later: list[int] = []  # those whose hand-off waits for a call not launched yet: its start waits
                for a in n.after:
                    h = self.handoff_marker(run, a) if a in run.handed_sends else None
                    if isinstance(h, Instance):
                        later.append(a)
                    elif h is not None:
                        at_handoff[a] = h
                deps, delay = self.ready(run, n)
                m = self.marker(run.ep, deps, delay, f"r{run.rank}/issue{i}")
                run.streams[n.stream] = ((m,), 0)
                run.ends[i] = m
                if isinstance(n, P2P) and n.is_send and i in run.handed_sends:
                    self.admit(run, i)
                run.inst[i] = self.issue(run, i, n, m, at_handoff, later)
            elif isinstance(n, Wait) and n.handoff and n.stream == EAGER_STREAM:
                pass  # only marks its sends as lone ones within their buffer (`_handed_sends`)
            elif isinstance(n, Wait) and n.handoff and (handed := self.handed(run, n)) is not None:
                if isinstance(handed, Instance):  # a send's kernel waits for a call not launched yet
                    run.blocked = handed
                    return
                deps, delay = self.ready(run, n)
                if delay:
                    deps = (self.marker(run.ep, deps, delay, f"r{run.rank}/run"),)
                m = self.marker(run.ep, deps + handed, 0, f"r{run.rank}/wait{i}")
                run.streams[n.stream] = ((m,), 0)
                run.ends[i] = m
            elif isinstance(n, Wait):
                waiting = next((run.inst[r] for r in n.refs if not run.inst[r].launched), None)
                if waiting is not None:
                    run.blocked = waiting
                    return
                deps, delay = self.ready(run, n)
                if delay:
                    deps = (self.marker(run.ep, deps, delay, f"r{run.rank}/run"),)
                extra = tuple(f for r in n.refs for f in run.inst[r].rank_last[run.rank])
                m = self.marker(run.ep, deps + extra, 0, f"r{run.rank}/wait{i}")
                run.streams[n.stream] = ((m,), 0)
                run.ends[i] = m
            elif isinstance(n, Step):
                deps, delay = self.ready(run, n)
                m = self.marker(run.ep, deps, delay, f"r{run.rank}/step{n.index}")
                run.streams[n.stream] = ((m,), 0)
                run.ends[i] = m
                run.steps.append(m)
            run.pc += 1

    def handed(self, run: _RankRun, n: Wait) -> tuple[int, ...] | Instance | None:
        """Markers at the hand-off of each send a hand-off wait names (`handoff_marker`); None where the model
        does not time one (the wait then joins the flows' end, as a plain wait); an Instance not launched yet that
        a send's kernel waits for (the rank blocks until it is)."""
        out = []
        for r in n.refs:
            m = self.handoff_marker(run, r)
            if m is None or isinstance(m, Instance):
                return m
            out.append(m)
        return tuple(out)

    def handoff_marker(self, run: _RankRun, r: int) -> int | Instance | None:
        """The marker at send node `r`'s hand-off: NCCL's time for the lone transfer after its kernel starts, at
        its issue and once the calls its CUDA stream had in flight (its `after`) have ended on this rank (a send a
        hand-off wait names: at its own hand-off), as the live rank computes it (RankSession.handoff_at). None
        where the model does not time it; the first `after` instance not launched yet, if one is not."""
        if r in run.handoff_at:
            return run.handoff_at[r]
        inst = run.inst[r]
        node = run.prog.nodes[r]
        assert isinstance(node, P2P)
        key = (inst.group[0], inst.group[1], inst.nbytes, run.slots[node.comm] if node.comm >= 0 else ())
        if (key, node.nccl_env) not in self.handoffs:
            self.handoffs[key, node.nccl_env] = handoff_ns(self.topo, self.opts.of(node.nccl_env), {}, *key)
        ns = self.handoffs[key, node.nccl_env]
        if ns is None or r in run.unfit:
            return None
        deps = [run.ends[r]]
        for a in node.after:
            m = self.handoff_marker(run, a) if a in run.handed_sends else None
            if isinstance(m, Instance):
                return m
            if m is not None:
                deps.append(m)
                continue
            q = run.inst[a]
            if not q.launched:
                return q
            deps.extend(q.rank_last[run.rank])
        gated: list[int] = []
        for g in run.gates.get(r, ()):  # an earlier send's flow frees the slots it needs once received
            q = run.inst[g]
            if not q.launched:
                return q
            gated.extend(q.rank_last[q.group[1]])
        back = slot_back_ns(self.topo, inst.group[0], inst.group[1]) if gated else 0  # the news back (slot_window)
        if back:
            deps.append(self.marker(run.ep, tuple(gated), back, f"r{run.rank}/freed{r}"))
        else:
            deps.extend(gated)
        run.handoff_at[r] = self.marker(run.ep, tuple(deps), ns, f"r{run.rank}/handoff{r}")
        return run.handoff_at[r]

    def admit(self, run: _RankRun, i: int) -> None:
        """Send node `i`, a lone send a hand-off wait names, takes its connection's slots on the replayed network
        (`send_slots`): the earlier such sends to its peer on its communicator (`P2P.conn`) whose flows it waits for
        become its gate; a send whose own slots overflow the connection here, or that NCCL moves zero-copy between
        registered buffers (its communicator's ranks `P2P.comm` decide PXN), is not handed off (its waits see its
        flow, as a large send's)."""
        node = run.prog.nodes[i]
        assert isinstance(node, P2P)
        dst = run.slots[node.slot][1]
        key = (run.rank, dst, node.nbytes, run.slots[node.comm] if node.comm >= 0 else ())
        if (key, node.nccl_env) not in self.slots:
            self.slots[key, node.nccl_env] = send_slots(self.topo, self.opts.of(node.nccl_env), {}, *key)
        slots = self.slots[key, node.nccl_env]
        if slots is None:
            return
        if not slots.fits:
            run.unfit.add(i)
            return
        run.gates[i] = run.windows.setdefault((node.conn, dst), SlotWindow()).admit(i, slots)

    def finish(self, run: _RankRun) -> None:
        deps: list[int] = []
        for s in sorted(run.streams):
            d, delay = run.streams[s]
            deps.extend(d if not delay else (self.marker(run.ep, d, delay, f"r{run.rank}/run"),))
        run.end = self.marker(run.ep, tuple(deps), 0, f"r{run.rank}/end")

    # ----- collectives --------------------------------------------------------------------------------------------
    def issue(
        self,
        run: _RankRun,
        i: int,
        n: Coll | P2P,
        m: int,
        handed: dict[int, int] | None = None,
        later: list[int] | None = None,
    ) -> Instance:
        """Rank `run` issues node `i` at marker `m`; it starts after its `after` nodes there, the sends among them
        that a hand-off wait names at their hand-off markers `handed` (as the live coordinator orders it), or, for
        those whose markers wait for a call not launched yet (`later`), once those are made (`try_launch`)."""
        group = run.slots[n.slot]
        if isinstance(n, Coll):
            key: tuple[Any, ...] = ("c", group, n.seq) + ((n.pg,) if n.pg else ())  # a recording's before pg: 0
            each = (n.group_kinds, n.group_redops, n.group_roots)
            sig = (n.kind, n.nbytes, n.dtype, n.root, n.redop, n.group_sizes, n.group_dtypes, each)
        else:
            key = ("p", group[0], group[1], n.tag, n.seq) + ((n.pg,) if n.pg else ())
            sig = ("send_recv", n.nbytes, "uint8", None, "sum", (), (), ((), (), ()))
        inst = self.instances.get(key)
        if inst is None:
            inst = Instance(key, sig[0], group, *sig[1:5], group_sizes=sig[5], group_dtypes=sig[6], group_calls=sig[7])
            self.instances[key] = inst
        elif inst.signature() != sig:
            first = min(inst.issue)
            raise InputError(
                f"collective mismatch on {inst.label()}: rank {first} issued {inst.kind} of {inst.nbytes} B "
                f"({inst.dtype}, root {inst.root}, {inst.redop}), rank {run.rank} issued {sig[0]} of {sig[1]} B "
                f"({sig[2]}, root {sig[3]}, {sig[4]}) (program node {i})",
                field="programs",
            )
        if run.rank in inst.issue:
            raise InputError(f"rank {run.rank} issues {inst.label()} twice (node {i})", field="programs")
        if inst.nccl_env is None:  # as the live coordinator: the call's own NCCL_* (its ends agree, or it refused)
            inst.nccl_env = n.nccl_env
        if n.host:  # a gloo call (Coll/P2P.host)
            inst.host = True
        if isinstance(n, P2P) and n.tag < 0 and n.is_send:
            inst.call = self.calls.call_of(run.rank, i)
        inst.issue[run.rank] = m
        if isinstance(n, P2P) and n.is_send and i in run.handed_sends:
            inst.handed = True
        handed = handed or {}
        later = later or []
        if n.after:
            inst.after[run.rank] = [run.inst[a] for a in n.after if a not in handed and a not in later]
            inst.after_handoffs.extend(handed.values())
            inst.pending_handoffs.extend((run, a) for a in later)
        if len(inst.issue) == len(group):
            self.try_launch(inst)
        return inst

    def try_launch(self, inst: Instance) -> None:
        """Launch `inst` once every instance it starts after has started (held until then), and then those held
        for it."""
        todo = [inst]
        while todo:
            x = todo.pop()
            waiting = next((q for qs in x.after.values() for q in qs if not q.launched), None)
            if waiting is None:
                waiting = self.resolve_handoffs(x)
            if waiting is not None:
                self.held.setdefault(waiting.key, []).append(x)
                continue
            self.launch(x)
            todo.extend(reversed(self.held.pop(x.key, [])))

    def resolve_handoffs(self, inst: Instance) -> Instance | None:
        """Make the hand-off markers of the sends `inst` starts after that could not be made at its issue; the first
        call one still waits for that has not launched, else None."""
        while inst.pending_handoffs:
            run, a = inst.pending_handoffs[0]
            h = self.handoff_marker(run, a)
            if isinstance(h, Instance):
                return h
            if h is not None:
                inst.after_handoffs.append(h)
            inst.pending_handoffs.pop(0)
        return None

    def tag(self, inst: Instance) -> str:
        """Its flows' tag, as the live run's (`flow_tags`): `all_reduce#3@0-7`, `send#0@2>5`, a pairwise
        collective's transfer `all_to_all#1@0-3/0>2` (its group found among the graph's and the world; else its p2p
        tag, `send#1.tag-123@0>2`)."""
        if inst.key[0] == "c":
            return collective_tag(call_name(inst.kind, inst.key[2], pg=inst.pg), inst.group)
        src, dst, tag, seq = inst.key[1:5]
        if self.pairwise is None:
            self.pairwise = pairwise_groups([*self.graph.groups, tuple(range(self.graph.world))])  # and the world's
        of = self.pairwise.get(tag) if tag < 0 else None
        pg = inst.pg
        name = collective_tag(call_name(of[0], seq, pg=pg), of[1]) if of else call_name("send", seq, tag, pg)
        return transfer_tag(name, src, dst)

    def launch(self, inst: Instance) -> None:
        anchor = self.topo.node_of_rank(inst.group[0])
        gate = tuple(inst.issue[r] for r in inst.group)
        gate += tuple(f for r, qs in sorted(inst.after.items()) for q in qs for f in q.rank_last[r])
        gate += tuple(inst.after_handoffs)
        inst.start = self.marker(anchor, gate, 0, f"c{len(self.order)}/start")
        first = len(self.flows)
        coll = self.grouped(inst) or Collective(
            inst.kind, inst.group, inst.nbytes, inst.dtype, inst.root, redop=inst.redop, group_sizes=inst.group_sizes,
            group_dtypes=inst.group_dtypes, group_kinds=inst.group_calls[0], group_redops=inst.group_calls[1],
            group_roots=inst.group_calls[2],
        )  # fmt: skip
        opts = self.opts.of(inst.nccl_env)
        if inst.host:  # as the live session's (spec.HOST_ALGO): no NCCL kernel, zero bytes, no flows
            opts = dataclasses.replace(opts, model=HOST_MODEL)
        dag = self.dags.gated(coll, opts, first, self.tag(inst), (inst.start,))
        self.flows.extend(dag.flows)
        if len(self.flows) > self.max_flows:
            raise InputError(
                f"the replay needs more than {self.max_flows:,} flows; use the coarse granularity or fewer channels",
                field="granularity",
            )
        inst.flows = range(first, len(self.flows))
        inst.rank_last = {r: (dag.rank_last.get(r) or [inst.start]) for r in inst.group}
        if inst.handed:  # ends when its data has arrived, as the live coordinator's (`CoordinatorCore._received_with`)
            src, dst = inst.group[0], inst.group[1]
            inst.rank_last[src] = list(dict.fromkeys([*inst.rank_last[src], *inst.rank_last[dst]]))
        inst.choice = dag.choice
        self.order.append(inst)
        self._launched.append(inst)

    def grouped(self, inst: Instance) -> Collective | None:
        """A transfer of an NCCL group as the live coordinator rates it: a send/recv on the group's communicator with
        the group's transfers it knew at its launch, each from its recorded start (`p2p_launches`); in a graph
        without group launches (recorded before them), a pairwise collective's transfer with the call's others, all
        from its start (`p2p_calls`); None for any other instance."""
        rated = self.launches.of(inst.key[1:]) if inst.key[0] == "p" else None
        if rated is not None:
            pair = (inst.group[0], inst.group[1])
            return Collective(
                "send_recv", pair, inst.nbytes, "uint8", comm=rated.comm, launch=rated.launch, launch_op=rated.op
            )
        found = self.calls.pairs(inst.call) if inst.call is not None else None
        if found is None or len(inst.group) != 2:  # a group of one rank has no pair
            return None
        pair = (inst.group[0], inst.group[1])
        if found[1].get(pair) != inst.nbytes:
            return None
        comm, sizes = found
        at = tuple((a, b, 0, n) for (a, b), n in sizes.items() if n != inst.nbytes)
        return Collective("send_recv", pair, inst.nbytes, "uint8", comm=comm, inflight=tuple(sizes), inflight_at=at)

    def take_launched(self) -> list[Instance]:
        got, self._launched = self._launched, []
        return got

    def check_complete(self, runs: list[_RankRun]) -> None:
        stuck = [x for x in runs if x.blocked is not None]
        if stuck:
            lines = []
            for x in stuck[:8]:
                inst = x.blocked
                assert inst is not None
                missing = [r for r in inst.group if r not in inst.issue]
                lines.append(f"rank {x.rank} waits on {inst.label()}, never issued by rank(s) {missing[:16]}")
            more = f" (and {len(stuck) - 8} more ranks)" if len(stuck) > 8 else ""
            raise InputError("the graph deadlocks: " + "; ".join(lines) + more, field="programs")
        orphans = [i for i in self.instances.values() if not i.launched]
        held = [i for i in orphans if len(i.issue) == len(i.group)]
        if held:
            i = held[0]
            first = next((q for qs in i.after.values() for q in qs if not q.launched), None)
            if first is None:
                first = self.resolve_handoffs(i)
            assert first is not None
            raise InputError(
                f"{len(held)} collective(s) issued by every member never start, e.g. {i.label()}, which starts after "
                f"{first.label()} on a member's stream, which never started",
                field="programs",
            )
        if orphans:
            i = orphans[0]
            missing = [r for r in i.group if r not in i.issue]
            raise InputError(
                f"{len(orphans)} collective(s) never issued by every member, e.g. {i.label()}: "
                f"issued by {sorted(i.issue)[:16]}, missing {missing[:16]}",
                field="programs",
            )


def plan_graph(
    graph: ExecGraph,
    topo: Topology,
    algo: AlgoOptions | None = None,
    max_flows: int = MAX_FLOWS,
    tick: Callable[[], None] | None = None,
    held: dict[PairKey, int] | None = None,
) -> GraphPlan:
    """The flow DAG of a graph on a topology. `tick` is called about once a second while planning (the engine's
    `keepalive`: decomposition workers started before a long plan must hear from their driver). `held`: transfers of
    group launches that waited on their NCCL stream, and how long (`held_on_stream`; `LaunchGroups`). The cyclic GC
    is paused meanwhile (`gc_paused`: what planning makes lives as long as the plan)."""
    with gc_paused():
        return _Planner(graph, topo, algo or AlgoOptions(), max_flows, tick, held).plan()


def held_on_stream(plan: GraphPlan, completions: list[Completion]) -> dict[PairKey, int]:
    """The transfers that started after both ends issued them (an earlier call on an end's NCCL stream ran on), by
    how long, in a run of `plan`."""
    end_of = {c.flow_id: c.end_ns for c in completions}
    out = {}
    for inst in plan.instances:
        if inst.key[0] == "p" and inst.launched:
            delay = end_of[inst.start] - max(end_of[inst.issue[r]] for r in inst.group)
            if delay > 0:
                out[inst.key[1:]] = delay
    return out


def algo_from_meta(graph: ExecGraph) -> AlgoOptions:
    """The collective options the graph was recorded with (meta.algo), else the defaults. The NCCL_* variables
    recorded with it hold, each one the replaying process sets replacing its value (`call_env.over`)."""
    algo = graph.meta.get("algo") or {}
    try:
        opts = AlgoOptions(**algo)
    except TypeError as exc:
        raise InputError(f"bad recorded algorithm options {algo}: {exc}", field="meta.algo") from None
    env = recorded_env(graph)
    return opts if env is None else dataclasses.replace(opts, nccl_env=over(env, dict(nccl_env())))


def replay_graph(
    graph: ExecGraph,
    topo: Topology,
    sim: NetworkSimulator,
    algo: AlgoOptions | None = None,
    *,
    progress: str = "off",
    scenario: Scenario | None = None,
    fresh: Callable[[], NetworkSimulator] | None = None,
) -> GraphReplayResult:
    """Replay `graph` on `sim` (a fresh engine for `topo`) and time every step. A `scenario` with events at a step
    boundary has them applied as the steps start (`phantora.egraph.step_events`). Where the run shows a transfer of
    a group launch held on its NCCL stream, `sim` is closed and engines from `fresh` (default: flow engines set up as
    `sim`) run the graph again (`replay_graph_settled`)."""
    engines = [sim]
    res, last = replay_graph_settled(
        graph,
        topo,
        lambda: engines.pop() if engines else (fresh or fresh_like(sim))(),
        algo,
        progress=progress,
        scenario=scenario,
    )
    if last is not sim:
        last.close()
    return res


def replay_graph_settled(
    graph: ExecGraph,
    topo: Topology,
    make: Callable[[], NetworkSimulator],
    algo: AlgoOptions | None = None,
    *,
    progress: str = "off",
    scenario: Scenario | None = None,
) -> tuple[GraphReplayResult, NetworkSimulator]:
    """Replay `graph` on engines from `make`; its result and the engine of the last run (open). A transfer of a
    group launch that waited on its NCCL stream after both ends issued it (an earlier call there still running) is
    rated from when it started, unknown to the pairs launched before (as live, where the coordinator parks it): a
    run finds such transfers (`held_on_stream`), and while it finds others than planned, the engine is closed and the
    graph planned with them and run again on a new one."""
    t0 = time.perf_counter()
    opts = algo if algo is not None else algo_from_meta(graph)
    held: dict[PairKey, int] = {}
    for _ in range(MAX_RUNS):
        sim = make()
        try:
            plan = plan_graph(graph, topo, opts, tick=sim.keepalive, held=held)
            t1 = time.perf_counter()
            started: dict[int, int] = {}
            if scenario is not None and has_step_events(scenario):
                completions, started = run_with_step_events(sim, plan.flows, plan.step_markers, scenario, topo)
            else:
                completions = run_engine(sim, plan.flows, progress=progress)
            res = evaluate_graph(plan, completions, dict(sim.stats()), t1 - t0, time.perf_counter() - t0)
        except BaseException:
            sim.close()
            raise
        res.steps_started = started
        found = held_on_stream(plan, completions) if LAUNCH_ISSUE in graph.recorded else {}
        if found == held:
            return res, sim
        sim.close()
        held = found
    raise RuntimeError(f"the transfers held on their NCCL streams did not settle in {MAX_RUNS} runs")


def evaluate_graph(
    plan: GraphPlan, completions: list[Completion], stats: dict[str, object], plan_s: float, wall: float
) -> GraphReplayResult:
    """Step times and per-kind communication of a planned graph from the completions of its flows."""
    end_of = [0] * len(plan.flows)
    seen = 0
    for c in completions:
        end_of[c.flow_id] = c.end_ns
        seen += 1
    if seen != len(plan.flows):
        raise RuntimeError(f"the engine finished with {len(plan.flows) - seen} flows never completed")
    rank_steps = [[end_of[m] for m in ms] for ms in plan.step_markers]
    steps = step_times(rank_steps)
    ends = [sum(steps[: i + 1]) for i in range(len(steps))]
    comm: dict[str, dict[str, int]] = {}
    for inst in plan.instances:
        start = end_of[inst.start]
        end = max((end_of[i] for i in inst.flows), default=start)
        kind = comm.setdefault(inst.kind, {"count": 0, "bytes": 0, "busy_ns": 0})
        kind["count"] += 1
        kind["bytes"] += inst.nbytes
        kind["busy_ns"] += end - start
    # counted as a live run's results.json counts them (a symmetric kernel's name too)
    nccl = summarize_choices([{"kind": i.kind, "nccl": i.choice} for i in plan.instances if i.choice], ())["choices"]
    assert isinstance(nccl, dict)
    return GraphReplayResult(
        step_ends_ns=ends,
        step_times_ns=steps,
        rank_step_ends_ns=rank_steps,
        rank_end_ns=[end_of[m] for m in plan.end_markers],
        makespan_ns=max(end_of, default=0),
        comm=dict(sorted(comm.items())),
        engine_stats=stats,
        flows=len(plan.flows),
        markers=plan.markers,
        plan_s=plan_s,
        wall_s=wall,
        completions=completions,
        plan_flows=plan.flows,
        nccl={k: dict(sorted(v.items())) for k, v in sorted(nccl.items())},
    )
