"""`CompletionBuffer`: a decomposition driver's gathered completions not handed out yet, kept as the replies came.

Route (a)'s driver gathers every completion of the run from its workers' replies (issue 38, item 2) and hands them
out in (end, id) order. Sorting (end, id, ref) tuples into one list as each reply came cost about 1,700
instructions a completion between rounds (the tuples, their comparisons, their slices). Here a reply stays a run of
its own (its ends, ids and completions, in end order: checked when added, sorted then only if they are not), a
hand-out takes from each run the rows up to a ns (a binary search a run) and the (end, id) order across runs is made
when the objects are built (`built`: a drain builds them while its workers run the next round). Markers (few, built
already) wait in a sorted list of their own.
"""

from __future__ import annotations

import bisect
import operator
from collections.abc import Iterator, Sequence
from itertools import chain, islice

from phantora.netsim.base import Completion
from phantora.netsim.completion_columns import CompletionColumns

_ORDER = operator.attrgetter("end_ns", "flow_id")  # the hand-out order
_REF = operator.itemgetter(2)  # a loose entry's completion

# what a run's completions come from: a reply's columns (rows built when handed out) or built completions
Source = CompletionColumns | Sequence[Completion]
# a hand-out's piece: (its source, the rows of it, in end order); rows index the source
Segment = tuple[Source, Sequence[int]]


class _Run:
    """A reply's completions in end order (`rows` of `src`: None when they are its rows in order), from `lo` on."""

    __slots__ = ("ends", "ids", "lo", "rows", "src")

    def __init__(self, ends: list[int], ids: list[int], src: Source, rows: list[int] | None) -> None:
        self.ends, self.ids, self.src, self.rows, self.lo = ends, ids, src, rows, 0

    def taken(self, hi: int) -> Segment:
        """Rows `lo` to `hi` (exclusive) as a segment; `lo` moves to `hi`."""
        lo, self.lo = self.lo, hi
        return self.src, (range(lo, hi) if self.rows is None else self.rows[lo:hi])


class CompletionBuffer:
    """Completions gathered and not handed out: runs (a reply's each) and loose entries (markers), taken by end."""

    def __init__(self) -> None:
        self._runs: list[_Run] = []
        self._loose: list[tuple[int, int, Completion]] = []  # (end, id, completion), sorted

    def add(self, ends: list[int], ids: list[int], src: Source) -> None:
        """A reply's completions, row k of `src` flow `ids[k]` ending at `ends[k]` (the lists are kept, not copied).
        In end order they stay as they are (checked at C speed); otherwise they are kept sorted by (end, id)."""
        if not ends:
            return
        rows = None
        if not all(map(operator.le, ends, islice(ends, 1, None))):
            rows = sorted(range(len(ends)), key=lambda k: (ends[k], ids[k]))
            ends, ids = [ends[k] for k in rows], [ids[k] for k in rows]
        self._runs.append(_Run(ends, ids, src, rows))

    def add_one(self, end: int, fid: int, c: Completion) -> None:
        """One completion built already (a marker's)."""
        bisect.insort(self._loose, (end, fid, c))

    def __len__(self) -> int:
        return len(self._loose) + sum(len(r.ends) - r.lo for r in self._runs)

    def __bool__(self) -> bool:
        return bool(self._runs or self._loose)

    def earliest(self) -> int | None:
        """The least end buffered (None: empty)."""
        heads = [r.ends[r.lo] for r in self._runs]
        if self._loose:
            heads.append(self._loose[0][0])
        return min(heads, default=None)

    def pairs(self) -> Iterator[tuple[int, int]]:
        """(end, id) of every buffered completion, in no particular order."""
        runs = (zip(islice(r.ends, r.lo, None), islice(r.ids, r.lo, None), strict=True) for r in self._runs)
        return chain(((e, f) for e, f, _ in self._loose), *runs)

    def take(self, t: int) -> tuple[list[Segment], int]:
        """Every completion ending at or before `t`, as segments, and the latest end among them (-1: none)."""
        out: list[Segment] = []
        last = -1
        for r in self._runs:
            hi = bisect.bisect_right(r.ends, t, r.lo)
            if hi > r.lo:
                last = max(last, r.ends[hi - 1])
                out.append(r.taken(hi))
        loose = self._loose
        if loose and loose[0][0] <= t:
            k = bisect.bisect_left(loose, (t + 1,))
            last = max(last, loose[k - 1][0])
            out.append((list(map(_REF, loose[:k])), range(k)))
            del loose[:k]
        self._runs = [r for r in self._runs if r.lo < len(r.ends)]
        return out, last

    def take_first(self) -> tuple[list[Segment], int]:
        """The completions at the least end buffered, as segments, and that end (-1: empty)."""
        first = self.earliest()
        return self.take(first) if first is not None else ([], -1)


def built(segments: Sequence[Segment]) -> list[Completion]:
    """The completions of `segments`, in (end, id) order (each segment is in end order; a flow completes once)."""
    out: list[Completion] = []
    for src, rows in segments:
        if isinstance(src, CompletionColumns):
            out += src.built(rows)
        else:
            out += map(src.__getitem__, rows)
    out.sort(key=_ORDER)  # (runs in order: merged, not sorted again)
    return out


__all__ = ["CompletionBuffer", "Segment", "built"]
