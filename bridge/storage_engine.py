"""Checkpoint storage as a resource the ranks share in simulated time: a per-host link and a shared filesystem.

Each file a rank reads or writes (`phantora.runtime.storage`) is one transfer of B bytes over two resources: its
host's storage link (W bytes/s: local NVMe, or the host's path to the file servers) and, optionally, the job's
shared filesystem (F bytes/s aggregate). Transfers in progress share the resources max-min fairly
(`phantora.netsim.maxmin`, progressive filling), re-shared whenever one starts or ends. Closed forms: a lone
transfer takes B / min(W, F); N equal transfers starting together on one host take N·B / W each; on H hosts of
N_h writers sharing F, max(N_h·B / W, total / F).

The engine speaks the event interface of a network engine (`submit`-free: `start` adds a transfer), so the
coordinator advances it beside the network (`bridge.engine_pair`). Transfer ids are negative, apart from the
network's flow ids. Times are integer ns; a transfer ends at the first ns by which its last byte is through.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from phantora.netsim.base import CausalityError, Completion
from phantora.netsim.maxmin import maxmin_python

_EPS_NS = 1e-6  # float slack when rounding a finish time up to the ns


@dataclass
class _Transfer:
    id: int
    rank: int
    host: int
    size: int
    start_ns: int
    tag: str
    left: float  # bytes not yet through
    rate: float = 0.0  # bytes per ns
    finish: int = 0  # the ns its last byte is through at the current rate


class StorageEngine:
    """Max-min sharing of per-host storage links (`host_bps` each) and a shared filesystem (`shared_bps`)."""

    def __init__(self, host_bps: float, shared_bps: float | None) -> None:
        if not host_bps > 0 or (shared_bps is not None and not shared_bps > 0):
            raise ValueError(f"storage bandwidths must be positive, got host {host_bps}, shared {shared_bps}")
        self.host_bps, self.shared_bps = float(host_bps), None if shared_bps is None else float(shared_bps)
        self._now = 0
        self._arrivals: list[tuple[int, int, _Transfer]] = []  # (at, id order, transfer) not yet started
        self._active: dict[int, _Transfer] = {}
        self._order = 0
        self.bytes = 0

    def lone_ns(self, nbytes: int) -> int:
        """A lower bound of a transfer's time: alone, at min(W, F)."""
        rate = self.host_bps if self.shared_bps is None else min(self.host_bps, self.shared_bps)
        return math.floor(nbytes / rate * 1e9)

    def start(self, tid: int, rank: int, host: int, nbytes: int, at: int, tag: str = "") -> None:
        """Add transfer `tid` (negative) of `nbytes` by `rank` on `host`, beginning at `at` (>= now())."""
        if at < self._now:
            raise CausalityError(f"storage transfer {tid} starts at {at} ns, before the storage's time {self._now} ns")
        self._order += 1
        self.bytes += nbytes
        t = _Transfer(tid, rank, host, nbytes, at, tag, float(nbytes))
        heapq.heappush(self._arrivals, (at, self._order, t))

    def now(self) -> int:
        return self._now

    def in_flight(self) -> int:
        return len(self._active) + len(self._arrivals)

    def next_event_time(self) -> int | None:
        times = [self._arrivals[0][0]] if self._arrivals else []
        times += [min(t.finish for t in self._active.values())] if self._active else []
        return min(times) if times else None

    def advance(self, until: int) -> list[Completion]:
        """Run every event at or before `until`; now() ends at `until` (or stays, if it is already later)."""
        done: list[Completion] = []
        while True:
            t = self.next_event_time()
            if t is None or t > until:
                break
            done.extend(self._event(t))
        self._drift(max(self._now, until))
        return done

    def drain(self) -> list[Completion]:
        """Run until no transfer is left; now() ends at the last completion."""
        done: list[Completion] = []
        while (t := self.next_event_time()) is not None:
            done.extend(self._event(t))
        return done

    def _drift(self, t: int) -> None:
        """Move the clock to t (no event before it), taking the bytes moved off each transfer."""
        dt = t - self._now
        if dt > 0:
            for x in self._active.values():
                x.left -= x.rate * dt
        self._now = t

    def _event(self, t: int) -> list[Completion]:
        self._drift(t)
        ended = sorted(x.id for x in self._active.values() if x.finish <= t)
        done = []
        for tid in ended:
            x = self._active.pop(tid)
            done.append(Completion(x.id, x.start_ns, t, x.size, x.rank, x.rank, x.tag))
        while self._arrivals and self._arrivals[0][0] <= t:
            x = heapq.heappop(self._arrivals)[2]
            if x.size <= 0:
                done.append(Completion(x.id, t, t, 0, x.rank, x.rank, x.tag))
            else:
                self._active[x.id] = x
        self._share()
        return sorted(done, key=lambda c: (c.end_ns, c.flow_id))

    def _share(self) -> None:
        """Max-min rates of the active transfers; channel h is host h's link, channel -1 (last) the shared FS."""
        if not self._active:
            return
        hosts = sorted({x.host for x in self._active.values()})
        index = {h: i for i, h in enumerate(hosts)}
        cap = [self.host_bps / 1e9] * len(hosts)
        shared = self.shared_bps is not None
        if shared:
            cap.append(self.shared_bps / 1e9)  # type: ignore[operator]
        order = sorted(self._active.values(), key=lambda x: x.id)
        paths = [[index[x.host], len(hosts)] if shared else [index[x.host]] for x in order]
        for x, rate in zip(order, maxmin_python(paths, cap), strict=True):
            x.rate = rate
            x.finish = self._now + max(1, math.ceil(max(0.0, x.left) / rate - _EPS_NS))
