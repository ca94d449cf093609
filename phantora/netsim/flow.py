"""The flow-level network engine: event-driven, max-min fair sharing of directed channels.

Model (see docs/flow-engine.md):
- A flow is released when its deps have all *arrived* and its submit time ``at`` has passed; it
  starts transmitting ``delay_ns`` later (``start_ns`` of its Completion).
- While transmitting it gets its max-min fair share of every channel on its ECMP route; channel
  capacity is ``bandwidth * payload_efficiency``. With ``lb=spray|spray_rr`` a flow's rate is split over
  its equal-cost paths as switches that spray split it (`phantora.netsim.multipath`); with ``lb=adaptive``
  each hop's equal-cost channels pool their capacity (ideal multipath); ``lb=flowlet`` keeps ECMP.
- A flow with a rate cap (``Flow.rate_bps``, payload bits/s) also crosses a private pseudo-channel of
  that capacity, allocated when it starts transmitting and freed when it stops: its rate is
  min(its max-min share, cap), and what it leaves unused goes to the others.
- Transmission ends at the first integer ns at or after the exact end of the last byte; the flow
  completes (``end_ns``) one path propagation latency later, and releases its dependents then.
- A flow with ``size == 0`` or ``src == dst`` completes as soon as it starts.
- Flows of one queue (``Flow.queue``: a connection's messages, sent in order) transmit one at a time in release
  order: a flow released while another of its queue is transmitting waits for that one's transmission end (not
  its arrival), so messages in flight on one connection follow each other on the wire.
- Rates change only at events. An event re-solves only the connected components (flows linked by
  shared channels) of the channels it touched, and only flows whose rate changed are rescheduled. A
  component whose flows all cross one path (a GPU pair's NVLink channels), each under its own rate cap or none,
  gets its closed form, no solver. From `CARRY_FLOWS` flows transmitting (ECMP routes), or while a component of them
  has `CARRY_GIANT`, max-min is carried from one event to the next instead (`maxmin_carry.CarriedMaxMin`: only
  the rounds an event changes run again), with the same rates bit for bit.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from operator import attrgetter

import numpy as np

from phantora.errors import InputError, PhantoraError
from phantora.netsim.base import (
    INF_NS,
    CausalityError,
    Completion,
    Flow,
    check_flow_batch,
    completion,
    step_watching,
)
from phantora.netsim.gc_pause import gc_paused
from phantora.netsim.idset import IdSet
from phantora.netsim.maxmin import NUMPY_THRESHOLD, maxmin_python, maxmin_rates
from phantora.netsim.maxmin_carry import CarriedMaxMin
from phantora.netsim.multipath import MultiRoute, multipath
from phantora.netsim.observe import ChannelUsage, switch_link_load
from phantora.topology.model import Topology

_TX_END, _ARRIVE, _START = 0, 1, 2  # an ns's events run in this order, each kind by flow id (and version)
_VER_BITS = 32  # a transmit end's entry: (flow id << _VER_BITS) | its version (versions stay below 2^32)
_VER_MASK = (1 << _VER_BITS) - 1
_TOL_NS = 1e-6  # float noise absorbed when rounding a transmit end up to whole ns (plus 1e-12 relative)
_GIANT_SKIP = 8  # after a giant re-solve, solve everything for this many events before searching again
CARRY_FLOWS = 1024  # flows transmitting from which max-min is carried between events
CARRY_GIANT = 64  # ... and, fewer, while a component of them has this many flows
_CARRY_CHECK = 32  # carried events between two searches, under CARRY_FLOWS, for whether one still has
# A carrier whose rounds run again in full read more flows an event (over `_CARRY_CHECK` events) than this share of
# its flows, and more than twice the largest component, is dropped for `_CARRY_REST` events, twice that after each
# drop in a row: it re-reads whole rounds of many small components at one level (a chunked tree's steps), which the
# component solves read one component at a time
_CARRY_WASTE = 0.5
_CARRY_REST = 256
_CARRY_REST_MAX = 1 << 16
SLACK_MARGIN = 1e-9  # `cap_slack`: a channel is slack while its flows' caps sum under (1 - this) of its capacity
_PENDING_MASK = (1 << 32) - 1
_BY_END = attrgetter("end_ns", "flow_id")  # completions in the order `_take` gives them
_ROUTE_CACHE_MAX = 1 << 18  # entries; cleared when full (flows without a key on a pair with choices each have one)
LB_MODELS = {  # the packet engine's lb -> the flow engine's model of it (results.json: lb_model)
    "ecmp": "ecmp",
    "spray": "spray: per-hop even split over the equal-cost paths (the expectation of random spraying)",
    "spray_rr": "spray: per-hop even split over the equal-cost paths (what round robin gives)",
    "adaptive": "adaptive: ideal multipath (each hop's equal-cost channels pool their capacity)",
    "flowlet": "flowlet: per-flow ECMP (a fluid flow has no gaps, so no flowlet ever moves)",
    "reps": "spray: per-hop even split over the equal-cost paths (what REPS converges to on a balanced fabric)",
    "oblivious": "spray: per-hop even split over the equal-cost paths (the expectation of oblivious spraying)",
}


class _Active:
    """A transmitting flow: bytes left at t_last, at the current rate (bytes/ns)."""

    __slots__ = ("flow", "path", "lat", "start", "rem", "rate", "t_last", "ver", "multi", "cap_ch", "solve_path")

    def __init__(
        self, flow: Flow, path: tuple[int, ...], lat: int, start: int, multi: MultiRoute | None, cap_ch: int = -1
    ) -> None:
        self.flow = flow
        self.path = path  # the real channels (components, byte and busy counters)
        self.multi = multi  # the multipath split under lb=spray|adaptive, else None (path is the ECMP route)
        self.cap_ch = cap_ch  # the private pseudo-channel of its rate cap, or -1 (no cap)
        self.solve_path = path if cap_ch < 0 else (*path, cap_ch)  # what the solver sees: path + cap channel
        self.lat = lat
        self.start = start
        self.rem = float(flow.size)
        self.rate = 0.0
        self.t_last = start
        self.ver = 0


def _unique(deps: tuple[int, ...]) -> Iterable[int]:
    """Deps without repeats, in order."""
    return deps if len(deps) < 2 else dict.fromkeys(deps)


def _ceil_ns(x: float) -> int:
    """Whole ns needed for x ns of transmission (never less than the exact time, bar float noise)."""
    return max(0, math.ceil(x - _TOL_NS - x * 1e-12))


def one_path_rate(recs: Sequence[_Active], cap: Sequence[float]) -> float | None:
    """The max-min rate of every flow of a component whose flows all cross one path (no channel twice): its least
    channel capacity over their count, the value progressive filling gives bit for bit (every channel of the path
    has the same count, so the least share is the least capacity's, and dividing by one count keeps the order of
    floats); None for any other component (not one path, or a path through a channel twice)."""
    path = recs[0].solve_path
    for r in recs:
        if r.solve_path != path:
            return None
    if len(path) == 2:  # (an NVLink hop: GPU -> NVSwitch -> GPU)
        a, b = cap[path[0]], cap[path[1]]
        if path[0] == path[1]:
            return None
        return (a if a <= b else b) / len(recs)
    if len(set(path)) != len(path):
        return None
    return min(cap[c] for c in path) / len(recs)


def one_path_capped_rates(recs: Sequence[_Active], cap: Sequence[float]) -> list[float] | None:
    """The max-min rates of a component whose flows all cross one path (no channel twice), each through its own
    rate cap's pseudo-channel or none (an NVLink GPU pair's channels under NCCL's caps), bit for bit those
    progressive filling gives (`maxmin_python`): each round the level is the least of the path's shares (remaining
    capacity over the flows left, as a float) and the least cap left; at a cap the flows of that cap freeze there
    and the path's channels lose that many times the level, at the path's share every flow left freezes. None for
    any other component."""
    path = recs[0].path
    for r in recs:
        if r.path != path:
            return None
    if len(set(path)) != len(path):
        return None
    capped = sorted([(cap[r.cap_ch], i) for i, r in enumerate(recs) if r.cap_ch >= 0])
    rem = [cap[c] for c in path]
    rates: list[float] = [-1.0] * len(recs)
    left, weight, k = len(recs), float(len(recs)), 0
    while True:
        share = min([x / weight for x in rem])
        if k == len(capped) or share <= capped[k][0]:
            return [share if r < 0.0 else r for r in rates]
        level = capped[k][0]
        first = k
        while k < len(capped) and capped[k][0] == level:
            rates[capped[k][1]] = level
            k += 1
        frozen = k - first
        left -= frozen
        if not left:
            return rates
        rem = [max(x - frozen * level, 0.0) for x in rem]
        weight = weight - frozen


class FlowSimulator:
    """Flow-level `NetworkSimulator`: max-min fair rates over the topology's directed channels."""

    posts_at_dep_ends = False  # as a packet side under the hybrid (tests): flows waiting on flows are held there
    carries = True  # max-min may be carried between events (a subclass that moves flows or capacities says False)
    # An event whose flows all have rate caps and leave every channel they start or stop on slack (`_slack_resolve`)
    # sets the new flows at their caps and solves nothing (NCCL's caps under a NIC's or NVLink's rate), at the events
    # that are not carried. On from `__init__` in an engine that moves no flows or capacities (a class that
    # `carries`) on ECMP routes (multipath never takes it); True here turns it on in a subclass, and a caller may set
    # it before its first flow (False turns it off; the hybrid's fluid NVLink side sets it).
    cap_slack = False

    def __init__(
        self,
        topology: Topology,
        *,
        payload_efficiency: float = 1.0,
        incremental: bool = True,
        verify: bool = False,
        ecmp_hash: str | None = None,
        lb: str = "ecmp",
    ) -> None:
        """`incremental=False` re-solves every active flow at each event; `verify=True` cross-checks
        each incremental re-solve against a full one (slow; for tests). `ecmp_hash` sets the topology's
        ECMP policy (phantora | hpcc; None keeps the topology's). `lb` is the packet engine's load balancing
        (`LB_MODELS` says what models each)."""
        if not 0.0 < payload_efficiency <= 1.0:
            raise InputError(f"must be in (0, 1], got {payload_efficiency}", field="payload_efficiency")
        if lb not in LB_MODELS:
            raise InputError(f"unknown load balancing {lb!r} (known: {', '.join(LB_MODELS)})", field="lb")
        self.lb = lb
        self._multi = lb in ("spray", "spray_rr", "adaptive", "reps", "oblivious")
        self.cap_slack = type(self).cap_slack or (type(self).carries and not self._multi)
        self._multi_routes: dict[tuple[int, int, bool], MultiRoute] = {}
        self._pools: dict[tuple[int, ...], int] = {}  # adaptive: a layer of 2+ channels -> its pooled channel id
        self._pools_of: dict[int, list[int]] = {}  # adaptive: channel -> the pooled channels holding it
        self._free_caps: list[int] = []  # pseudo-channels of rate caps, free for reuse (the last freed first)
        self._cap_channels = 0  # pseudo-channels of rate caps ever made
        if ecmp_hash is not None:
            try:
                topology.use_ecmp(ecmp_hash)
            except ValueError as exc:
                raise InputError(str(exc), field="ecmp_hash") from None
        self.topology = topology
        self.payload_efficiency = float(payload_efficiency)
        self.incremental = incremental
        self.verify = verify
        nch = topology.num_channels
        self._cap = [topology.channel_bandwidth(c) * self.payload_efficiency / 8e9 for c in range(nch)]  # bytes/ns
        self._cap_arr = np.asarray(self._cap, dtype=np.float64)
        self._lat = [topology.channel_latency(c) for c in range(nch)]
        self._routes: dict[tuple[int, ...], tuple[tuple[int, ...], int]] = {}
        self.stretch: Callable[[Flow, int], int] | None = None  # (flow, release ns) -> its delay (gpu_slow)
        self.prechecked = False  # set by a caller that checks every batch it submits whole (the nvlink=fluid hybrid)
        self._now = 0
        # The event queue: a heap of the ns that have events, and per ns its events by kind (`_TX_END`: flow id <<
        # _VER_BITS | version; `_ARRIVE`, `_START`: flow id), sorted only when that ns runs (`_step`); `_at` is the
        # ns running, whose lists take its new events (its starts as a heap once they run: `_starting`).
        self._times: list[int] = []
        self._events: dict[int, tuple[list[int], list[int], list[int]]] = {}
        self._at: int | None = None
        self._cur: tuple[list[int], list[int], list[int]] = ([], [], [])
        self._starting = False
        self._flows: dict[int, Flow] = {}  # submitted, not completed
        self._wait: dict[int, int] = {}  # flow id -> (submit time << 32) | deps outstanding
        self._dependents: dict[int, int | list[int]] = {}  # flow id -> the flow(s) waiting on it
        self._done = IdSet()
        self._active: dict[int, _Active] = {}
        self._arriving: dict[int, int] = {}  # flow id -> start_ns, in propagation
        self._sending: dict[int, int] = {}  # queue -> its flow transmitting now
        self._queued: dict[int, deque[int]] = {}  # queue -> its flows released, waiting their turn
        self._ch_flows: dict[int, set[int]] = {}  # busy channel -> active flow ids
        self._busy_since: dict[int, int] = {}
        self._busy_ns = [0] * nch
        self._bytes = [0] * nch
        self._out: list[Completion] = []
        self._skip_bfs = 0
        self._carry: CarriedMaxMin | None = None  # max-min carried between events, while CARRY_FLOWS transmit
        self._carry_wait = 0  # events to wait before carrying again, after a solve that could not be carried
        self._carry_check = _CARRY_CHECK  # carried events left before the next search (under CARRY_FLOWS)
        self._carry_read = [0, 0, 0]  # since the carrier's last check: flows its full rounds read, its flows, events
        self._carry_rest = _CARRY_REST  # events without a carrier after the next drop for waste
        self._left: list[int] = []  # flows that stopped transmitting since the last solve (while carrying)
        self._joined: list[int] = []  # and flows that started
        # `cap_slack`: per channel the caps (bytes/ns) of the capped flows transmitting on it, its uncapped ones, the
        # sum its flows' caps must stay under to be slack; whether every start and stop of this event left its
        # channels slack, and the flows it started
        self._capsum = [0.0] * nch
        self._uncapped = [0] * nch
        self._slack_lim = [c * (1.0 - SLACK_MARGIN) for c in self._cap]
        self._slack_ok = True
        self._slack_joined: list[_Active] = []
        self._stats = {
            "flows_submitted": 0,
            "flows_completed": 0,
            "events": 0,
            "resolves": 0,
            "resolved_flows": 0,
            "max_component": 0,
            "numpy_resolves": 0,
            "giant_resolves": 0,
            "rate_changes": 0,
            "capped_flows": 0,
            "queued_messages": 0,
            "carried_resolves": 0,
            "carried_rounds": 0,
            "carry_fallbacks": 0,
            "carry_drops": 0,
            "slack_resolves": 0,
        }

    # ----- NetworkSimulator ----------------------------------------------------------------
    def now(self) -> int:
        return self._now

    def in_flight(self) -> int:
        return len(self._flows)

    def submit(self, flows: Sequence[Flow], at: int) -> None:
        """Add flows eligible from `at` (>= now()). Deps may name flows of this batch or earlier ones."""
        if at < self._now:
            raise CausalityError(f"flows submitted at {at} ns but the network is already at {self._now} ns")
        with gc_paused():
            if not self.prechecked:
                self._check_batch(flows)
            known, done, dependents = self._flows, self._done, self._dependents
            for f in flows:
                known[f.id] = f
                pending = 0
                for d in _unique(f.deps):
                    if d in known or d not in done:  # (a flow submitted is done once it leaves `_flows`)
                        waiting = dependents.get(d)
                        if waiting is None:
                            dependents[d] = f.id
                        elif isinstance(waiting, list):
                            waiting.append(f.id)
                        else:
                            dependents[d] = [waiting, f.id]
                        pending += 1
                if pending:
                    self._wait[f.id] = (at << 32) | pending
                else:
                    delay = f.delay_ns if self.stretch is None else self.stretch(f, at)
                    self._schedule(at + delay, _START, f.id)
        self._stats["flows_submitted"] += len(flows)

    def next_event_time(self) -> int | None:
        times, events, active = self._times, self._events, self._active
        while times:
            t = times[0]
            ev = events[t]
            if ev[1] or ev[2]:
                return t
            ends = ev[0]
            while ends:  # (a stale transmit end never turns valid again: drop those met at the back)
                k = ends[-1]
                rec = active.get(k >> _VER_BITS)
                if rec is not None and rec.ver == k & _VER_MASK:
                    return t
                ends.pop()
            heapq.heappop(times)
            del events[t]
        return None

    def advance(self, until: int) -> list[Completion]:
        """Run every event at or before `until`; now() becomes `until`."""
        if until < self._now:
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {self._now} ns")
        with gc_paused():
            while (t := self.next_event_time()) is not None and t <= until:
                self._step(t)
        self._now = until
        return self._take()

    def advance_to_completion(self, until: int) -> list[Completion]:
        """`advance(until)`, but return right after the first event time at which any flow completes (now()
        that time). With no limit (`until` >= 2^62) it also returns once nothing is left to happen."""
        if until < self._now:
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {self._now} ns")
        with gc_paused():
            while (t := self.next_event_time()) is not None and t <= until:
                self._step(t)
                self._now = t
                if self._out:
                    return self._take()
        if until < INF_NS:
            self._now = until
        return self._take()

    def _run_events(self, limit_ns: int | None, busy: Callable[[], bool] = lambda: True) -> None:
        """Step through events while `busy()` holds; raise if that would pass `limit_ns`."""
        with gc_paused():
            while busy() and (t := self.next_event_time()) is not None:
                if limit_ns is not None and t > limit_ns:
                    raise PhantoraError(
                        f"the network did not drain by {limit_ns} ns: {len(self._flows)} flows still in flight "
                        f"(next event at {t} ns)"
                    )
                self._step(t)

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        """Run until nothing is in flight; raise if that would pass `limit_ns` or cannot happen."""
        self._run_events(limit_ns)
        if self._flows:
            stuck = sorted(self._wait)[:5]
            raise PhantoraError(
                f"{len(self._flows)} flows can never start: they wait on flows that never complete "
                f"(first: {', '.join(map(str, stuck))})"
            )
        return self._take()

    def stats(self) -> dict[str, object]:
        out = dict(
            self._stats,
            active=len(self._active),
            routes_cached=len(self._routes),
            ecmp_hash=self.topology.ecmp_hash,
            cap_channels=self._cap_channels,
        )
        out.update(switch_link_load(self.topology, dict(enumerate(self._bytes))))
        if self.lb != "ecmp":
            out["lb"] = self.lb
            out["lb_model"] = LB_MODELS[self.lb]
            out["approximations"] = [f"lb={self.lb}: {LB_MODELS[self.lb]}"]
        return out

    def close(self) -> None:
        self._times.clear()
        self._events.clear()

    def advance_watching(self, until: int, watch: Collection[int], earliest: int | None = None) -> list[Completion]:
        """Stepped one event time at a time (`step_watching`): rates change only at events."""
        return step_watching(self, until, watch, earliest)

    def keepalive(self) -> None:
        """In-process: nobody to tell."""

    def channels(self) -> FlowSimulator:
        return self

    def fabric(self) -> None:
        """A fluid model has no packets: no PFC, queues, drops or marks."""
        return None

    # ----- reports -------------------------------------------------------------------------
    def channel_bytes(self) -> list[int]:
        """Bytes of finished transmissions carried by each channel, indexed by channel id."""
        return list(self._bytes)

    def channel_busy_ns(self) -> list[int]:
        """Time each channel spent carrying at least one transmitting flow, up to now()."""
        busy = list(self._busy_ns)
        for c, since in self._busy_since.items():
            busy[c] += self._now - since
        return busy

    def channel_usage(self, elapsed_ns: int | None = None) -> list[ChannelUsage]:
        """Per-channel bytes, busy time and utilisation over `elapsed_ns` (default now()), for used channels."""
        elapsed = self._now if elapsed_ns is None else elapsed_ns
        busy = self.channel_busy_ns()
        rows = []
        for c, nbytes in enumerate(self._bytes):
            if nbytes or busy[c]:
                a, b = self.topology.channel_ends(c)
                bw = self.topology.channel_bandwidth(c)
                util = nbytes * 8e9 / (bw * elapsed) if elapsed > 0 else 0.0
                rows.append(ChannelUsage(c, c >> 1, a, b, bw, nbytes, busy[c], util))
        return rows

    def rates(self) -> dict[int, float]:
        """Current rate of each transmitting flow, in bytes/ns."""
        return {fid: rec.rate for fid, rec in self._active.items()}

    # ----- internals -----------------------------------------------------------------------
    def _check_batch(self, flows: Sequence[Flow]) -> set[int]:
        """Validate a batch (see `check_flow_batch`), then route each flow so a bad route names its flow."""
        ids = check_flow_batch(flows, self.topology, lambda i: i in self._flows or i in self._done)
        for f in flows:
            if f.size and f.src != f.dst:
                try:
                    self.route(f)  # fails here, naming the flow, rather than deep inside advance()
                except InputError as exc:
                    raise InputError(f"flow {f.id}: {exc}", field="src/dst") from None
        return ids

    def route(self, f: Flow) -> tuple[tuple[int, ...], int]:
        """Channels and propagation latency (ns) of a flow's path, cached per (src, dst), or per (src, dst, ECMP key)
        where the pair has more than one path (`Topology.one_path`)."""
        nic = f.via_nic  # through the NICs: never the pair's NVSwitch route
        hit = None if nic else self._routes.get((f.src, f.dst))  # (a pair is a key only where it has one path)
        if hit is not None:
            return hit
        key = self.topology.route_cache_key(f.src, f.dst, f.id if f.key is None else f.key, nic)
        hit = self._routes.get(key)
        if hit is None:
            if len(self._routes) >= _ROUTE_CACHE_MAX:
                self._routes.clear()
            path = tuple(self.topology.route(*key))
            hit = self._routes[key] = (path, sum(self._lat[c] for c in path))
        return hit

    def multi_route(self, f: Flow) -> MultiRoute:
        """The flow's per-hop even split over its equal-cost paths (lb=spray|adaptive), cached per (src, dst)."""
        nic = f.via_nic
        key = (f.src, f.dst, nic)
        hit = self._multi_routes.get(key)
        if hit is None:
            if len(self._multi_routes) >= _ROUTE_CACHE_MAX:
                self._multi_routes.clear()
            hit = self._multi_routes[key] = multipath(self.topology, f.src, f.dst, nic)
            if self.lb == "adaptive":
                for layer in hit.layers:
                    if len(layer) > 1 and layer not in self._pools:
                        self._pools[layer] = pid = len(self._cap)
                        self._cap.append(sum(self._cap[c] for c in layer))
                        for c in layer:
                            self._pools_of.setdefault(c, []).append(pid)
                self._cap_arr = np.asarray(self._cap, dtype=np.float64)
        return hit

    def _alloc_cap(self, rate_bps: int) -> int:
        """A private pseudo-channel of `rate_bps` payload bits/s (so bytes/ns as `_cap`, which is payload
        capacity): the last one freed, else a new id after every channel and pool made so far. (Its id changes no
        rate: max-min's operations are per channel and in no channel's order, `phantora.netsim.maxmin`.)"""
        value = rate_bps / 8e9
        if self._free_caps:
            ch = self._free_caps.pop()
            self._cap[ch] = value
        else:
            ch = len(self._cap)
            self._cap.append(value)
            self._cap_channels += 1
        arr = self._cap_arr
        if ch >= len(arr):  # grow by doubling: the numpy solver indexes it by channel id, never by its length
            grown = np.zeros(max(2 * len(arr), ch + 1), dtype=np.float64)
            grown[: len(arr)] = arr
            self._cap_arr = arr = grown
        arr[ch] = value
        return ch

    def _schedule(self, t: int, kind: int, key: int) -> None:
        """An event of `kind` at ns `t` (`key`: its flow id, with its version for a transmit end)."""
        if t == self._at and kind != _TX_END:  # (the ns running: its arrivals come before they are read)
            if kind == _START and self._starting:
                heapq.heappush(self._cur[_START], key)
            else:
                self._cur[kind].append(key)
            return
        ev = self._events.get(t)
        if ev is None:
            ev = self._events[t] = ([], [], [])
            heapq.heappush(self._times, t)
        ev[kind].append(key)

    def _take(self) -> list[Completion]:
        out, self._out = self._out, []
        out.sort(key=_BY_END)
        return out

    def _step(self, t: int) -> None:
        """Process every event at time t as one batch (transmit ends, then arrivals, then starts, each kind in flow
        id order), then re-solve the touched components."""
        self._now = t
        self._stats["events"] += 1
        touched: set[int] = set()
        ev = self._events.pop(t, None)
        if ev is not None:  # (none when a subclass steps to an ns of its own)
            heapq.heappop(self._times)  # (t: next_event_time dropped the ns before it that had only stale ends)
            self._at, self._cur = t, ev
            try:
                self._run_ends(ev[0], t, touched)
                arrivals = ev[1]
                arrivals.sort()
                arriving = self._arriving
                for fid in arrivals:
                    self._complete(fid, arriving.pop(fid), t)
                self._run_starts(ev[2], t, touched)
            finally:
                self._at = None
                self._starting = False
        if touched:
            self._resolve(touched, t)

    def _leave_channels(self, fid: int, path: tuple[int, ...], t: int, touched: set[int]) -> None:
        """Flow `fid` leaves the channels of `path` at t: a channel it leaves empty ends its busy period."""
        ch_flows = self._ch_flows
        for c in path:
            members = ch_flows[c]
            members.discard(fid)
            if not members:
                del ch_flows[c]
                self._busy_ns[c] += t - self._busy_since.pop(c)
        touched.update(path)

    def _run_ends(self, ends: list[int], t: int, touched: set[int]) -> None:
        """The transmit ends at t, in (flow id, version) order; a stale one (its flow's rate changed since) is
        skipped. (Per flow: `_slack_leave` and `_leave_channels` inline.)"""
        ends.sort()
        active, carrying, free_caps = self._active, self._carry is not None, self._free_caps
        slack = self.cap_slack and not carrying  # (the slack sums are not kept while max-min is carried)
        nbytes, ch_flows, busy_ns, busy_since = self._bytes, self._ch_flows, self._busy_ns, self._busy_since
        capsum, lim, unc = self._capsum, self._slack_lim, self._uncapped
        arriving, events = self._arriving, self._events
        for k in ends:
            fid = k >> _VER_BITS
            rec = active.get(fid)
            if rec is None or rec.ver != k & _VER_MASK:
                continue
            del active[fid]
            if carrying:
                self._left.append(fid)
            f, path = rec.flow, rec.path
            if slack:
                if f.rate_bps:  # (`_slack_leave`, inline)
                    v = f.rate_bps / 8e9
                    for c in path:
                        x = capsum[c]
                        if x >= lim[c] or unc[c]:
                            self._slack_ok = False
                        capsum[c] = 0.0 if len(ch_flows[c]) == 1 else x - v
                else:  # (`_slack_leave` of an uncapped flow)
                    for c in path:
                        unc[c] -= 1
                    self._slack_ok = False
            if rec.cap_ch >= 0:
                free_caps.append(rec.cap_ch)
            if rec.multi is None:
                size = f.size
                for c in path:
                    nbytes[c] += size
            else:
                for c, part in zip(rec.multi.channels, rec.multi.share, strict=True):
                    nbytes[c] += round(f.size * part)
            for c in path:  # (`_leave_channels`, inline)
                members = ch_flows[c]
                members.discard(fid)
                if not members:
                    del ch_flows[c]
                    busy_ns[c] += t - busy_since.pop(c)
            touched.update(path)
            arriving[fid] = rec.start
            at = t + rec.lat
            if at == t:  # (the ns running: `_schedule` puts it in its lists)
                self._schedule(at, _ARRIVE, fid)
            else:  # (`_schedule`, inline)
                ev = events.get(at)
                if ev is None:
                    ev = events[at] = ([], [], [])
                    heapq.heappush(self._times, at)
                ev[_ARRIVE].append(fid)
            if f.queue:
                self._next_message(f.queue, t, touched)

    def _run_starts(self, starts: list[int], t: int, touched: set[int]) -> None:
        """The flows starting at t, in flow id order (a flow a zero-byte start releases at t joins them)."""
        heapq.heapify(starts)
        self._starting = True
        flows = self._flows
        while starts:
            fid = heapq.heappop(starts)
            f = flows[fid]
            if f.size == 0 or f.src == f.dst:
                self._complete(fid, t, t)
                continue
            if f.queue:
                if f.queue in self._sending:  # its queue is busy: after the flows released before it
                    self._queued.setdefault(f.queue, deque()).append(fid)
                    self._stats["queued_messages"] += 1
                    continue
                self._sending[f.queue] = fid
            self._begin(f, t, touched)

    def _next_message(self, queue: int, t: int, touched: set[int]) -> None:
        """A transmission of `queue` ended at t: its next flow released starts now, if any."""
        waiting = self._queued.get(queue)
        if not waiting:
            del self._sending[queue]
            return
        fid = waiting.popleft()
        if not waiting:
            del self._queued[queue]
        self._sending[queue] = fid
        self._begin(self._flows[fid], t, touched)

    def _begin(self, f: Flow, t: int, touched: set[int]) -> None:
        """Flow f starts transmitting at t on its route (and its rate cap's pseudo-channel). (`_alloc_cap` of a freed
        pseudo-channel, `_slack_join` and `_occupy`, inline.)"""
        fid = f.id
        cap_ch = -1
        rate = f.rate_bps
        if rate:
            free = self._free_caps
            if free:
                cap_ch = free.pop()
                self._cap[cap_ch] = self._cap_arr[cap_ch] = rate / 8e9
            else:
                cap_ch = self._alloc_cap(rate)
            self._stats["capped_flows"] += 1
        if self._multi:
            multi = self.multi_route(f)
            path, lat = multi.channels, multi.latency_ns
            rec = self._active[fid] = _Active(f, path, lat, t, multi, cap_ch)
        else:
            path, lat = self.route(f)
            rec = self._active[fid] = _Active(f, path, lat, t, None, cap_ch)
        if self._carry is not None:
            self._joined.append(fid)
        if self.cap_slack and self._carry is None:  # (the slack sums are not kept while max-min is carried)
            if rate:
                self._slack_joined.append(rec)
                v = rate / 8e9  # (its cap, as set above)
                capsum, lim, unc = self._capsum, self._slack_lim, self._uncapped
                for c in path:
                    x = capsum[c] = capsum[c] + v
                    if x >= lim[c] or unc[c]:
                        self._slack_ok = False
            else:  # (`_slack_join` of an uncapped flow: the event is not slack; its rec is not needed)
                unc = self._uncapped
                for c in path:
                    unc[c] += 1
                self._slack_ok = False
        ch_flows = self._ch_flows
        for c in path:
            on_channel = ch_flows.get(c)
            if on_channel is None:
                ch_flows[c] = {fid}
                self._busy_since[c] = t
            else:
                on_channel.add(fid)
        touched.update(path)

    def _slack_join(self, rec: _Active) -> None:
        """`cap_slack`: flow `rec` starts transmitting; the event stays slack if its channels' caps still sum under
        their limit, none with an uncapped flow (an uncapped flow always has a channel it fills)."""
        self._slack_joined.append(rec)
        unc = self._uncapped
        if not rec.flow.rate_bps:
            for c in rec.path:
                unc[c] += 1
            self._slack_ok = False
            return
        v = rec.flow.rate_bps / 8e9  # (its cap, as `_alloc_cap` sets it)
        capsum, lim = self._capsum, self._slack_lim
        for c in rec.path:
            s = capsum[c] = capsum[c] + v
            if s >= lim[c] or unc[c]:
                self._slack_ok = False

    def _slack_leave(self, rec: _Active) -> None:
        """`cap_slack`: flow `rec` stops transmitting; the event stays slack if its channels' caps summed under their
        limit with it (a channel it leaves empty sums 0 again: no float drift carried on)."""
        unc, ch_flows = self._uncapped, self._ch_flows
        if not rec.flow.rate_bps:
            for c in rec.path:
                unc[c] -= 1
            self._slack_ok = False
            return
        v = rec.flow.rate_bps / 8e9
        capsum, lim = self._capsum, self._slack_lim
        for c in rec.path:
            s = capsum[c]
            if s >= lim[c] or unc[c]:
                self._slack_ok = False
            capsum[c] = 0.0 if len(ch_flows[c]) == 1 else s - v

    def _occupy(self, fid: int, path: tuple[int, ...], t: int, touched: set[int]) -> None:
        """Flow `fid` is on every channel of `path` from `t` (a channel it finds idle is busy from `t`)."""
        for c in path:
            on_channel = self._ch_flows.get(c)
            if on_channel is None:
                self._ch_flows[c] = {fid}
                self._busy_since[c] = t
            else:
                on_channel.add(fid)
        touched.update(path)

    def _complete(self, fid: int, start: int, t: int) -> None:
        f = self._flows.pop(fid)
        self._done.add(fid)
        self._stats["flows_completed"] += 1
        self._out.append(completion(fid, start, t, f.size, f.src, f.dst, f.tag))
        waiting = self._dependents.pop(fid, None)
        if waiting is not None:
            self._released(waiting, t)

    def arrive(self, ids: Iterable[int], t: int) -> None:
        """Flows that ran elsewhere (the packet side, another engine) arrived at `t` (>= now()): the flows of this
        engine that wait on them are one dep nearer, released as a completion here would release them (the fluid
        NVLink side's chains, `hybrid.FluidNvlinkSimulator._chain_deps`)."""
        if t < self._now:
            raise CausalityError(f"deps arrived at {t} ns but the network is already at {self._now} ns")
        dependents = self._dependents
        for fid in ids:
            waiting = dependents.pop(fid, None)
            if waiting is not None:
                self._released(waiting, t)

    def _released(self, waiting: int | list[int], t: int) -> None:
        """A dep of `waiting` (a flow id, or a list) arrived at t."""
        for j in waiting if isinstance(waiting, list) else (waiting,):
            w = self._wait[j] - 1
            if w & _PENDING_MASK:
                self._wait[j] = w
            else:  # t is the arrival of its last dep
                del self._wait[j]
                f = self._flows[j]
                rel = max(w >> 32, t)
                delay = f.delay_ns if self.stretch is None else self.stretch(f, rel)
                self._schedule(rel + delay, _START, j)

    def _components(self, seeds: set[int], budget: int) -> list[list[int]] | None:
        """Connected components (flow ids) of active flows reachable from the seed channels.

        Returns None once one component exceeds `budget` flows: the caller then solves every
        active flow at once, which gives the same rates (components never influence each other).
        """
        ch_flows, active = self._ch_flows, self._active
        seen_ch: set[int] = set()
        seen_f: set[int] = set()
        comps = []
        for c0 in sorted(seeds):
            if c0 in seen_ch or c0 not in ch_flows:
                continue
            seen_ch.add(c0)
            stack = [c0]
            comp: list[int] = []
            while stack:
                last: tuple[int, ...] | None = None  # (routes are cached tuples: a flow on the last one's adds none)
                for fid in ch_flows[stack.pop()]:
                    if fid not in seen_f:
                        seen_f.add(fid)
                        comp.append(fid)
                        path = active[fid].path
                        if path is last:
                            continue
                        last = path
                        for c in path:
                            if c not in seen_ch:
                                seen_ch.add(c)
                                stack.append(c)
                if len(comp) > budget:
                    return None
            comps.append(comp)
        return comps

    def _resolve(self, touched: set[int], t: int) -> None:
        """Recompute max-min rates where the event can change them; reschedule changed flows."""
        if self.cap_slack and self._slack_resolve(t):
            return
        if self._carried(touched, t):
            return
        comps = None
        if self.incremental and self._skip_bfs == 0:
            comps = self._components(touched, len(self._active) // 2)
        if (
            (comps is None or max(map(len, comps), default=0) >= CARRY_GIANT)
            and len(self._active) >= CARRY_GIANT
            and self._may_carry()
            and self._start_carry(t)
        ):  # a large component: carried from here on
            return
        if comps is None:  # one giant problem: solve everything, and skip the search for a while
            comps = [list(self._active)] if self._active else []
            self._stats["giant_resolves"] += 1
            if self.incremental:
                self._skip_bfs = _GIANT_SKIP if self._skip_bfs == 0 else self._skip_bfs - 1
        st = self._stats
        for comp in comps:
            st["resolves"] += 1
            st["resolved_flows"] += len(comp)
            st["numpy_resolves"] += len(comp) >= NUMPY_THRESHOLD
            if len(comp) > st["max_component"]:
                st["max_component"] = len(comp)
        self._set_rates(self._solved(comps), t)
        if self.verify:
            self._verify()

    def _slack_resolve(self, t: int) -> bool:
        """`cap_slack`: if every flow this event started or stopped has a rate cap and its channels' caps summed under
        their capacity (less `SLACK_MARGIN`) before and after, those channels can fill at no rate: no flow is held
        back there, so no other flow's max-min rate changes and each new flow's is its cap. Progressive filling
        gives exactly that: a slack channel's share stays above every level, so it freezes nobody and each flow
        freezes at its cap's pseudo-channel, at the cap's own float (`_alloc_cap`). False (solve as usual) if not."""
        joined, self._slack_joined = self._slack_joined, []
        ok, self._slack_ok = self._slack_ok, True
        if not ok or self._carry is not None or self._multi or not self.incremental:
            return False
        for rec in joined:
            self._set_rate(rec, rec.flow.rate_bps / 8e9, t)
        self._stats["slack_resolves"] += 1
        if self.verify:
            self._verify()
        return True

    def _may_carry(self) -> bool:
        """Whether max-min may be carried now: ECMP routes, incremental, not waiting after a solve it gave up on."""
        return self.carries and self.incremental and not self._multi and not self._carry_wait

    def _carried(self, touched: set[int], t: int) -> bool:
        """Solve by the carried max-min (`CarriedMaxMin`) while `CARRY_FLOWS` flows transmit on ECMP routes, or
        while a component of them has `CARRY_GIANT` (`_resolve` starts it when it solves one): the flows that stopped
        or started since the last solve are its only input. Under `CARRY_FLOWS`, every `_CARRY_CHECK` events a search
        checks that such a component is still there, and carrying stops if not (small components solve for less).
        False if it does not apply now (too few flows, multipath, or a solve it could not carry: the component solve
        runs then, and carrying starts again after `_GIANT_SKIP` events)."""
        carry, left, joined = self._carry, self._left, self._joined
        self._left, self._joined = [], []
        active = self._active
        if carry is None:
            if self._carry_wait:
                self._carry_wait -= 1
                return False
            if len(active) < CARRY_FLOWS or not self._may_carry():
                return False
            return self._start_carry(t)
        if len(active) < CARRY_FLOWS and (len(active) < CARRY_GIANT or self._split()):
            self._carry_off()
            return False
        before = carry.visited
        if not self._took(carry, carry.update(left, [(fid, active[fid].solve_path) for fid in joined]), t):
            return False
        self._waste(carry, carry.visited - before)
        return True

    def _carry_off(self) -> None:
        """No carrier from here: the slack sums (`cap_slack`), not kept while max-min is carried, counted again from
        the transmitting flows."""
        self._carry = None
        if not self.cap_slack:
            return
        capsum, unc = [0.0] * len(self._capsum), [0] * len(self._uncapped)
        for rec in self._active.values():
            if rec.flow.rate_bps:
                v = rec.flow.rate_bps / 8e9
                for c in rec.path:
                    capsum[c] += v
            else:
                for c in rec.path:
                    unc[c] += 1
        self._capsum, self._uncapped = capsum, unc

    def _waste(self, carry: CarriedMaxMin, read: int) -> None:
        """A carried event whose full rounds read `read` flows: every `_CARRY_CHECK` such events, the carrier is
        dropped if they read more than `_CARRY_WASTE` of its flows an event and more than twice the largest component
        of the transmitting flows (the component solves run then, for `_carry_rest` events, doubled at each drop in
        a row). Either solve gives the same rates."""
        acc = self._carry_read
        acc[0] += read
        acc[1] += len(carry)
        acc[2] += 1
        if acc[2] < _CARRY_CHECK:
            return
        if acc[0] > _CARRY_WASTE * acc[1] and self._components(set(self._ch_flows), acc[0] // (2 * acc[2])) is not None:
            self._carry_off()
            self._carry_wait = self._carry_rest
            self._carry_rest = min(2 * self._carry_rest, _CARRY_REST_MAX)
            self._stats["carry_drops"] += 1
        else:
            self._carry_rest = _CARRY_REST
        acc[:] = [0, 0, 0]

    def _split(self) -> bool:
        """Carrying under `CARRY_FLOWS`: every `_CARRY_CHECK`-th call, whether no component of the transmitting flows
        has `CARRY_GIANT` flows any more (the search stops at the first that has)."""
        self._carry_check -= 1
        if self._carry_check:
            return False
        self._carry_check = _CARRY_CHECK
        return self._components(set(self._ch_flows), CARRY_GIANT - 1) is not None

    def _start_carry(self, t: int) -> bool:
        """A new carrier solves every transmitting flow (False if it gives up: then the component solve runs)."""
        carry = CarriedMaxMin(self._cap)
        self._carry_check = _CARRY_CHECK
        self._carry_read = [0, 0, 0]
        return self._took(carry, carry.update((), [(fid, rec.solve_path) for fid, rec in self._active.items()]), t)

    def _took(self, carry: CarriedMaxMin, changed: dict[int, float] | None, t: int) -> bool:
        """The carrier's solve: its changed rates set; or, if it gave up (a level that did not rise: float rounding),
        no carrier for `_GIANT_SKIP` events."""
        st = self._stats
        active = self._active
        if changed is None:
            self._carry_off()
            self._carry_wait = _GIANT_SKIP
            st["carry_fallbacks"] += 1
            return False
        self._carry = carry
        st["resolves"] += 1
        st["carried_resolves"] += 1
        st["carried_rounds"] += carry.reran
        st["resolved_flows"] += len(changed)
        for fid, rate in changed.items():
            self._set_rate(active[fid], rate, t)
        if self.verify:
            self._verify()
        return True

    def _set_rate(self, rec: _Active, rate: float, t: int) -> None:
        """A flow's new max-min rate from t: its bytes sent so far counted, its transmit end scheduled again."""
        if rate == rec.rate:
            return
        if rate <= 0.0:
            raise PhantoraError(f"flow {rec.flow.id} got no bandwidth (rate {rate})")
        rec.rem = max(0.0, rec.rem - rec.rate * (t - rec.t_last))
        rec.t_last = t
        rec.rate = rate
        rec.ver += 1
        self._stats["rate_changes"] += 1
        end = t + _ceil_ns(rec.rem / rate)  # (`_schedule` of a transmit end, inline: never the ns running's lists)
        ev = self._events.get(end)
        if ev is None:
            ev = self._events[end] = ([], [], [])
            heapq.heappush(self._times, end)
        ev[_TX_END].append((rec.flow.id << _VER_BITS) | rec.ver)

    def _set_rates(self, solved: Iterable[tuple[list[_Active], list[float]]], t: int) -> None:
        """`_set_rate` of each (record, rate) of `solved` whose rate changed, inline: a re-solve sets the rates of
        every flow of the fluid NVLink side's touched hosts (about 1,800 an event on the hierarchical all-reduce), so
        the calls and the counter's per-flow update are saved; the same floats, versions and transmit ends."""
        events, times = self._events, self._times
        ceil, tol = math.ceil, _TOL_NS
        n = 0
        for recs, rates in solved:
            for rec, rate in zip(recs, rates, strict=True):
                old = rec.rate
                if rate == old:  # (most rates of a component stay)
                    continue
                if rate <= 0.0:
                    raise PhantoraError(f"flow {rec.flow.id} got no bandwidth (rate {rate})")
                rem = rec.rem - old * (t - rec.t_last)
                rem = rem if rem > 0.0 else 0.0  # (max(0.0, rem), as `_set_rate`)
                rec.rem = rem
                rec.t_last = t
                rec.rate = rate
                rec.ver = ver = rec.ver + 1
                n += 1
                x = rem / rate
                c = ceil(x - tol - x * 1e-12)  # (`_ceil_ns`)
                end = t + c if c > 0 else t
                ev = events.get(end)
                if ev is None:
                    ev = events[end] = ([], [], [])
                    heapq.heappush(times, end)
                ev[_TX_END].append((rec.flow.id << _VER_BITS) | ver)
        self._stats["rate_changes"] += n

    def _solved(self, comps: list[list[int]]) -> Iterator[tuple[list[_Active], list[float]]]:
        """Each component's records and max-min rates. Over single ECMP paths a component whose flows all cross
        one path gets its closed form (`one_path_rate`; `one_path_capped_rates` under caps); the other small
        components (the fluid NVLink side: one a host) are solved as one problem by the vectorised solver once they
        sum to `NUMPY_THRESHOLD` flows: the same rates bit for bit (`phantora.netsim.maxmin`: a component's rates
        do not depend on the others solved beside it), one call instead of one a component."""
        active = self._active
        if self._multi:
            for comp in comps:
                recs = [active[i] for i in comp]
                yield recs, self._solve(recs)
            return
        cap = self._cap
        rest: list[list[_Active]] = []
        for comp in comps:
            recs = [active[i] for i in comp]
            rate = one_path_rate(recs, cap)
            if rate is not None:
                yield recs, [rate] * len(recs)
                continue
            rates = one_path_capped_rates(recs, cap)
            if rates is None:
                rest.append(recs)
            else:
                yield recs, rates
        if len(rest) > 1 and sum(map(len, rest)) >= NUMPY_THRESHOLD:
            flat = [r for recs in rest for r in recs]
            groups = np.repeat(np.arange(len(rest)), [len(recs) for recs in rest])
            yield flat, maxmin_rates([r.solve_path for r in flat], cap, self._cap_arr, groups=groups)
            return
        for recs in rest:
            yield recs, self._solve(recs)

    def _solve(self, recs: list[_Active]) -> list[float]:
        """Max-min rates of one component: over ECMP paths, spray's fixed splits, or adaptive's pooled layers; a
        capped flow also crosses its cap's pseudo-channel (with all of its rate: weight 1)."""
        if not self._multi:
            return maxmin_rates([r.solve_path for r in recs], self._cap, self._cap_arr)
        if self.lb != "adaptive":
            shares = [r.multi.share if r.cap_ch < 0 else (*r.multi.share, 1.0) for r in recs]  # type: ignore[union-attr]
            return maxmin_rates([r.solve_path for r in recs], self._cap, weights=shares)
        return maxmin_rates(self._pooled(recs), self._cap, self._cap_arr)

    def _pooled(self, recs: Sequence[_Active]) -> list[list[int]]:
        """Adaptive: each flow crosses one channel per hop, or the pool of a hop's equal-cost channels. A flow
        pinned to one channel of a pool that another flow of the component uses counts in that pool too. A
        capped flow also crosses its cap's pseudo-channel."""
        layered = [r.multi.layers for r in recs]  # type: ignore[union-attr]
        used = {self._pools[layer] for layers in layered for layer in layers if len(layer) > 1}
        out = []
        for r, layers in zip(recs, layered, strict=True):
            mine: list[int] = []
            for layer in layers:
                if len(layer) > 1:
                    mine.append(self._pools[layer])
                else:
                    mine.append(layer[0])
                    mine.extend(p for p in self._pools_of.get(layer[0], ()) if p in used)
            if r.cap_ch >= 0:
                mine.append(r.cap_ch)
            out.append(mine)
        return out

    def _verify(self) -> None:
        """Assert that the current rates equal a from-scratch solve of every active flow."""
        ids = sorted(self._active)
        if not ids:
            return
        full = (
            self._solve([self._active[i] for i in ids])
            if self._multi
            else maxmin_python([self._active[i].solve_path for i in ids], self._cap)
        )
        for i, r in zip(ids, full, strict=True):
            if self._active[i].rate != r:
                raise AssertionError(f"incremental rate of flow {i} is {self._active[i].rate}, full solve gives {r}")
