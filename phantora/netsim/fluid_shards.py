"""`ShardedFluid`: the fluid NVLink side split by host into shards, one flow engine each (issue 38, item 3).

The first piece of "route (1)" (docs/packet-model.md): each host's fluid side on its own engine, so that it can run
beside the partition worker that owns the host. NVLink flows of two hosts share no channel and the flow engine's
arithmetic is per flow (a flow's bytes are counted at its own rate changes only) and its max-min per component (one
host), so a host's flows complete at the same ns on an engine of their own as on one engine for all. Hosts go to
`shards` runs of consecutive hosts (on a leaf-spine, whole leaves: a partition by whole leaf switches owns them).

What crosses shards is held here, as the hybrid holds what crosses sides (one bookkeeping: `phantora.netsim.held`):
a flow whose dep is an unfinished fluid flow of another shard (a marker joining hosts) goes to its shard the ns that
dep completes. While any is held the shards are stepped together one event ns at a time; otherwise each runs to the
limit on its own. Every shard reads the one done set (`_done`, the hybrid's `_ended`), so fabric and other shards'
ends are done for it.

The shards run in this process. Each call's work is timed per shard (`shard_cpu_s`), and per exchange (one call, or
one ns while stepping together) the busiest shard's CPU is summed (`critical_cpu_s`): what the shards would cost on
cores of their own if each exchange were a round trip. `phantora.netsim.fluid_procs` runs each shard in a process of
its own (`fluid_procs=on`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, Generic, TypeVar, overload

import msgpack

from phantora.netsim.base import Completion, Flow, completion
from phantora.netsim.flow import _BY_END, CausalityError, FlowSimulator
from phantora.netsim.held import Held, Waiters, add_to, hold, one_nearer
from phantora.netsim.idset import IdSet
from phantora.netsim.observe import ChannelUsage, switch_link_load

if TYPE_CHECKING:
    from phantora.topology.model import Topology

_COUNTERS_MAX = ("max_component",)  # stats the shards merge by their largest, not their sum
# A flow as a row of `_rows` (and `_unpack_flows`, `fluid_proc_server._flows`): its fields in `Flow`'s order
_ROW = attrgetter(
    *("id", "src", "dst", "size", "deps", "delay_ns", "tag", "priority", "key", "loss_budget", "rate_bps", "conn"),
    *("queue", "via_nic"),
)
_ID = attrgetter("id")
T = TypeVar("T")


class _OnEveryShard(Generic[T]):
    """A `ShardedFluid` attribute the hybrid sets and reads on its fluid engine: read from the first shard, set on
    every shard."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._name = name

    @overload
    def __get__(self, obj: None, owner: type) -> _OnEveryShard[T]: ...
    @overload
    def __get__(self, obj: ShardedFluid, owner: type) -> T: ...
    def __get__(self, obj: ShardedFluid | None, owner: type) -> T | _OnEveryShard[T]:
        if obj is None:
            return self
        got: T = getattr(obj.shards[0], self._name)
        return got

    def __set__(self, obj: ShardedFluid, value: T) -> None:
        for s in obj.shards:
            setattr(s, self._name, value)


def host_shards(topo: Topology, shards: int) -> list[int]:
    """Node id -> shard: the hosts in index order cut into `shards` runs of about equal count (a node of no host:
    shard 0)."""
    hosts = sorted({n.host for n in topo.nodes if n.host is not None})
    rank = {h: i for i, h in enumerate(hosts)}
    n = max(1, len(hosts))
    return [0 if v.host is None else rank[v.host] * shards // n for v in topo.nodes]


class ShardedFluid:
    """The fluid side's `FlowSimulator` interface over one flow engine a shard of hosts (see the module)."""

    def __init__(self, topology: Topology, shards: int, make: Callable[[], FlowSimulator]) -> None:
        """`make`: a fresh flow engine as the one-engine fluid side would be (every shard is one)."""
        if shards < 1:
            raise ValueError(f"fluid shards must be >= 1, got {shards}")
        self.topology = topology
        self.shards = [make() for _ in range(shards)]
        first = self.shards[0]
        self.payload_efficiency = first.payload_efficiency
        self.incremental = first.incremental
        self.lb = first.lb
        self._multi = first._multi
        self._done = IdSet()  # one done set for every shard (and the hybrid's `_ended`)
        for s in self.shards:
            s._done = self._done
        self._node_shard = host_shards(topology, shards)
        self._where: dict[int, int] = {}  # unfinished flow id -> its shard (submitted to it)
        self._held: Held = {}  # flow id -> (flow, submit ns, shard, deps held on)
        self._waiters: Waiters = {}  # flow id -> held flows of other shards waiting on it
        self._now = 0
        self._next: int | None = None  # the shards' next event ns, while `_fresh`
        self._fresh = False
        self.shard_cpu_s = [0.0] * shards
        self.critical_cpu_s = 0.0  # per exchange the busiest shard's CPU, summed
        self.exchanges = 0  # exchanges in which some shard worked
        self.together_ns = 0  # event ns stepped together (a held flow waited across shards)
        # Measurement only (bench_fluid_side.py --wire): each batch and its completions go through msgpack as a process
        # split would send them (a flow's deps filtered to its shard's; a completion as id, start, end), each side's
        # encoding and decoding charged to that side's CPU (no pipe, no wake-up)
        self.wire = False
        self.wire_bytes = 0
        self._sent: dict[int, Flow] = {}  # (wire) flows sent, by id: a completion comes back as (id, start, end)

    # ----- what the hybrid sets and reads on its fluid engine, forwarded ----------------------------
    # (`type(fluid).carries` is truthy, as `FlowSimulator`'s class attribute: the hybrid sets cap_slack)
    prechecked: _OnEveryShard[bool] = _OnEveryShard()
    carries: _OnEveryShard[bool] = _OnEveryShard()
    cap_slack: _OnEveryShard[bool] = _OnEveryShard()
    stretch: _OnEveryShard[Callable[[Flow, int], int] | None] = _OnEveryShard()

    def route(self, f: Flow) -> tuple[tuple[int, ...], int]:
        return self.shards[self._node_shard[f.src]].route(f)

    @property
    def node_shard(self) -> list[int]:
        """Node id -> its shard (`host_shards`): the hybrid's fluid chains stay inside one (`fluid_chains`)."""
        return self._node_shard

    # ----- NetworkSimulator -----------------------------------------------------------------------
    def now(self) -> int:
        return self._now

    def in_flight(self) -> int:
        return sum(s.in_flight() for s in self.shards) + len(self._held)

    def submit(self, flows: Sequence[Flow], at: int) -> None:
        """Each flow to the shard of its sender's host, or held here while a dep is unfinished on another shard."""
        if at < self._now:
            raise CausalityError(f"flows submitted at {at} ns but the network is already at {self._now} ns")
        node_shard, where, held, waiters = self._node_shard, self._where, self._held, self._waiters
        per: dict[int, list[Flow]] = {}
        across: dict[tuple[int, int], list[int]] = {}  # a shared deps list's deps on other shards, by (list id, shard)
        for f in flows:
            s = node_shard[f.src]
            deps = f.deps
            if not deps:
                where[f.id] = s
                add_to(per, s, f)
                continue
            key = (id(deps), s)
            other = across.get(key) if len(deps) > 1 else None
            if other is None:
                other = []
                for d in dict.fromkeys(deps) if len(deps) > 1 else deps:
                    w = where.get(d)
                    if w is None:
                        h = held.get(d)
                        if h is None:
                            continue  # (done, the other side's, or a later flow of its own shard's batch)
                        w = h[2]
                    if w != s:
                        other.append(d)
                if len(deps) > 1:
                    across[key] = other
            if not other:
                where[f.id] = s
                add_to(per, s, f)
                continue
            hold(held, waiters, f, at, s, other)
        self._to_shards(per, at)

    def submit_routed(self, flows: Sequence[Flow], at: int, pinned: Mapping[int, int] | None = None) -> None:
        """Each flow to the shard of its sender's host (or its shard in `pinned`: a marker, which touches no channel)
        with all its deps, none held here: the hybrid's fluid chains (`fluid_chains`), which tell a shard the ends of
        its flows' deps elsewhere (`arrive_by_shard`)."""
        if at < self._now:
            raise CausalityError(f"flows submitted at {at} ns but the network is already at {self._now} ns")
        node_shard, where = self._node_shard, self._where
        shard_of = (pinned or {}).get
        per: dict[int, list[Flow]] = {}
        for f in flows:  # (`add_to`, inline)
            fid = f.id
            s = shard_of(fid)
            if s is None:
                s = node_shard[f.src]
            where[fid] = s
            group = per.get(s)
            if group is None:
                per[s] = [f]
            else:
                group.append(f)
        self._to_shards(per, at, routed=True)

    def arrive_by_shard(self, arrived: dict[int, list[int]], t: int) -> None:
        """Deps that ended elsewhere at `t`, told to each shard waiting on some (shard -> their ids): one exchange."""
        self._fresh = False
        cpu, worst = self.shard_cpu_s, 0.0
        for s, ids in arrived.items():
            if self.wire:  # (the driver's encoding; the shard's decoding is its CPU)
                sent = msgpack.packb(ids)
                self.wire_bytes += len(sent)
            t0 = time.process_time()
            self.shards[s].arrive(msgpack.unpackb(sent) if self.wire else ids, t)
            dt = time.process_time() - t0
            cpu[s] += dt
            worst = max(worst, dt)
        self.critical_cpu_s += worst
        self.exchanges += 1

    def _to_shards(self, per: dict[int, list[Flow]], at: int, routed: bool = False) -> None:
        if not per:
            return
        self._fresh = False
        cpu, worst = self.shard_cpu_s, 0.0
        for s, group in per.items():
            sent = self._pack(group, s, routed) if self.wire else None  # (this side's encoding: the driver's CPU)
            self.wire_bytes += len(sent or b"")
            t0 = time.process_time()
            self.shards[s].submit(group if sent is None else _unpack_flows(sent), at)
            dt = time.process_time() - t0
            cpu[s] += dt
            worst = max(worst, dt)
        self.critical_cpu_s += worst
        self.exchanges += 1

    def _pack(self, group: list[Flow], s: int, routed: bool = False) -> bytes:
        """(wire) A batch as a process split sends it to shard `s` (`_rows`), through msgpack."""
        return msgpack.packb(self._rows(group, s, routed))

    def _rows(self, group: list[Flow], s: int, routed: bool = False) -> list[tuple[object, ...]]:
        """A batch as a process split sends it to shard `s`: each flow's fields with only the deps that shard must
        wait on (unfinished there, or held here for it; `routed`: every one not done, the hybrid's fluid chains,
        whose ends elsewhere it tells the shard), a shared deps list filtered once."""
        where, held, sent, done = self._where, self._held, self._sent, self._done
        fresh = routed and not len(done)  # (nothing done yet, a replay's first submit of its whole DAG: keep them all)
        if fresh:  # (every field as it is, read at C speed: msgpack packs the deps tuple as the list it would be)
            sent.update(zip(map(_ID, group), group, strict=True))
            return list(map(_ROW, group))
        kept: dict[int, list[int]] = {}
        rows: list[tuple[object, ...]] = []
        for f in group:
            sent[f.id] = f
            deps = f.deps
            own = kept.get(id(deps))
            if own is None:
                own = (
                    [d for d in deps if d not in done]
                    if routed
                    else [d for d in deps if where.get(d) == s or (d in held and held[d][2] == s)]
                )
                if len(deps) > 1:
                    kept[id(deps)] = own
            rows.append((f.id, f.src, f.dst, f.size, own, f.delay_ns, f.tag, f.priority, f.key, f.loss_budget,
                         f.rate_bps, f.conn, f.queue, f.via_nic))  # fmt: skip
        return rows

    def _unpack_done(self, data: bytes) -> list[Completion]:
        """(wire) A shard's completions as (id, start, end), made whole from the flows sent."""
        sent = self._sent
        out = []
        for fid, start, end in msgpack.unpackb(data):
            f = sent.pop(fid)
            out.append(completion(fid, start, end, f.size, f.src, f.dst, f.tag))
        return out

    def next_event_time(self) -> int | None:
        if not self._fresh:
            times = [t for s in self.shards if (t := s.next_event_time()) is not None]
            self._next = min(times) if times else None
            self._fresh = True
        return self._next

    def advance(self, until: int) -> list[Completion]:
        """Run every event at or before `until` on every shard; now() becomes `until`."""
        if until < self._now:
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {self._now} ns")
        out: list[Completion] = []
        while (t := self.next_event_time()) is not None and t <= until:
            if self._waiters:  # (a held flow waits across shards: every shard to the next event ns, together)
                self.together_ns += 1
                got = self._run(t, t)
                out.extend(got)
                self._release(got, t)
            else:
                out.extend(self._run(until, None))
        self._now = until
        if len(out) > 1:
            out.sort(key=_BY_END)
        return out

    def _run(self, until: int, at: int | None) -> list[Completion]:
        """Every shard with an event at or before `until` (`at`: exactly at) run to it, timed; their completions."""
        self._fresh = False
        cpu, worst, got = self.shard_cpu_s, 0.0, []
        where = self._where
        for i, s in enumerate(self.shards):
            t = s.next_event_time()
            if t is None or t > until or (at is not None and t != at):
                continue
            t0 = time.process_time()
            done = s.advance(until)
            sent = _pack_done(done) if self.wire else None  # (the shard's encoding: its CPU)
            dt = time.process_time() - t0
            if sent is not None:
                self.wire_bytes += len(sent)
                done = self._unpack_done(sent)
            cpu[i] += dt
            worst = max(worst, dt)
            for c in done:
                del where[c.flow_id]
            got.extend(done)
        self.critical_cpu_s += worst
        self.exchanges += 1
        return got

    def _release(self, completions: list[Completion], t: int) -> None:
        """Held flows whose last dep on another shard completed (at `t`) go to their shard at max(their ns, `t`)."""
        held, waiters = self._held, self._waiters
        per: dict[int, dict[int, list[Flow]]] = {}  # submit ns -> shard -> flows
        for c in completions:
            for j in waiters.pop(c.flow_id, ()):
                entry = one_nearer(held, j)
                if entry is None:
                    continue
                f, at, s, _ = entry
                self._where[j] = s
                add_to(per.setdefault(max(at, t), {}), s, f)
        for at, groups in sorted(per.items()):
            self._to_shards(groups, at)

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        """Run until nothing is in flight (every shard, held flows released as their deps end)."""
        out: list[Completion] = []
        while (t := self.next_event_time()) is not None:
            if limit_ns is not None and t > limit_ns:
                break
            out.extend(self.advance(t))
        return sorted(out, key=_BY_END)

    def close(self) -> None:
        for s in self.shards:
            s.close()

    # ----- what the hybrid reports --------------------------------------------------------------
    def _synced(self) -> None:
        """Every shard's clock at now() (a shard runs only when it has an event: its busy periods count to now)."""
        for s in self.shards:
            if s.now() < self._now:
                s.advance(self._now)

    def channel_bytes(self) -> list[int]:
        return [sum(col) for col in zip(*(s.channel_bytes() for s in self.shards), strict=True)]

    def channel_busy_ns(self) -> list[int]:
        self._synced()
        return [sum(col) for col in zip(*(s.channel_busy_ns() for s in self.shards), strict=True)]

    def channel_usage(self, elapsed_ns: int | None = None) -> list[ChannelUsage]:
        """The shards' rows (a channel is one host's, so one shard's), in channel order."""
        self._synced()
        elapsed = self._now if elapsed_ns is None else elapsed_ns
        rows = [r for s in self.shards for r in s.channel_usage(elapsed)]
        return sorted(rows, key=lambda r: r.channel)

    def rates(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for s in self.shards:
            out.update(s.rates())
        return out

    def stats(self) -> dict[str, object]:
        """The shards' counters summed (`max_component` their largest), and the split's own figures."""
        parts = [s.stats() for s in self.shards]
        out = dict(parts[0])
        for key, value in parts[0].items():
            if isinstance(value, int) and not isinstance(value, bool) and key != "ecmp_hash":
                vals = [int(p.get(key, 0)) for p in parts]  # type: ignore[call-overload]
                out[key] = max(vals) if key in _COUNTERS_MAX else sum(vals)
        for key in ("switch_link_bytes_max", "switch_link_bytes_min", "switch_links_idle"):
            out.pop(key, None)
        out.update(switch_link_load(self.topology, dict(enumerate(self.channel_bytes()))))
        out["fluid_shards"] = {
            "shards": len(self.shards),
            "shard_cpu_s": [round(x, 6) for x in self.shard_cpu_s],
            "critical_cpu_s": round(self.critical_cpu_s, 6),
            "exchanges": self.exchanges,
            "together_ns": self.together_ns,
            **({"wire_bytes": self.wire_bytes} if self.wire else {}),
        }
        return out


def _unpack_flows(data: bytes) -> list[Flow]:
    return [
        Flow(i, a, b, n, tuple(deps), delay, tag, prio, key, loss, rate, conn, queue, nic)
        for i, a, b, n, deps, delay, tag, prio, key, loss, rate, conn, queue, nic in msgpack.unpackb(data)
    ]


def _pack_done(done: list[Completion]) -> bytes:
    return msgpack.packb([(c.flow_id, c.start_ns, c.end_ns) for c in done])
