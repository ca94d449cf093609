"""The coordinator's per-flow completion records (for flows.csv), kept as columns.

A live run keeps every flow's completion until it ends (up to `bridge.core.MAX_KEPT_FLOWS`). As `Completion`
objects with their own tag string and ints that took about 250 bytes a flow, so a long run's coordinator grew by
megabytes a step; here a flow takes six 8-byte ints and a 4-byte index into the run's distinct tags (a run has few:
`all_reduce#11/tree0/ch1/up/chunk1` is shared by the flows of one collective's step), about 52 bytes; and its ECMP
key and rate cap (`phantora.netsim.standalone.Alone`: the path the engines hashed it to and its NCCL channel's
limit), 16 more, which flows.csv's standalone FCT takes.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import Any

from phantora.netsim.base import Completion, Lost
from phantora.netsim.standalone import Alone


class CompletionLog:
    """Completions in the order they were appended; iterating gives them back as equal `Completion`s."""

    __slots__ = ("_ints", "_tag_of", "_tag_index", "_tags", "_lost", "_alone")

    def __init__(self) -> None:
        self._ints = array("q")  # flow_id, start_ns, end_ns, size, src, dst per completion
        self._alone = array("q")  # the flow's ECMP key, rate cap (payload bits/s; 0: none), 1 if through the NICs
        self._tag_of = array("i")  # index into _tags per completion
        self._tag_index: dict[str, int] = {}
        self._tags: list[str] = []
        self._lost: dict[int, Lost] = {}  # position -> lost ranges (DLCP; rare)

    def append(self, c: Completion, alone: Alone | None = None) -> None:
        """Keep `c`, of a flow of ECMP key and rate cap `alone` (None: keyed by its id, no cap)."""
        i = self._tag_index.get(c.tag)
        if i is None:
            i = self._tag_index[c.tag] = len(self._tags)
            self._tags.append(c.tag)
        if c.lost:
            self._lost[len(self._tag_of)] = c.lost
        self._ints.extend((c.flow_id, c.start_ns, c.end_ns, c.size, c.src, c.dst))
        self._tag_of.append(i)
        self._alone.extend((c.flow_id, 0, 0) if alone is None else alone)

    def __len__(self) -> int:
        return len(self._tag_of)

    def __bool__(self) -> bool:
        return len(self._tag_of) > 0

    def __iter__(self) -> Iterator[Completion]:
        ints, tags, lost = self._ints, self._tags, self._lost
        for k, t in enumerate(self._tag_of):
            fid, start, end, size, src, dst = ints[6 * k : 6 * k + 6]
            yield Completion(fid, start, end, size, src, dst, tags[t], lost.get(k, ()))

    def wire(self) -> list[list[Any]]:
        """Each completion as `bridge.protocol.completion_to_wire` gives it."""
        ints, tags, lost = self._ints, self._tags, self._lost
        out: list[list[Any]] = []
        for k, t in enumerate(self._tag_of):
            row: list[Any] = [*ints[6 * k : 6 * k + 6], tags[t]]
            if k in lost:
                row.append([list(r) for r in lost[k]])
            out.append(row)
        return out

    def alone_wire(self) -> list[int]:
        """Each completion's ECMP key, rate cap and 1 if through the NICs, in order, flat (the outcome's
        `completion_alone`, beside `wire`)."""
        return self._alone.tolist()

    def alone(self) -> dict[int, Alone]:
        """Flow id -> `Alone` of the flows kept whose key is not their id or that have a cap (for
        `phantora.results.scenario.completion_rows`)."""
        return alone_from(self._ints[0::6], self._alone)


def alone_from(ids: Sequence[int], flat: Sequence[int]) -> dict[int, Alone]:
    """Flow id -> `Alone` of the flows `ids` whose key is not their id, that have a cap or go through the NICs, from
    their keys, caps and NIC flags in turn (`CompletionLog.alone_wire`)."""
    out: dict[int, Alone] = {}
    for k, fid in enumerate(ids):
        key, cap, nic = flat[3 * k], flat[3 * k + 1], flat[3 * k + 2]
        if cap or nic or key != fid:
            out[fid] = Alone(key, cap, bool(nic))
    return out
