"""Stream order: a rank's collectives on one communicator run one after another, as on NCCL's stream.

ProcessGroupNCCL launches every collective of a process group on that group's one NCCL stream, so on a rank
a collective's kernel starts only once the previous one on the same group has ended there, however many the
program issued without waiting (`async_op=True`, DDP's buckets, FSDP's prefetched all-gathers). A rank names
the stream of each collective (`stream` in its `coll` message: its process group); the coordinator holds a
matched collective until every member's previous call on that stream is done on that member, and starts it at
the latest of those ends and the members' issue times. Calls on different streams (other groups) still overlap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable

from bridge.matching import Call, Rendezvous

Dep = tuple[int, int]  # (rank, handle) of the call a call waits for


class StreamOrder:
    """Each rank's last call per stream, and the matched rendezvous parked until their predecessors end."""

    def __init__(self) -> None:
        self._tail: dict[tuple[int, int], int] = {}  # (rank, stream) -> handle of its last call on it
        self._prev: dict[tuple[int, int], int] = {}  # (rank, handle) -> handle of the call before it on its stream
        self.parked: dict[tuple[object, ...], Rendezvous] = {}
        self._waiters: dict[Dep, list[tuple[object, ...]]] = {}

    def issued(self, rank: int, stream: int | None, handle: int) -> None:
        """Rank `rank` issued `handle` on `stream` (None: no stream, no order)."""
        if stream is None:
            return
        before = self._tail.get((rank, stream))
        if before is not None:
            self._prev[(rank, handle)] = before
        self._tail[(rank, stream)] = handle

    def _deps(self, rv: Rendezvous) -> list[Dep]:
        return [(c.rank, p) for c in rv.calls.values() if (p := self._prev.get((c.rank, c.handle))) is not None]

    def ready(self, rv: Rendezvous, done: Callable[[int, int], int | None]) -> Rendezvous | None:
        """`rv` with each call's time raised to its predecessor's end, if every predecessor is done (`done(rank,
        handle)`: its end or None); else None, and `rv` is parked until the last of them ends."""
        ends: dict[int, int] = {}
        waiting: list[Dep] = []
        for rank, handle in self._deps(rv):
            t = done(rank, handle)
            if t is None:
                waiting.append((rank, handle))
            else:
                ends[rank] = t
        if waiting:
            self.parked[rv.key] = rv
            for dep in waiting:
                self._waiters.setdefault(dep, []).append(rv.key)
            return None
        for c in rv.calls.values():
            self._prev.pop((c.rank, c.handle), None)
        if any(ends[r] > c.t for r, c in rv.calls.items() if r in ends):
            rv.calls = {r: _at(c, ends.get(r, c.t)) for r, c in rv.calls.items()}
        return rv

    def woken(self, rank: int, handle: int) -> list[Rendezvous]:
        """The parked rendezvous that waited for (rank, handle), which just ended (each re-checked by `ready`)."""
        keys = self._waiters.pop((rank, handle), [])
        return [rv for k in keys if (rv := self.parked.pop(k, None)) is not None]

    def waited_on(self) -> Iterable[Dep]:
        """The calls a parked rendezvous waits for: their flows must not be passed unseen (exact mode)."""
        return self._waiters.keys()

    def drop(self, ranks: Collection[int]) -> None:
        """Forget the parked rendezvous with a member in `ranks` (their job failed)."""
        mine = set(ranks)
        for key in [k for k, rv in self.parked.items() if mine.intersection(rv.members)]:
            del self.parked[key]


def _at(call: Call, t: int) -> Call:
    return call if t <= call.t else dataclasses.replace(call, t=t)
