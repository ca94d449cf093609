"""The network engine and the storage engine advanced as one (`NetworkSimulator` to the coordinator).

The two share no resource, so each runs its own events; they are stepped together only so that a watched
completion in either stops both at its ns (exact mode: a rank it wakes may still inject at that ns), and so
that completions come back in (end_ns, id) order. Network flows have ids >= 0, storage transfers ids < 0
(`bridge.storage_engine`). Everything else (stats, observers, keepalive, close) is the network engine's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from bridge.storage_engine import StorageEngine
from phantora.netsim.base import INF_NS, Completion, Flow, NetworkSimulator


def _ordered(done: list[Completion]) -> list[Completion]:
    return sorted(done, key=lambda c: (c.end_ns, c.flow_id))


class EnginePair:
    """`net` and `storage` behind one engine interface."""

    def __init__(self, net: NetworkSimulator, storage: StorageEngine) -> None:
        self.net, self.storage = net, storage
        storage.advance(net.now())

    def submit(self, flows: Sequence[Flow], at: int) -> None:
        self.net.submit(flows, at)

    def now(self) -> int:
        return max(self.net.now(), self.storage.now())

    def in_flight(self) -> int:
        return self.net.in_flight() + self.storage.in_flight()

    def next_event_time(self) -> int | None:
        times = [t for t in (self.net.next_event_time(), self.storage.next_event_time()) if t is not None]
        return min(times) if times else None

    def advance(self, until: int) -> list[Completion]:
        return _ordered([*self.net.advance(until), *self.storage.advance(until)])

    def advance_watching(self, until: int, watch: Collection[int], earliest: int | None = None) -> list[Completion]:
        """Towards `until`, stopping after the first ns at which a watched flow or transfer completes."""
        mine = {f for f in watch if f < 0}
        theirs = {f for f in watch if f >= 0}
        done: list[Completion] = []
        while True:
            ts = self.storage.next_event_time()
            if ts is None or ts > until:
                if theirs or until < INF_NS:
                    done += self._net(until, theirs, earliest)
                    self.storage.advance(self.net.now())
                return _ordered(done)
            got = self._net(ts, theirs, earliest)
            done += got
            hit = any(c.flow_id in theirs for c in got)
            if hit and self.net.now() < ts:
                self.storage.advance(self.net.now())
                return _ordered(done)
            stored = self.storage.advance(ts)
            done += stored
            if hit or any(c.flow_id in mine for c in stored) or ts >= until:
                return _ordered(done)

    def _net(self, until: int, watch: set[int], earliest: int | None) -> list[Completion]:
        if watch:
            return self.net.advance_watching(until, watch, earliest)
        return self.net.advance(until) if until < INF_NS else []

    def drain(self, limit_ns: int | None = None) -> list[Completion]:
        return _ordered([*self.net.drain(limit_ns), *self.storage.drain()])

    def stats(self) -> dict[str, object]:
        return {**self.net.stats(), "storage_bytes": self.storage.bytes}

    def close(self) -> None:
        self.net.close()

    def keepalive(self) -> None:
        self.net.keepalive()

    def channels(self) -> Any:
        return self.net.channels()

    def fabric(self) -> Any:
        return self.net.fabric()
