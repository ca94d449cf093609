"""`CompletionColumns`: a batch of completions kept as columns, each `Completion` object built only when read.

Route (a)'s driver reads every completion of the run from its workers' replies (issue 38, item 2), but its books
need only each one's id and end; the objects (90,112 on bench_decompose's 64 MiB hierarchical DAG, about a third of
the driver's serial work between rounds) are for its caller. A reply's columns are kept as this class, the books
read `ids` and `ends`, and the objects are built when they are handed out (`built`; `DecomposedSimulator.drain`
builds them while the workers run the next round). Building is column at a time (`by_column`), not a call a row.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import compress, repeat
from typing import Any, overload

from phantora.netsim.base import _COMPLETION_SET, _NEW, Completion, Lost, completion

# rows fewer than this are built one by one (`completion`): `by_column`'s eight column passes cost more than their
# rows below it (a hybrid's drain hands out a few completions a worker a step: 2 x 4 rows 12.9 -> 5.1 us a call)
ROW_BY_ROW_MAX = 24

# a buffered completion: its object, or (its batch, its row there) while not built (`completions_of`)
Ref = Completion | tuple["CompletionColumns", int]


class CompletionColumns(Sequence[Completion]):
    """Completions as columns (lists, one per field of `Completion`; `lost` only for the rows that lost bytes)."""

    __slots__ = ("_unchecked", "dsts", "ends", "ids", "lost", "sizes", "srcs", "starts", "tags")

    def __init__(
        self,
        ids: list[int],
        starts: list[int],
        ends: list[int],
        sizes: list[int],
        srcs: list[int],
        dsts: list[int],
        tags: list[str],
        lost: dict[int, Lost] | None = None,
        unchecked: Callable[[], dict[int, Lost]] | None = None,
    ) -> None:
        """`unchecked`: the columns the books do not read (all but ids and ends) are not checked yet; it checks them
        (raising what it raises) and returns the lost ranges, before the first object is built (`ready`)."""
        self.ids, self.starts, self.ends, self.sizes = ids, starts, ends, sizes
        self.srcs, self.dsts, self.tags = srcs, dsts, tags
        self.lost: dict[int, Lost] = lost or {}
        self._unchecked = unchecked

    def ready(self) -> CompletionColumns:
        """These columns, every one checked (`unchecked` run once)."""
        if self._unchecked is not None:
            self.lost = self._unchecked()
            self._unchecked = None
        return self

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, i: int) -> Completion: ...

    @overload
    def __getitem__(self, i: slice) -> list[Completion]: ...

    def __getitem__(self, i: int | slice) -> Completion | list[Completion]:
        if isinstance(i, slice):
            return self.built(range(len(self.ids))[i])
        if not -len(self.ids) <= i < len(self.ids):
            raise IndexError("completion row out of range")
        return self.built([i % len(self.ids)])[0]

    def __iter__(self) -> Iterator[Completion]:
        return iter(self.built())

    def built(self, rows: Sequence[int] | None = None) -> list[Completion]:
        """The `Completion` objects of `rows` (every row when None), in that order."""
        if rows is not None and not rows:
            return []
        self.ready()
        if rows is not None and len(rows) < ROW_BY_ROW_MAX:  # (a few rows: one by one, the same objects)
            ids, starts, ends, sizes, srcs, dsts, tags = (
                self.ids, self.starts, self.ends, self.sizes, self.srcs, self.dsts, self.tags)  # fmt: skip
            lost = self.lost
            if lost:
                return [completion(ids[r], starts[r], ends[r], sizes[r], srcs[r], dsts[r], tags[r], lost.get(r) or ())
                        for r in rows]  # fmt: skip
            return [completion(ids[r], starts[r], ends[r], sizes[r], srcs[r], dsts[r], tags[r]) for r in rows]
        cols: tuple[list[Any], ...] = (self.ids, self.starts, self.ends, self.sizes, self.srcs, self.dsts, self.tags)
        n = len(self.ids)
        if isinstance(rows, range) and rows.step == 1 and 0 <= rows.start <= rows.stop <= n:  # (a run's rows: sliced)
            cols = tuple(col[rows.start : rows.stop] for col in cols)
            n = len(rows)
        elif rows is not None and not (len(rows) == n and all(map(operator.eq, rows, range(n)))):
            cols = tuple(list(map(col.__getitem__, rows)) for col in cols)
            n = len(rows)
        else:
            rows = range(n)
        out = by_column(Completion, _COMPLETION_SET, n, (*cols, repeat((), n)))
        if self.lost:
            for k, r in enumerate(rows):
                ranges = self.lost.get(r)
                if ranges:
                    c = out[k]
                    out[k] = Completion(c.flow_id, c.start_ns, c.end_ns, c.size, c.src, c.dst, c.tag, ranges)
        return out


def by_column(cls: type[Any], setters: tuple[Any, ...], n: int, columns: tuple[Iterable[Any], ...]) -> list[Any]:
    """`n` instances of the slotted dataclass `cls`, built without its `__init__` and filled a column at a time:
    `setters[k]` (slot k's `__set__`, `phantora.netsim.base`'s tuples, in field order) mapped over the instances
    and `columns[k]` at C speed, not a Python call a row."""
    out = list(map(_NEW, repeat(cls, n)))
    for put, column in zip(setters, columns, strict=True):
        deque(map(put, out, column), maxlen=0)
    return out


def completions_of(refs: Sequence[Ref]) -> list[Completion]:
    """The completions of buffered refs, in order: a ref still (batch, row) built from its batch, a batch at a time."""
    n = len(refs)
    kinds = set(map(type, refs))
    if tuple not in kinds:  # (every one built already: a marker's, or an engine's whose replies are objects)
        return list(refs)  # type: ignore[arg-type]
    if Completion in kinds:  # (markers among them: per ref)
        return _mixed(refs)
    batches, rows = zip(*refs, strict=True)  # (at C speed: `drain` hands out tens of thousands at once)
    first = batches[0]
    if batches.count(first) == n:
        return first.built(rows)
    out: list[Any] = [None] * n
    for batch in dict.fromkeys(batches):  # (by identity, at C speed: a batch compares and hashes as an object)
        mine = list(map(operator.is_, batches, repeat(batch)))
        at = list(compress(range(n), mine))
        deque(map(out.__setitem__, at, batch.built(list(compress(rows, mine)))), maxlen=0)
    return out


def _mixed(refs: Sequence[Ref]) -> list[Completion]:
    out: list[Any] = list(refs)
    groups: dict[int, tuple[CompletionColumns, list[int], list[int]]] = {}
    for k, ref in enumerate(refs):
        if type(ref) is tuple:
            batch, row = ref
            g = groups.get(id(batch))
            if g is None:
                g = groups[id(batch)] = (batch, [], [])
            g[1].append(k)
            g[2].append(row)
    for batch, at, rows in groups.values():
        deque(map(out.__setitem__, at, batch.built(rows)), maxlen=0)
    return out


__all__ = ["CompletionColumns", "Ref", "by_column", "completions_of"]
