"""Partition workers' records as one keyed engine's list (issue 38): merged by the order key of their events.

In the keyed mode (`ns3::PhantoraKeyedScheduler`) one engine runs the events of one ns in the order of their key
(scheduling ns, scheduling node, that node's count: `PhantoraOrderKey`), a key every node computes alone. A
partition worker runs the events of its own nodes with the keys one engine gives them, and each record it makes
(FCT, PFC frame, CE mark, CNP, drop, trim) carries the key of the event that made it
(`PhantoraNetwork::DrainRecordKeys`). So the records of all workers sorted by (event ns, key) are one engine's,
ties of one ns across workers included; the records of one event, all made in one worker, keep that worker's
order. A key found in two workers would be one event run twice: refused, naming both.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import Any, TypeVar

from phantora.errors import PhantoraError
from phantora.netsim.observe import QueueSample

T = TypeVar("T")
RecordKey = tuple[int, int, int, int]  # (event ns, scheduling ns, scheduling node, that node's count)


def merge_by_key(
    kind: str, records: Sequence[Sequence[T]], keys: Sequence[Sequence[RecordKey]], ties: list[int] | None = None
) -> list[T]:
    """Worker g's `records[g]` (in its order) with their events' keys `keys[g]`, as one engine's list of `kind`.
    `ties[0]` counts the records that follow one of the same ns from another worker (the ties the keys settle)."""
    _check(kind, records, keys)
    return _merged(kind, records, keys, ties, None)[0]


def _check(kind: str, records: Sequence[Sequence[T]], keys: Sequence[Sequence[RecordKey]]) -> None:
    """A key for each record, each worker's keys in order."""
    if len(records) != len(keys):
        raise PhantoraError(f"{kind} records: {len(records)} workers' records but {len(keys)} workers' keys")
    for g, (rs, ks) in enumerate(zip(records, keys, strict=True)):
        if len(rs) != len(ks):
            raise PhantoraError(f"partition worker {g}: {len(rs)} {kind} records but {len(ks)} order keys")
        bad = next((i for i in range(1, len(ks)) if ks[i] < ks[i - 1]), None)
        if bad is not None:
            raise PhantoraError(
                f"partition worker {g}: {kind} record {bad} has order key {ks[bad]} after {ks[bad - 1]} "
                "(a worker's records come in its event order)"
            )


def _merged(
    kind: str,
    records: Sequence[Sequence[T]],
    keys: Sequence[Sequence[RecordKey]],
    ties: list[int] | None,
    last: tuple[RecordKey, int] | None,
) -> tuple[list[T], tuple[RecordKey, int] | None]:
    """`merge_by_key`'s merge after the record of key and worker `last` (None: the first), and the new last."""
    tagged = [[(k, g, i) for i, k in enumerate(ks)] for g, ks in enumerate(keys)]
    out: list[T] = []
    for k, g, i in heapq.merge(*tagged):
        if last is not None and last[0] == k and last[1] != g:
            raise PhantoraError(
                f"{kind} records: partition workers {last[1]} and {g} both ran the event of order key {k} "
                "(ns, scheduling ns, node, count): each event belongs to one worker"
            )
        if ties is not None and last is not None and last[0][0] == k[0] and last[1] != g:
            ties[0] += 1
        last = (k, g)
        out.append(records[g][i])
    return out, last


class KeyedMerge:
    """`merge_by_key` over records that come in parts (a stepped partition worker sends those made since its last
    part): `add` merges each part after the merged ones, which is the merge of all of them when every key of the
    part is above the last merged key (ties across the parts' border counted as one merge counts them); a part that
    is not (a record before one already merged) merges everything again."""

    def __init__(self, kind: str, workers: int) -> None:
        self.kind = kind
        self.records: list[list[Any]] = [[] for _ in range(workers)]
        self.keys: list[list[RecordKey]] = [[] for _ in range(workers)]
        self.out: list[Any] = []
        self.ties = 0
        self.remerged = 0  # parts that merged everything again
        self._last: tuple[RecordKey, int] | None = None

    def add(self, records: Sequence[Sequence[Any]], keys: Sequence[Sequence[RecordKey]]) -> None:
        """Worker g's records `records[g]` made since its last part, with their events' keys `keys[g]`."""
        if len(records) != len(self.records):
            raise PhantoraError(f"{self.kind} records: a part of {len(records)} workers, not {len(self.records)}")
        _check(self.kind, records, keys)
        last = self._last
        # each worker's part after its own records, and after the last merged record (or of its very event)
        after = all(
            not ks or ((not old or old[-1] <= ks[0]) and (last is None or last[0] < ks[0] or last == (ks[0], g)))
            for g, (old, ks) in enumerate(zip(self.keys, keys, strict=True))
        )
        for g, (rs, ks) in enumerate(zip(records, keys, strict=True)):
            self.records[g].extend(rs)
            self.keys[g].extend(ks)
        if not any(keys):
            return
        ties = [0]
        if after:
            out, self._last = _merged(self.kind, records, keys, ties, self._last)
            self.out.extend(out)
            self.ties += ties[0]
            return
        _check(self.kind, self.records, self.keys)  # (a worker's part before its last record: named)
        self.out, self._last = _merged(self.kind, self.records, self.keys, ties, None)
        self.ties = ties[0]
        self.remerged += 1


def merge_queue_samples(
    samples: Sequence[Sequence[QueueSample]],
) -> list[QueueSample]:
    """Partition workers' queue samples (each of the switches it runs, in (ns, node, port, class) order) as one
    engine's list, which has that order: merged by it. Each worker's are one engine's instants already (a sample it
    made past a period's end, before a barrier told it, is dropped there: `FabricRecorder::EndPeriod`). Refused,
    naming it: a worker's samples out of order, or one queue sampled by two workers at one instant."""
    if not any(samples):
        return []

    def order(s: QueueSample) -> tuple[int, int, int, int]:
        return (s.time_ns, s.node, s.port, s.prio)

    for g, rows in enumerate(samples):
        bad = next((i for i in range(1, len(rows)) if order(rows[i]) <= order(rows[i - 1])), None)
        if bad is not None:
            raise PhantoraError(
                f"partition worker {g}: queue sample {bad} {order(rows[bad])} after {order(rows[bad - 1])} "
                "(a worker samples in (ns, node, port, class) order, each queue once an instant)"
            )
    out: list[QueueSample] = []
    for s in heapq.merge(*samples, key=order):
        if out and order(out[-1]) == order(s):
            raise PhantoraError(f"queue samples: two partition workers sampled queue {order(s)[1:]} at {s.time_ns} ns")
        out.append(s)
    return out
