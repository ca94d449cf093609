"""Stream order: a rank's collectives and transfers on one communicator run one after another, as on NCCL's stream.

ProcessGroupNCCL launches every collective of a process group on that group's one NCCL stream, so on a rank
a collective's kernel starts only once the previous one on the same group has ended there, however many the
program issued without waiting (`async_op=True`, DDP's buckets, FSDP's prefetched all-gathers). A rank names
the stream of each collective (`stream` in its `coll` message: its process group); the coordinator holds a
matched collective until every member's previous call on that stream is done on that member, and starts it at
the latest of those ends and the members' issue times. Calls on different streams (other groups) still overlap.

That order is NCCL's own, whichever CUDA stream the call is launched on: ProcessGroupNCCL (torch >= 2.8) launches
an `async_op=False` call on the caller's current stream and an `async_op=True` one on the group's internal stream,
but NCCL makes every launch on a communicator wait for the previous one (enqueue.cc, v2.30.7-1:
ncclLaunchPrepare's launch stream waits on comm->sharedRes->deviceStream, which ncclLaunchFinish advances to the
kernel's end), so the group's calls run in turn either way. The calls of one NCCL group launch (`launch`: a
`_coalescing_manager` block, a `batch_isend_irecv`, the sends and receives of one scatter, gather or uneven
all-to-all) are one kernel: they start together after the calls before the launch, share the network, and the next
call waits for all of them. Sends and receives are ordered the same way, on the stream the rank names for them
(ProcessGroupNCCL's `pointToPoint`: a lone one on its peer pair's own communicator and stream, or the group's under
eager init; a batched one on the group's), after the calls their CUDA stream waits for (`after`).

A lone send within its connection's buffer (`handoff`: the ns its kernel takes, phantora/collectives/handoff.py)
ends, for the calls after it, at its hand-off, not at its flow's end: NCCL's kernel ends with its last post into the
connection's slots, whether or not the receiver runs. Its hand-off is its kernel's start (its issue, or the end of
the calls it starts after: their hand-offs where they are such sends) plus that time, as the rank computes it
(`RankSession.handoff_at`), and not before the flows of the earlier sends it waits to see received (`gate`: their
slots and its own must fit its connection, phantora/collectives/slot_window.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable

from bridge.matching import Call, Rendezvous

Dep = tuple[int, int]  # (rank, handle) of the call a call waits for


@dataclasses.dataclass
class _Launch:
    """A rank's last launch on a stream: its calls (one, or a group launch's), and the calls they wait for."""

    launch: int | None  # the group launch's id, None for a lone call
    before: tuple[int, ...]  # handles of the launch before it on the stream
    handles: list[int]


class StreamTails:
    """Each rank's last launch per stream: what a call issued on a stream starts after."""

    def __init__(self) -> None:
        self._tail: dict[tuple[int, int], _Launch] = {}  # (rank, stream) -> its last launch on it

    def issued(
        self, rank: int, stream: int | None, handle: int, launch: int | None = None, after: Iterable[int] = ()
    ) -> tuple[int, ...]:
        """Rank `rank` issued `handle` on `stream` (None: no stream, no order), in group launch `launch` (None: a
        launch of its own; calls with the launch id of the stream's last launch join it), after the rank's calls
        `after` too (those its CUDA stream waits for: phantora/runtime/stream_deps.py). Return the rank's calls it
        starts after (the coordinator holds it until they end; an execution-graph recording stores them)."""
        before: tuple[int, ...] = ()
        if stream is not None:
            tail = self._tail.get((rank, stream))
            if tail is not None and launch is not None and tail.launch == launch:
                before = tail.before
                tail.handles.append(handle)
            else:
                before = tuple(tail.handles) if tail is not None else ()
                self._tail[(rank, stream)] = _Launch(launch, before, [handle])
        return before + tuple(h for h in after if h not in before)


class StreamOrder:
    """Each rank's last launch per stream, and the matched rendezvous parked until their predecessors end."""

    def __init__(self) -> None:
        self.tails = StreamTails()
        self._prev: dict[tuple[int, int], tuple[int, ...]] = {}  # (rank, handle) -> the calls it waits for
        self.parked: dict[tuple[object, ...], Rendezvous] = {}
        self._waiters: dict[Dep, list[tuple[object, ...]]] = {}
        # a lone send: (issue, kernel ns, the calls before it, the earlier sends whose flows it waits for, the ns
        # after their ends that their slots are free at the sender)
        self._handoffs: dict[Dep, tuple[int, int, tuple[int, ...], tuple[int, ...], int]] = {}

    def issued(
        self,
        rank: int,
        stream: int | None,
        handle: int,
        launch: int | None = None,
        after: Iterable[int] = (),
        handoff: tuple[int, int, tuple[int, ...], int] | None = None,
    ) -> None:
        """As `StreamTails.issued`; the call waits for those calls when it is matched (`ready`). `handoff`: (issue
        ns, kernel ns, gate, back ns) of a lone send within its connection's buffer, which the calls after it follow
        to its hand-off; `gate`: the rank's earlier sends whose flows must end, and `back` ns more pass (the news of
        the freed slots: collectives/slot_window.py `Slots.back_ns`), before it hands off."""
        before = self.tails.issued(rank, stream, handle, launch, after)
        if before:
            self._prev[(rank, handle)] = before
        if handoff is not None:
            self._handoffs[(rank, handle)] = (handoff[0], handoff[1], before, handoff[2], handoff[3])

    def hands_off(self, rank: int, handle: int) -> bool:
        """Whether (rank, handle) is a lone send that hands off (`issued`'s `handoff`)."""
        return (rank, handle) in self._handoffs

    def _deps(self, rv: Rendezvous) -> list[Dep]:
        return [(c.rank, p) for c in rv.calls.values() for p in self._prev.get((c.rank, c.handle), ())]

    def _end(self, rank: int, handle: int, done: Callable[[int, int], int | None], waiting: list[Dep]) -> int | None:
        """When (rank, handle) ends for the calls after it: a lone send at its hand-off, any other call at `done`;
        None, with the calls it waits for added to `waiting`, if one has not ended."""
        handed = self._handoffs.get((rank, handle))
        if handed is None:
            t = done(rank, handle)
            if t is None:
                waiting.append((rank, handle))
            return t
        start: int | None = handed[0]
        for b in handed[2]:
            e = self._end(rank, b, done, waiting)
            start = None if e is None or start is None else max(start, e)
        for g in handed[3]:  # an earlier send's flow: its slots are free once its receiver has consumed them
            e = done(rank, g)
            if e is None:
                waiting.append((rank, g))
            start = None if e is None or start is None else max(start, e + handed[4])
        return None if start is None else start + handed[1]

    def ready(self, rv: Rendezvous, done: Callable[[int, int], int | None]) -> Rendezvous | None:
        """`rv` with each call's time raised to its predecessor's end (a lone send's: its hand-off), if every
        predecessor is done (`done(rank, handle)`: its end or None); else None, and `rv` is parked until the last of
        them ends."""
        ends: dict[int, int] = {}
        waiting: list[Dep] = []
        for rank, handle in self._deps(rv):
            t = self._end(rank, handle, done, waiting)
            if t is not None:
                ends[rank] = max(t, ends.get(rank, t))
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
