"""A partition worker's windows: conservative barrier windows between workers (issue 38, parallel packet mode).

Each worker is an ns-3 engine over the whole fabric that runs the events of its own switch group only
(PhantoraNetwork params partition.Groups and partition.Worker, keyed mode). A packet over a cut cable leaves as
a message and arrives no earlier than the least cut-cable latency L (the lookahead) after it was sent. So in a
window [W, W + L) every worker may run every event before W + L: whatever another worker sends it in that window
arrives at or after W + L, and is delivered at the barrier that ends the window.

Every window ends with one exchange between every pair of workers (`Peers.exchange`): each sends each other
worker its messages for it, the time of its own next event (before delivery) and the least arrival time of all
the messages it sent. Every worker then knows the same global next time G (the least of those): the next window
starts at G, so stretches where nothing happens anywhere cost one window, not one per L (the least-next-time
rule). A run to time T ends when G > T; with no limit, when nothing is left anywhere (G = NEVER).

The exchange itself (ZeroMQ, msgpack, the run's token, receive timeouts) is `bridge.cut_peers`; this module is
the loop, independent of the transport.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any, Protocol

NEVER = (1 << 63) - 1  # no event, no message


@dataclasses.dataclass(frozen=True)
class PeerReport:
    """What one other worker said at a barrier."""

    group: int
    next_ns: int  # its next event before this barrier's deliveries, NEVER if none
    min_arrival: int  # the least arrival time of every message it sent in the window, NEVER if none
    batch: bytes  # its messages for this worker (PhantoraNetwork::CutDeliver's bytes)


class Peers(Protocol):
    """The other workers of the partition."""

    def exchange(self, seq: int, next_ns: int, min_arrival: int, batches: Mapping[int, bytes]) -> list[PeerReport]:
        """Send each other worker its batch with our next time and least arrival; return every other worker's
        report for barrier `seq` (raises naming the worker that does not answer in time)."""
        ...


@dataclasses.dataclass
class WindowStats:
    """A worker's count of its windows and where its time went."""

    windows: int = 0  # windows run (barriers after running events)
    exchanges: int = 0  # barriers, the initial one of each run included
    bytes_out: int = 0  # message bytes sent to other workers
    run_cpu_s: float = 0.0  # CPU in ns-3 (CutRunBefore)
    exchange_wall_s: float = 0.0  # wall time in the exchanges (waiting for the slowest worker included)


def _next(net: Any) -> int:
    t = int(net.NextEventTime())
    return NEVER if t < 0 else t


def warm_up(net: Any, group: int, groups: int) -> None:
    """Call each window method of `net` once, doing nothing (cppyy's first-call cost, kept out of the figures)."""
    net.CutRunBefore(0)
    for g in range(groups):
        if g != group:
            net.CutTakeOutbox(g)
    net.CutTakeMinArrival()
    net.CutDeliver(b"")
    net.CutAdvanceTo(net.Now())
    net.NextEventTime()


def run_windows(
    net: Any, peers: Peers, *, group: int, groups: int, lookahead_ns: int, until: int | None, stats: WindowStats
) -> None:
    """This worker's part of one engine's RunUntil(until) (every event at or before `until`, then the clock at
    `until`); `until` None: run until no worker has an event left and no message is in flight.

    `net`: the worker's PhantoraNetwork. Every worker of the partition must make the same calls.
    """
    if lookahead_ns <= 0:
        raise ValueError(f"partition worker {group}: lookahead must be > 0 ns, got {lookahead_ns}")
    batches: dict[int, bytes] = {}
    min_arrival = NEVER
    while True:
        mine = _next(net)
        t0 = time.perf_counter()
        reports = peers.exchange(stats.exchanges, mine, min_arrival, batches)
        stats.exchange_wall_s += time.perf_counter() - t0
        stats.exchanges += 1
        glob = min(mine, min_arrival)
        for r in sorted(reports, key=lambda r: r.group):
            if r.batch:
                net.CutDeliver(r.batch)
            glob = min(glob, r.next_ns, r.min_arrival)
        if glob == NEVER or (until is not None and glob > until):
            break
        end = min(glob + lookahead_ns, NEVER) if until is None else min(glob + lookahead_ns, until + 1)
        c0 = time.process_time()
        net.CutRunBefore(end)
        stats.run_cpu_s += time.process_time() - c0
        stats.windows += 1
        batches = {}
        for g in range(groups):
            if g != group:
                out = bytes(net.CutTakeOutbox(g))
                batches[g] = out
                stats.bytes_out += len(out)
        arrival = int(net.CutTakeMinArrival())
        min_arrival = NEVER if arrival < 0 else arrival
    if until is not None:
        net.CutAdvanceTo(until)
