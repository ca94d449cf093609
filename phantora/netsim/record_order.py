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
from typing import TypeVar

from phantora.errors import PhantoraError

T = TypeVar("T")
RecordKey = tuple[int, int, int, int]  # (event ns, scheduling ns, scheduling node, that node's count)


def merge_by_key(
    kind: str, records: Sequence[Sequence[T]], keys: Sequence[Sequence[RecordKey]], ties: list[int] | None = None
) -> list[T]:
    """Worker g's `records[g]` (in its order) with their events' keys `keys[g]`, as one engine's list of `kind`.
    `ties[0]` counts the records that follow one of the same ns from another worker (the ties the keys settle)."""
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
    tagged = [[(k, g, i) for i, k in enumerate(ks)] for g, ks in enumerate(keys)]
    out: list[T] = []
    last: tuple[RecordKey, int] | None = None
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
    return out
