"""`NicLatencySimulator`: the ns-3 engine with a NIC work-request latency (``--set nic_latency=1us``).

A real RDMA NIC sends a flow's first packet some time after the work request is posted (doorbell, WQE
fetch: about 1-2 us). A fabric flow posted at P (its deps done, its `delay_ns` waited) therefore starts
sending at T = P + L; its `Completion.start_ns` stays P, so the latency counts in its FCT. Markers (no
bytes, or to itself) use no NIC and complete at P.

Dependencies are resolved here, in Python, and ns-3 gets every flow without deps at its T. The flow is
handed to ns-3 ("inserted") exactly when ns-3 has run every event up to T - 1 and none at T: that fixes
where its start falls among other events at T (ns-3 orders same-ns events by insertion), whoever inserts
it, and is what makes decomposition into parallel ns-3 workers exact (phantora.netsim.decompose,
docs/packet-model.md "Decomposition"). With L > 0 every flow posted at P is known by P < T, so the
insertion point is always reachable. L = 0 is the plain `Ns3Simulator` (the factory does not wrap it).
With ``reuse=on`` the engine below is a `ProfileReuseSimulator` over ns-3: its episodes are the batches handed
over here (flows without deps, at their first packet's ns), so in a decomposition each worker keeps its own.
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from phantora.errors import PhantoraError
from phantora.netsim.base import (
    INF_NS,
    Completion,
    Flow,
    RunsByCompletion,
    completion,
)
from phantora.netsim.flow import CausalityError

if TYPE_CHECKING:
    import numpy as np

    from phantora.netsim.packet import Ns3Simulator
    from phantora.netsim.reuse import ProfileReuseSimulator
    from phantora.topology.model import Topology


def uses_nic(f: Flow | Completion) -> bool:
    """A fabric flow: bytes from one endpoint to another (a marker uses no NIC)."""
    return f.size > 0 and f.src != f.dst


def gate_key(fid: int) -> int:
    """The pseudo dependency a gated flow waits on (negative: never a flow id)."""
    return -1 - fid


def outer_key(fid: int) -> int:
    """The pseudo dependency a flow handed to a decomposition's workers waits on for its deps outside the packet side
    (the fluid NVLink side's, `DecomposedSimulator.open_outer`): below every gate key, never a flow id or a join."""
    return OUTER_BASE - fid


OUTER_BASE = -(1 << 64) - 1

# Pseudo flows that the flows sharing one wide deps list wait on together (a join: one entry per dep, not one per dep
# and flow), in a decomposition's driver and in a hybrid worker: ids from here on, beyond any flow id (< 2^64) and
# gate key (< 0).
JOIN_BASE = 1 << 64


class Releases:
    """Flows waiting on their deps, and when each is posted: max(submit time, deps' ends) + delay_ns."""

    def __init__(self) -> None:
        self._ids: set[int] = set()
        self._end: dict[int, int] = {}  # completed flow -> end ns
        self._held: dict[int, list[Any]] = {}  # flow id -> [flow, ready ns (max of at and ends so far), deps left]
        self._waiters: dict[int, list[int]] = {}

    def known(self, fid: int) -> bool:
        return fid in self._ids

    def done(self, fid: int) -> bool:
        """Has this flow's completion been recorded?"""
        return fid in self._end

    def held(self) -> int:
        return len(self._held)

    def waits_on(self, fid: int) -> bool:
        """Is a held flow waiting on flow `fid`?"""
        return fid in self._waiters

    def waited_on(self, fids: Iterable[int]) -> Iterator[bool]:
        """`waits_on` of each of `fids` (at C speed)."""
        return map(self._waiters.__contains__, fids)

    def note(self, ids: Iterable[int]) -> None:
        """Flows posted elsewhere (already without deps): known from now on."""
        self._ids.update(ids)

    def add(self, flows: Sequence[Flow], at: int, gated: Collection[int] = ()) -> list[tuple[Flow, int]]:
        """Accept a (checked) batch submitted at `at`; return (flow, posted ns) of those ready now. A flow in
        `gated` also waits for its gate (`open`): deps resolved by someone else (a decomposition's driver)."""
        self._ids.update([f.id for f in flows])
        out = []
        ends, waiters = self._end, self._waiters  # (per flow and dep: kept lean)
        for f in flows:
            ready, left = at, 0
            deps = (*f.deps, gate_key(f.id)) if gated and f.id in gated else f.deps
            for d in dict.fromkeys(deps) if len(deps) > 1 else deps:
                end = ends.get(d)
                if end is None:
                    ws = waiters.get(d)
                    if ws is None:
                        waiters[d] = [f.id]
                    else:
                        ws.append(f.id)
                    left += 1
                else:
                    ready = max(ready, end)
            if left:
                self._held[f.id] = [f, ready, left]
            else:
                out.append((f, ready + f.delay_ns))
        return out

    def complete(self, done: Iterable[Completion]) -> list[tuple[Flow, int]]:
        """Record completions; return (flow, posted ns) of the held flows they release, in release order."""
        out: list[tuple[Flow, int]] = []
        for c in done:
            self._arrive(c.flow_id, c.end_ns, out)
        return out

    def ended(self, fids: Iterable[int], ends: Iterable[int]) -> list[tuple[Flow, int]]:
        """`complete` from the flows' ids and ends (no `Completion` needed)."""
        out: list[tuple[Flow, int]] = []
        for fid, end in zip(fids, ends, strict=True):
            self._arrive(fid, end, out)
        return out

    def open(self, gates: Iterable[tuple[int, int]]) -> list[tuple[Flow, int]]:
        """Open the gates of gated flows, (flow id, ns) each; return (flow, posted ns) of those released."""
        out: list[tuple[Flow, int]] = []
        for fid, at in gates:
            self._arrive(gate_key(fid), at, out)
        return out

    def _arrive(self, fid: int, end: int, out: list[tuple[Flow, int]]) -> None:
        self._end[fid] = end
        for j in self._waiters.pop(fid, ()):
            entry = self._held[j]
            entry[1] = max(entry[1], end)
            entry[2] -= 1
            if entry[2] == 0:
                del self._held[j]
                out.append((entry[0], entry[1] + entry[0].delay_ns))


class NicLatencySimulator(RunsByCompletion):
    """`NetworkSimulator` (a `CompletionStepper`, so nvlink=fluid sits on it) over one `Ns3Simulator` (or profile
    reuse over it)."""

    # A flow handed over before its deps end is posted at their end and its start falls among the events of its
    # first packet's ns by (T, id) alike: when it was handed over changes nothing (the fluid NVLink side chains on it).
    posts_at_dep_ends = True

    def __init__(self, inner: Ns3Simulator | ProfileReuseSimulator, latency_ns: int) -> None:
        if latency_ns <= 0:
            raise PhantoraError(f"NicLatencySimulator needs a latency > 0 ns, got {latency_ns}")
        self.inner = inner
        self.topology: Topology = inner.topology
        self.config = inner.config
        self.latency_ns = latency_ns
        self._rel = Releases()
        self._kicks: list[tuple[int, int, Flow]] = []  # (start ns T, flow id, flow without deps)
        self._inserted = 0
        self.prechecked = False  # set by a caller whose flows were checked whole before `post` (`trust_posts`)

    def trust_posts(self) -> None:
        """Check no posted batch again, here or in ns-3 below: the caller (a decomposition worker) takes flows only
        from its driver, which checked the whole DAG and each flow's route. Profile reuse below keeps its checks."""
        from phantora.netsim.packet import Ns3Simulator

        self.prechecked = True
        if isinstance(self.inner, Ns3Simulator):
            self.inner.prechecked = True

    # ----- flows in ----------------------------------------------------------------------------
    def submit(self, flows: Sequence[Flow], at: int) -> None:
        """Add flows eligible from `at` (>= now()); deps may name flows of this batch or earlier ones."""
        from phantora.netsim.packet import check_packet_batch

        if at < self.now():
            raise CausalityError(f"flows submitted at {at} ns but the network is already at {self.now()} ns")
        check_packet_batch(flows, self.topology, self._rel.known)
        self._queue(self._rel.add(flows, at))

    def post(
        self,
        flows: Sequence[Flow],
        at: Sequence[int],
        gated: Collection[int] = (),
        gates: Sequence[tuple[int, int]] = (),
    ) -> None:
        """A decomposition worker's input. `flows` (fabric flows), each submitted at its `at` ns, with deps on
        flows of this worker only; a flow in `gated` also waits for its gate. `gates`: (flow id, ns) pairs
        opening gates, i.e. the ns its deps elsewhere were done. Whatever is released must still be able to
        send its first packet (posted + L) after now(): else CausalityError (the driver broke its bound)."""
        if not self.prechecked:
            from phantora.netsim.packet import check_packet_batch

            check_packet_batch(flows, self.topology, self._rel.known)
        groups: dict[int, list[Flow]] = {}
        for f, a in zip(flows, at, strict=True):
            groups.setdefault(a, []).append(f)
        ready = [r for a, group in groups.items() for r in self._rel.add(group, a, gated)]
        ready += self._rel.open(gates)
        now = self.now()
        for f, p in ready:
            if p + self.latency_ns < now + 1:
                raise CausalityError(f"flow {f.id}: posted at {p} ns cannot start by ns {now}")
        self._queue(ready)

    def _queue(self, ready: list[tuple[Flow, int]]) -> None:
        kicks, lat = self._kicks, self.latency_ns
        for f, p in ready:
            start = p + lat if f.size > 0 and f.src != f.dst else p  # (`uses_nic`, inline)
            bare = f if not f.deps and not f.delay_ns else f.with_deps((), 0)
            heapq.heappush(kicks, (start, f.id, bare))

    def _insert_due(self) -> None:
        """Hand ns-3 the flows that start at now() + 1 or earlier (now() only for markers), in (start, id) order."""
        now = self.now()
        kicks = self._kicks
        while kicks and kicks[0][0] <= now + 1:
            start = kicks[0][0]
            batch = []
            while kicks and kicks[0][0] == start:
                batch.append(heapq.heappop(kicks)[2])
            self.inner.submit(batch, start)
            self._inserted += len(batch)

    # ----- running -----------------------------------------------------------------------------
    def advance_to_completion(self, until: int) -> list[Completion]:
        """`advance(until)`, but return right after the first ns at which any flow completes (every event of
        that ns run). With no limit it also returns once nothing is in flight or waiting to start."""
        if until < self.now():
            raise CausalityError(f"cannot advance to {until} ns: the network is already at {self.now()} ns")
        inner = self.inner
        while True:
            self._insert_due()
            stop = until if not self._kicks else min(until, self._kicks[0][0] - 1)
            if stop >= INF_NS and inner.in_flight() == 0:
                return []
            got = inner.advance_to_completion(stop)
            if got:
                self._queue(self._rel.complete(got))
                return self._posted_starts(got)
            if inner.now() >= until:
                return []

    def _posted_starts(self, got: list[Completion]) -> list[Completion]:
        """ns-3 started a fabric flow at its first packet; its start is when it was posted, L earlier."""
        lat = self.latency_ns
        return [
            completion(c.flow_id, c.start_ns - lat, c.end_ns, c.size, c.src, c.dst, c.tag, c.lost)
            if c.size > 0 and c.src != c.dst  # (`uses_nic`, inline)
            else c
            for c in got
        ]

    # ----- state -------------------------------------------------------------------------------
    def waits_on(self, fid: int) -> bool:
        """Does a flow held here (for its deps) wait on flow `fid`? (Its completion posts it.)"""
        return self._rel.waits_on(fid)

    def next_insert(self) -> int:
        """The ns the next flow waiting for its first packet is handed to ns-3 at (its start - 1; INF_NS: none)."""
        return self._kicks[0][0] - 1 if self._kicks else INF_NS

    def next_event_time(self) -> int | None:
        times = [t for t in (self.inner.next_event_time(), self._kicks[0][0] if self._kicks else None) if t is not None]
        return min(times) if times else None

    def completion_bounds(self) -> dict[int, int]:
        """Flow id -> the earliest ns it can still complete, for the flows ns-3 has started (`Ns3Simulator`'s);
        a flow waiting here for its start or its deps has none (its static bound, from when it is posted, holds)."""
        return self.inner.completion_bounds()

    def completion_bound_columns(self) -> tuple[np.ndarray, np.ndarray]:
        """`completion_bounds` as int64 columns (ids, ns)."""
        return self.inner.completion_bound_columns()

    def now(self) -> int:
        return self.inner.now()

    def in_flight(self) -> int:
        return self.inner.in_flight() + len(self._kicks) + self._rel.held()

    def stats(self) -> dict[str, object]:
        out = dict(self.inner.stats())
        out["nic_latency_ns"] = self.latency_ns
        return out

    def close(self) -> None:
        self.inner.close()

    def keepalive(self) -> None:
        self.inner.keepalive()

    def channels(self) -> Any:
        return self.inner.channels()

    def fabric(self) -> Any:
        return self.inner.fabric()
