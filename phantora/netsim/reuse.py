"""`ProfileReuseSimulator`: serve a repeated packet-side episode from the completion profile ns-3 measured for it.

A training step repeats the same collectives with the same concurrency, layer after layer and step after
step. An *episode* runs from a quiet fabric (ns-3 has no flow in flight and no event scheduled: no ACK,
PFC frame, timer or queue sample) to the next quiet fabric. Its signature is the sequence of batches
submitted during it, each keyed by the time it came (relative to the episode's start, when it was
submitted and when it becomes eligible) and its canonical form: per flow its ends, size, delay, traffic
class, rate cap, ECMP path (channels, not the flow id or key), its dependencies as positions in the episode,
and its queue (`Flow.queue`) and queue pair (`Flow.conn`) as the order in which the episode first used them.

Recorded episodes form a trie: a node is "these batches so far"; it holds the completions ns-3 reported
after its last batch (relative times, flows by position) up to the time the record is known to, and
children keyed by the next batch. A batch that opens an episode on a quiet fabric and matches a
recorded first batch is served from the profile: ns-3 is not run (it lags behind, idle), the
completions are shifted to the episode's start and mapped back to this episode's flow ids. A later
batch the trie knows (same time, same shape) keeps serving. Anything else *materialises* the episode:
ns-3 runs to the episode's start, the episode's batches are submitted again at their times, the
completions already reported are suppressed (and compared: `stats()["reuse_mismatches"]`), and recording
goes on from there.

The PFC frames, queue samples, drops, CNPs, CE marks, per-channel counters and counter stats that a
recorded episode produced are replayed, shifted, for every episode served to its end, so the run's
traces and links.csv stay complete.

When it is exact: ns-3 is deterministic given the quiet state and the batches, except for what a quiet
fabric still carries from before: the persistent queue pairs' CC state (`Flow.conn`: a served episode does
not advance it), the switches' RED draws (ECN marking between kmin and kmax takes a
random number; a served episode does not advance the stream), and each switch port's round-robin
pointer over data classes (it matters only with several classes in flight). With ECN off, or a step
marking (kmin = kmax), and one data class, reuse gives ns-3's completions to the ns. docs/packet-model.md
measures the error otherwise. Opt in with ``--set reuse=on``; `stats()["approximations"]` lists it.

The engine below may also be stepped partition workers (`phantora.netsim.partition_stepped.SteppedPartition`,
``partition=N``): then quiet is the whole network's, and reuse's own runs go through its `catch_up`.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol, TypeVar

import numpy as np

from phantora.errors import InputError
from phantora.netsim.base import INF_NS, Completion, Flow, NetworkSimulator
from phantora.netsim.flow import CausalityError
from phantora.netsim.idset import IdSet
from phantora.netsim.observe import (
    CnpEvent,
    Drop,
    EcnMark,
    FabricObserver,
    FabricRecords,
    FlowTransport,
    PacketChannelUsage,
    PfcEvent,
    QueueSample,
    Trim,
)
from phantora.netsim.packet import check_packet_batch
from phantora.netsim.queue_spool import QueueSpool
from phantora.netsim.record_columns import RecordColumns

if TYPE_CHECKING:
    from phantora.netsim.effective import EffectiveSettings
    from phantora.topology.model import Topology

# Counters of Ns3Simulator.stats() that add up over episodes (a served episode adds its recorded share).
ADDITIVE_STATS = (
    "events", "flows_submitted", "flows_completed", "data_packets", "retx_packets", "acks", "nacks", "timeouts",
    "cnps", "ecn_marks", "drops", "pfc_pause", "pfc_resume", "payload_bytes_delivered",
)  # fmt: skip

R = TypeVar("R", PfcEvent, Drop, CnpEvent, EcnMark)
Key = tuple[int, int, tuple[tuple[object, ...], ...]]  # (submitted at, eligible at, canonical batch)


class QuietStepper(NetworkSimulator, FabricObserver, Protocol):
    """What reuse needs of the engine below it: `Ns3Simulator`."""

    topology: Topology

    def advance_to_completion(self, until: int) -> list[Completion]: ...

    def quiet(self) -> bool: ...

    def new_records(self) -> FabricRecords: ...

    def channel_usage(self, elapsed_ns: int | None = None) -> Sequence[PacketChannelUsage]: ...

    def completion_bounds(self) -> dict[int, int]: ...

    def completion_bound_columns(self) -> tuple[np.ndarray, np.ndarray]: ...


def catch_up(inner: QuietStepper) -> Callable[[int], list[Completion]]:
    """How reuse runs the engine below to a time on its own (opening or materialising an episode, in the middle of
    its caller's submit): the engine's `catch_up` if it has one (stepped partition workers, which otherwise run
    ahead to their caller's floor), else `advance`."""
    own = getattr(inner, "catch_up", None)
    return inner.advance if own is None else own  # type: ignore[no-any-return]


@dataclass(slots=True)
class _Tail:
    """What a recorded episode left beside its completions: fabric records (times relative to its start, flows
    by position), per-channel counters (bytes, packets, paused ns, CE marks) and counter stats."""

    records: FabricRecords
    channels: dict[int, tuple[int, int, int, int]]
    stats: dict[str, int]
    flows: int
    transport: dict[int, FlowTransport] = field(default_factory=dict)  # by position


@dataclass(eq=False, slots=True)
class _Node:
    """The trie node for "these batches so far" of an episode."""

    size: int  # flows of the episode up to and including this node's batch
    done: list[tuple[int, int, int]] = field(default_factory=list)  # (end, position, start), relative, in order
    known: int = 0  # `done` holds every completion up to this relative time (INF_NS: all flows completed)
    children: dict[Key, _Node] = field(default_factory=dict)
    quiet_by: int = INF_NS  # seen quiet at this relative time with no further batch
    tail: _Tail | None = None


@dataclass(eq=False, slots=True)
class _Episode:
    t0: int
    node: _Node
    serving: bool
    flows: list[Flow] = field(default_factory=list)  # by position
    pos: dict[int, int] = field(default_factory=dict)  # flow id -> position
    batches: list[tuple[int, int, list[Flow]]] = field(default_factory=list)  # (submitted at, eligible at, flows)
    k: int = 0  # completions of node.done reported so far (serving)
    left: int = 0  # flows not reported complete yet
    queues: dict[int, int] = field(default_factory=dict)  # Flow.queue id -> its ordinal in the episode (from 1)
    conns: dict[int, int] = field(default_factory=dict)  # Flow.conn id -> its ordinal in the episode (from 1)


class ProfileReuseSimulator:
    """`NetworkSimulator` (and `FabricObserver`) over an ns-3 engine, serving repeated episodes from profiles."""

    posts_at_dep_ends = False  # as the ns-3 engine below it: a flow is handed over once its deps ended

    def __init__(self, inner: QuietStepper) -> None:
        self.inner = inner
        self._catch_up = catch_up(inner)
        self.topology: Topology = inner.topology
        self.config = getattr(inner, "config", None)  # the engine's (a `NicLatencySimulator` above reads it)
        self._root: dict[Key, _Node] = {}
        self._ep: _Episode | None = None
        self._vnow = inner.now()
        self._known = IdSet()  # a bit a flow
        self._routes: dict[tuple[int, ...], tuple[int, ...]] = {}  # by pair, or pair and key (`Topology.one_path`)
        self._pending: dict[int, tuple[int, int]] = {}  # served as complete, not yet seen from ns-3
        self._late: list[Completion] = []  # ns-3 completions a served profile missed (mismatches)
        self._served: list[tuple[_Tail, int, Sequence[int]]] = []  # (tail, start, ids by position: `_compact_ids`)
        self._served_stats: dict[str, int] = dict.fromkeys(ADDITIVE_STATS, 0)
        self._served_channels: dict[int, list[int]] = {}
        self._base_stats = self._counters()
        self._base_channels = self._channel_counters()
        inner.new_records()
        self._n = dict.fromkeys(("episodes", "recorded", "served", "materialised", "flows_served", "mismatches"), 0)

    # ----- NetworkSimulator ------------------------------------------------------------------
    def submit(self, flows: Sequence[Flow], at: int) -> None:
        """Add flows eligible from `at` (>= now()); deps may name this batch's flows or earlier ones."""
        now = self.now()
        if at < now:
            raise CausalityError(f"flows submitted at {at} ns but the network is already at {now} ns")
        check_packet_batch(flows, self.topology, self._known.__contains__)
        if not flows:
            return
        lossy = next((f for f in flows if f.loss_budget), None)
        if lossy is not None:  # a profile holds completion times, not the byte ranges a lossy flow lost
            raise InputError(f"flow {lossy.id} is loss-tolerant (DLCP): reuse=on cannot serve it; run without reuse")
        self._known.update(f.id for f in flows)
        ep = self._ep
        if ep is not None and ep.serving and not self._quiet():
            child = ep.node.children.get(self._key(ep, flows, now, at))
            if child is not None:
                self._add(ep, flows, now, at, child)
                return
            self._materialise()
        if ep is None or self._quiet():
            self._close()
            self._open(flows, now, at)
            return
        key = self._key(ep, flows, now, at)
        self._record_known(ep)
        child = ep.node.children.get(key)
        if child is None:
            child = ep.node.children[key] = _Node(ep.node.size + len(flows))
        self._add(ep, flows, now, at, child)
        self.inner.submit(self._inner_flows(ep, flows), at)

    def advance(self, until: int) -> list[Completion]:
        """Run every event at or before `until`; now() becomes `until`."""
        if until < self.now():
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {self.now()} ns")
        if self._serving():
            got = self._serve_until(until)
            if got is not None:
                return got
            self._materialise()
        return self._live(self.inner.advance(until))

    def advance_to_completion(self, until: int) -> list[Completion]:
        """`advance(until)`, but return right after the first ns at which a flow completes (no limit: or once
        nothing is in flight): how `FluidNvlinkSimulator` steps its packet side."""
        if until < self.now():
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {self.now()} ns")
        if self._serving():
            got = self._serve_next(until)
            if got is not None:
                return got
            self._materialise()
        return self._live(self.inner.advance_to_completion(until))

    def advance_watching(self, until: int, watch: Collection[int], earliest: int | None = None) -> list[Completion]:
        """`advance(until)`, but return after the first ns at which a flow in `watch` completes (every event of
        that ns run); with no limit also once nothing is in flight."""
        if not watch:
            return self.advance(until) if until < INF_NS else []
        done: list[Completion] = []
        while self._serving():
            if until >= INF_NS and self.in_flight() == 0:
                return done
            got = self._serve_next(until)
            if got is None:
                self._materialise()
                break
            done.extend(got)
            if any(c.flow_id in watch for c in got) or (not got and self.now() >= until):
                return done
        if any(c.flow_id in watch for c in self._late):
            return done + self._live([])
        return done + self._live(self.inner.advance_watching(until, watch, earliest))

    def next_event_time(self) -> int | None:
        """The next completion of a served profile, else the engine's next event (None when idle)."""
        ep = self._ep
        if ep is not None and ep.serving:
            if ep.k < len(ep.node.done):
                return ep.t0 + ep.node.done[ep.k][0]
            if ep.left == 0:
                return None
            if self._vnow < ep.t0 + ep.node.known:
                return ep.t0 + ep.node.known  # the record's horizon: nothing before it, maybe something at it
            self._materialise()
        return self.inner.next_event_time()

    def now(self) -> int:
        return self._vnow if self._serving() else self.inner.now()

    def completion_bounds(self) -> dict[int, int]:
        """ns-3's bounds of the flows it runs (what a decomposition worker reports). A served episode's flows have
        none: ns-3 lies quiet meanwhile, and the static bounds the driver set when it posted them still hold."""
        return self.inner.completion_bounds()

    def completion_bound_columns(self) -> tuple[np.ndarray, np.ndarray]:
        """`completion_bounds` as int64 columns (ids, ns)."""
        return self.inner.completion_bound_columns()

    def in_flight(self) -> int:
        return self._ep.left if self._serving() and self._ep is not None else self.inner.in_flight()

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        """Run until nothing is in flight; now() ends at the last completion. Raise past limit_ns."""
        ep = self._ep
        if ep is not None and ep.serving:
            if ep.left == 0:
                return []
            last = ep.t0 + ep.node.done[-1][0] if ep.node.known >= INF_NS else INF_NS
            if last <= (INF_NS if limit_ns is None else limit_ns):
                got = self._serve_until(last)
                assert got is not None
                return got
            self._materialise()
        return self._live(self.inner.drain(limit_ns))

    def stats(self) -> dict[str, object]:
        out = dict(self.inner.stats())
        current = self._current_tail()
        for key, value in self._served_stats.items():
            if isinstance(out.get(key), int):
                out[key] = int(out[key]) + value + (current.stats.get(key, 0) if current else 0)  # type: ignore[call-overload]
        n = self._n
        out["reuse_episodes"] = n["episodes"]
        out["reuse_recorded"] = n["recorded"]
        out["reuse_served"] = n["served"] + (current is not None)
        out["reuse_materialised"] = n["materialised"]
        out["reuse_flows_served"] = n["flows_served"] + (current.flows if current else 0)
        out["reuse_events_avoided"] = self._served_stats["events"] + (current.stats.get("events", 0) if current else 0)
        out["reuse_mismatches"] = n["mismatches"]
        used = out.get("approximations")
        used = list(used) if isinstance(used, list) else []
        out["approximations"] = used if "reuse=on" in used else [*used, "reuse=on"]
        return out

    def close(self) -> None:
        self.inner.close()

    def keepalive(self) -> None:
        self.inner.keepalive()

    def channels(self) -> ProfileReuseSimulator:
        return self

    def fabric(self) -> ProfileReuseSimulator:
        return self

    # ----- FabricObserver: ns-3's records and the served episodes' ---------------------------
    def channel_usage(self, elapsed_ns: int | None = None) -> list[PacketChannelUsage]:
        """ns-3's counters plus the served episodes' (the peak queue is ns-3's: each served episode ran there once)."""
        elapsed = self.now() if elapsed_ns is None else elapsed_ns
        served = self._served_channels
        current = self._current_tail()
        if current is not None:
            served = {ch: list(v) for ch, v in served.items()}
            _add_channels(served, current.channels)
        out = []
        for r in self.inner.channel_usage(elapsed):
            extra = served.get(r.channel)
            if extra is None:
                out.append(r)
                continue
            nbytes = r.bytes + extra[0]
            util = nbytes * 8e9 / (r.bandwidth_bps * elapsed) if elapsed > 0 else 0.0
            out.append(
                PacketChannelUsage(
                    r.channel, r.src, r.dst, r.bandwidth_bps, nbytes, r.packets + extra[1], r.paused_ns + extra[2],
                    r.ecn_marks + extra[3], r.max_queue_bytes, util,
                )
            )  # fmt: skip
        return out

    def pfc_events(self) -> Sequence[PfcEvent]:
        return self._merged(PfcEvent, self.inner.pfc_events(), "pfc", named=False)

    def queue_samples(self) -> Sequence[QueueSample]:
        """ns-3's samples with every served episode's up to now, in time order, merged onto disk as they are read
        (`QueueSpool`: a run's samples may be millions). Each part is in time order, so a stable merge gives the
        order `_merged` sorts the others into (ns-3's first at equal times, then the episodes in serving order)."""
        now = self.now()
        parts = [_shifted_queues(tail.records.queues, t0, now) for tail, t0, _ in self._served_tails()]
        out = QueueSpool()
        out.extend(
            (q.time_ns, q.node, q.port, q.prio, q.bytes)
            for q in heapq.merge(self.inner.queue_samples(), *parts, key=_time_ns)
        )
        return out

    def trims(self) -> Sequence[Trim]:
        """ns-3's: only loss-tolerant (DLCP) packets are trimmed, and reuse refuses those flows."""
        return self.inner.trims()

    def drops(self) -> Sequence[Drop]:
        return self._merged(Drop, self.inner.drops(), "drops")

    def cnp_events(self) -> Sequence[CnpEvent]:
        return self._merged(CnpEvent, self.inner.cnp_events(), "cnps")

    def ecn_mark_events(self) -> Sequence[EcnMark]:
        return self._merged(EcnMark, self.inner.ecn_mark_events(), "marks")

    def flow_transport(self) -> dict[int, FlowTransport]:
        """ns-3's counters of the flows it ran, and each served flow's from the episode it was served from."""
        out = dict(self.inner.flow_transport())
        served = list(self._served)
        ep, current = self._ep, self._current_tail()
        if ep is not None and current is not None:
            served.append((current, ep.t0, [f.id for f in ep.flows]))
        for tail, _, ids in served:
            for p, t in tail.transport.items():
                fid = _flow_id(ids, p)
                out[fid] = replace(t, flow_id=fid)
        return out

    def effective(self) -> EffectiveSettings:
        """The fabric's (served episodes were recorded on this same fabric)."""
        return self.inner.effective()

    # ----- episodes ----------------------------------------------------------------------------
    def _serving(self) -> bool:
        return self._ep is not None and self._ep.serving

    def _quiet(self) -> bool:
        """May a new episode start now? Serving: every flow reported and the profile saw quiet by now. Live: ns-3
        says so (and the record learns when)."""
        ep = self._ep
        if ep is None:
            return True
        rel = self.now() - ep.t0
        if ep.serving:
            return ep.left == 0 and ep.node.known >= INF_NS and rel >= ep.node.quiet_by
        if not self.inner.quiet():
            return False
        ep.node.quiet_by = min(ep.node.quiet_by, rel)
        return True

    def _open(self, flows: Sequence[Flow], now: int, at: int) -> None:
        """A new episode from a quiet fabric: served if the trie knows its first batch, else run and recorded."""
        self._n["episodes"] += 1
        key = self._key(None, flows, now, at)
        node = self._root.get(key)
        if node is not None:
            self._vnow = now
            self._ep = ep = _Episode(now, node, serving=True)
            self._add(ep, flows, now, at, node)
            return
        if self.inner.now() < now:
            self._late.extend(self._catch_up(now))  # ns-3 is idle: nothing happens
        node = self._root[key] = _Node(len(flows))
        self._ep = ep = _Episode(now, node, serving=False)
        self._add(ep, flows, now, at, node)
        self.inner.submit(self._inner_flows(ep, flows), at)

    def _close(self) -> None:
        """End the episode on a quiet fabric: a served one adds its recorded tail, a run one records it."""
        ep = self._ep
        if ep is None:
            return
        self._ep = None
        if ep.serving:
            tail = ep.node.tail
            assert tail is not None  # quiet_by is set only where an episode closed, with its tail
            self._pending.clear()
            self._served.append((tail, ep.t0, _compact_ids([f.id for f in ep.flows])))
            for key, value in tail.stats.items():
                self._served_stats[key] += value
            _add_channels(self._served_channels, tail.channels)
            self._n["served"] += 1
            self._n["flows_served"] += len(ep.flows)
            return
        tail = self._take_tail(ep)
        if ep.node.tail is None:
            ep.node.tail = tail
            self._n["recorded"] += 1

    def _materialise(self) -> None:
        """Run the served episode in ns-3 up to now: its batches again at their times; ns-3's completions of
        flows already reported are compared with the profile and not reported again."""
        ep = self._ep
        assert ep is not None and ep.serving
        inner = self.inner
        self._n["materialised"] += 1
        got: list[Completion] = []
        run = self._catch_up
        if inner.now() < ep.t0:
            got.extend(run(ep.t0))
        for sub, at, flows in ep.batches:
            if sub > inner.now():
                got.extend(run(sub))
            inner.submit(self._inner_flows(ep, flows), at)
        if self._vnow > inner.now():
            got.extend(run(self._vnow))
        ep.serving = False
        late = self._unseen(got)  # done in ns-3 by now, not in the profile (those the profile had earlier count later)
        self._n["mismatches"] += len(late)
        self._late.extend(late)

    def _live(self, got: list[Completion]) -> list[Completion]:
        """ns-3's completions: drop those already served, record the rest in the episode's node."""
        out = self._unseen(got)
        if self._late:
            out = sorted(self._late + out, key=lambda c: (c.end_ns, c.flow_id))
            self._late = []
        ep = self._ep
        if ep is None:
            return out
        node, t0 = ep.node, ep.t0
        for c in out:
            p = ep.pos.get(c.flow_id)
            if p is None:
                continue
            ep.left -= 1
            rel = c.end_ns - t0
            if rel > node.known:
                node.done.append((rel, p, c.start_ns - t0))
        self._record_known(ep)
        self._note_quiet(ep)
        return out

    def _note_quiet(self, ep: _Episode) -> None:
        """Live, every flow done: learn when the fabric fell quiet as soon as ns-3 says it is (at most this ns),
        not at the next submission: a repeat of the episode whose next batch comes sooner is then served too."""
        node = ep.node
        if ep.left == 0 and node.quiet_by >= INF_NS and self.inner.quiet():
            node.quiet_by = self.inner.now() - ep.t0

    def _unseen(self, got: list[Completion]) -> list[Completion]:
        """`got` less the completions a profile already reported (a differing time counts as a mismatch)."""
        if not self._pending:
            return got
        out = []
        for c in got:
            seen = self._pending.pop(c.flow_id, None)
            if seen is None:
                out.append(c)
            elif seen != (c.start_ns, c.end_ns):
                self._n["mismatches"] += 1
        return out

    def _record_known(self, ep: _Episode) -> None:
        """Live: the node's record is complete up to now (to the end once nothing is in flight)."""
        node = ep.node
        if node.known < INF_NS:
            node.known = INF_NS if self.inner.in_flight() == 0 else max(node.known, self.inner.now() - ep.t0)

    def _serve_until(self, until: int) -> list[Completion] | None:
        """The profile's completions up to `until` (None if the record does not reach it)."""
        ep = self._ep
        assert ep is not None
        node = ep.node
        if until >= INF_NS or until - ep.t0 > node.known:
            return None
        rel = until - ep.t0
        out = []
        while ep.k < len(node.done) and node.done[ep.k][0] <= rel:
            out.append(self._served_completion(ep, node.done[ep.k]))
            ep.k += 1
        self._vnow = until
        return out

    def _serve_next(self, until: int) -> list[Completion] | None:
        """The profile's next completion time, if at or before `until`, with every completion of that ns; else
        a jump to `until` (None if the record does not reach the next event)."""
        ep = self._ep
        assert ep is not None
        node = ep.node
        if ep.k < len(node.done) and ep.t0 + node.done[ep.k][0] <= until:
            return self._serve_until(ep.t0 + node.done[ep.k][0])
        if until >= INF_NS:
            return [] if ep.left == 0 else None
        return self._serve_until(until)

    def _served_completion(self, ep: _Episode, rec: tuple[int, int, int]) -> Completion:
        end, p, start = rec
        f = ep.flows[p]
        ep.left -= 1
        c = Completion(f.id, ep.t0 + start, ep.t0 + end, f.size, f.src, f.dst, f.tag)
        self._pending[f.id] = (c.start_ns, c.end_ns)
        return c

    def _add(self, ep: _Episode, flows: Sequence[Flow], now: int, at: int, node: _Node) -> None:
        for f in flows:
            ep.pos[f.id] = len(ep.flows)
            ep.flows.append(f)
        ep.batches.append((now, at, list(flows)))
        _ordinals([f.queue for f in flows], ep.queues, learn=True)
        _ordinals([f.conn for f in flows], ep.conns, learn=True)
        ep.left += len(flows)
        ep.node = node
        ep.k = 0

    def _key(self, ep: _Episode | None, flows: Sequence[Flow], now: int, at: int) -> Key:
        """The batch's trie key: times relative to the episode's start (this batch's, for a new one), and per
        flow (src, dst, size, delay, class, rate cap, path, deps as positions, queue and connection as ordinals
        of first use in the episode; deps outside the episode have completed)."""
        t0 = now if ep is None else ep.t0
        base = 0 if ep is None else len(ep.flows)
        here = {f.id: base + i for i, f in enumerate(flows)}
        before = {} if ep is None else ep.pos
        queues = _ordinals([f.queue for f in flows], {} if ep is None else ep.queues)
        conns = _ordinals([f.conn for f in flows], {} if ep is None else ep.conns)
        canon = []
        for f, q, c in zip(flows, queues, conns, strict=True):
            deps = []
            for d in f.deps:
                p = here.get(d, before.get(d))
                if p is not None:
                    deps.append(p)
            canon.append((f.src, f.dst, f.size, f.delay_ns, f.priority, f.rate_bps, self._path(f), tuple(deps), q, c))
        return (now - t0, at - t0, tuple(canon))

    def _path(self, f: Flow) -> tuple[int, ...]:
        if f.size == 0 or f.src == f.dst:
            return ()
        key = self.topology.route_cache_key(f.src, f.dst, f.id if f.key is None else f.key, f.via_nic)
        path = self._routes.get(key)
        if path is None:
            path = self._routes[key] = tuple(self.topology.route(*key))
        return path

    @staticmethod
    def _inner_flows(ep: _Episode, flows: Sequence[Flow]) -> list[Flow]:
        """The flows with deps outside the episode dropped (they completed; ns-3 may never have seen them)."""
        out = []
        for f in flows:
            if all(d in ep.pos for d in f.deps):
                out.append(f)
            else:
                deps = tuple(d for d in f.deps if d in ep.pos)
                out.append(f.with_deps(deps))
        return out

    # ----- recording an episode's tail ---------------------------------------------------------
    def _counters(self) -> dict[str, int]:
        s = self.inner.stats()
        return {k: int(v) for k in ADDITIVE_STATS if isinstance(v := s.get(k), (int, float))}

    def _channel_counters(self) -> dict[int, tuple[int, int, int, int]]:
        return {r.channel: (r.bytes, r.packets, r.paused_ns, r.ecn_marks) for r in self.inner.channel_usage(1)}

    def _take_tail(self, ep: _Episode) -> _Tail:
        """ns-3's records, channel counters and counter stats since the last episode closed: this episode's."""
        t0, pos = ep.t0, ep.pos
        rec = self.inner.new_records()
        records = FabricRecords(
            RecordColumns.of(PfcEvent, rec.pfc).moved(-t0),
            [_shift_queue(e, -t0) for e in rec.queues],
            _positions(RecordColumns.of(Drop, rec.drops).moved(-t0), pos),
            _positions(RecordColumns.of(CnpEvent, rec.cnps).moved(-t0), pos),
            _positions(RecordColumns.of(EcnMark, rec.marks).moved(-t0), pos),
        )
        stats = self._counters()
        delta = {k: v - self._base_stats.get(k, 0) for k, v in stats.items()}
        self._base_stats = stats
        channels = self._channel_counters()
        zero = (0, 0, 0, 0)
        moved = {}
        for ch, now in channels.items():
            was = self._base_channels.get(ch, zero)
            if now != was:
                moved[ch] = (now[0] - was[0], now[1] - was[1], now[2] - was[2], now[3] - was[3])
        self._base_channels = channels
        ran = self.inner.flow_transport()
        transport = {p: ran[f.id] for p, f in enumerate(ep.flows) if f.id in ran}
        return _Tail(records, moved, delta, len(ep.flows), transport)

    def _current_tail(self) -> _Tail | None:
        """The tail of the episode being served, once every flow of it is reported (it counts as served then)."""
        ep = self._ep
        if ep is None or not ep.serving or ep.left or ep.node.known < INF_NS:
            return None
        return ep.node.tail

    def _merged(self, kind: type[R], own: Sequence[R], name: str, named: bool = True) -> RecordColumns[R]:
        """ns-3's own records with every served episode's `name` records (and the current one's, if served to its
        end), up to now, in time order (ns-3's first at equal times, then the episodes in serving order); as
        columns: shifted, renamed (`named`: their flows by position) and merged without an object each."""
        now = self.now()
        parts = [RecordColumns.of(kind, own)]
        for tail, t0, ids in self._served_tails():
            part: RecordColumns[R] = getattr(tail.records, name)
            parts.append(part.moved(t0, ids if named else None).until(now))
        return RecordColumns.by_time(kind, parts)

    def _served_tails(self) -> list[tuple[_Tail, int, Sequence[int]]]:
        """(tail, start, ids by position) of every served episode, and of the current one if served to its end."""
        served = list(self._served)
        ep, current = self._ep, self._current_tail()
        if ep is not None and current is not None:
            served.append((current, ep.t0, [f.id for f in ep.flows]))
        return served


def _positions(records: RecordColumns[R], pos: dict[int, int]) -> RecordColumns[R]:
    """`records` with each flow id as its position in the episode (`pos`; -1: not one of its flows)."""
    cols = dict(records.columns)
    cols["flow_id"] = np.array([pos.get(f, -1) for f in cols["flow_id"].tolist()], dtype=np.int64)
    return RecordColumns(records.kind, cols)


def _ordinals(ids: Sequence[int], seen: dict[int, int], learn: bool = False) -> list[int]:
    """Each id as the ordinal of its first use in the episode (ids are per call; 0 = none stays 0), given the
    ordinals `seen` so far; `learn` adds the new ones to `seen`."""
    known = seen if learn else dict(seen)
    out = []
    for i in ids:
        if i == 0:
            out.append(0)
            continue
        n = known.get(i)
        if n is None:
            n = known[i] = len(known) + 1
        out.append(n)
    return out


def _add_channels(acc: dict[int, list[int]], extra: dict[int, tuple[int, int, int, int]]) -> None:
    for ch, add in extra.items():
        row = acc.setdefault(ch, [0, 0, 0, 0])
        for i in range(4):
            row[i] += add[i]


def _flow_id(ids: Sequence[int], p: int) -> int:
    return ids[p] if 0 <= p < len(ids) else -1


def _compact_ids(ids: list[int]) -> Sequence[int]:
    """A served episode's flow ids by position, kept for the run: a range when consecutive (a collective's flows
    usually are), else 8 bytes an id."""
    if ids and ids[-1] - ids[0] == len(ids) - 1 and ids == list(range(ids[0], ids[-1] + 1)):
        return range(ids[0], ids[-1] + 1)
    try:
        return array("q", ids)
    except OverflowError:  # (ids past 64 bits: kept as they are)
        return ids


def _shift_queue(e: QueueSample, dt: int) -> QueueSample:
    return QueueSample(e.time_ns + dt, e.node, e.port, e.prio, e.bytes)


def _shifted_queues(samples: Iterable[QueueSample], dt: int, until: int) -> Iterator[QueueSample]:
    """An episode's samples moved by `dt`, those at or before `until` (one at a time)."""
    for e in samples:
        if e.time_ns + dt <= until:
            yield _shift_queue(e, dt)


def _time_ns(e: PfcEvent | QueueSample | Drop | CnpEvent | EcnMark) -> int:
    return e.time_ns
