"""Fabric records as integer columns (issue 38): millions of CE marks and CNPs without an object each.

A packet run's served episodes (`phantora.netsim.reuse`) repeat the records of the episode they were recorded
from, shifted in time and with their flows renamed: on the 1024-GPU step that is millions of CE marks and as
many CNPs, which cost a frozen dataclass each to shift, sort and write. `RecordColumns` holds one kind of record
(`PfcEvent`, `Drop`, `CnpEvent`, `EcnMark`) as an int64 array per field; shifting, renaming and merging in time
order are array operations, and the writers (`phantora.results.write`) format rows straight from the columns.
It is a `Sequence` of the record type, so every other reader sees the same records: one is made when it is read.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from phantora.netsim.observe import CnpEvent, Drop, EcnMark, PfcEvent

if TYPE_CHECKING:  # numpy loads where arrays are made: the netsim CLI starts without it (test_netsim_runner.py)
    import numpy as np

R = TypeVar("R", PfcEvent, Drop, CnpEvent, EcnMark)


class RecordColumns(Sequence[R], Generic[R]):
    """Records of one type in order, an int64 column per field (`columns[name]`), all of one length."""

    def __init__(self, kind: type[R], columns: dict[str, np.ndarray]) -> None:
        self.kind: type[R] = kind
        self.names = tuple(f.name for f in fields(kind))
        self.columns = columns
        self._n = len(columns[self.names[0]])

    @classmethod
    def of(cls, kind: type[R], records: Sequence[R]) -> RecordColumns[R]:
        """`records` as columns (themselves if they already are)."""
        import numpy as np

        if isinstance(records, RecordColumns):
            return records
        names = tuple(f.name for f in fields(kind))
        rows = np.array([[getattr(r, n) for n in names] for r in records], dtype=np.int64).reshape(-1, len(names))
        return cls(kind, {n: rows[:, i].copy() for i, n in enumerate(names)})

    def moved(self, dt: int, ids: Sequence[int] | None = None) -> RecordColumns[R]:
        """The records `dt` ns later; with `ids`, a `flow_id` p renamed ids[p] (-1 outside them)."""
        import numpy as np

        cols = dict(self.columns)
        cols["time_ns"] = cols["time_ns"] + dt
        if ids is not None and "flow_id" in cols:
            p = cols["flow_id"]
            table = np.asarray(ids, dtype=np.int64)
            ok = (p >= 0) & (p < len(table))
            cols["flow_id"] = np.where(ok, table[np.where(ok, p, 0)] if len(table) else -1, -1)
        return RecordColumns(self.kind, cols)

    def until(self, t: int) -> RecordColumns[R]:
        """The records at or before `t` ns."""
        keep = self.columns["time_ns"] <= t
        if keep.all():
            return self
        return RecordColumns(self.kind, {n: c[keep] for n, c in self.columns.items()})

    @classmethod
    def by_time(cls, kind: type[R], parts: Sequence[RecordColumns[R]]) -> RecordColumns[R]:
        """The parts one after another, then sorted by time, stably (as `list.sort(key=time)` keeps equal
        times in the parts' order)."""
        import numpy as np

        names = tuple(f.name for f in fields(kind))
        if not parts:
            return cls(kind, {n: np.zeros(0, dtype=np.int64) for n in names})
        cols = {n: np.concatenate([p.columns[n] for p in parts]) for n in names}
        order = np.argsort(cols["time_ns"], kind="stable")
        return cls(kind, {n: c[order] for n, c in cols.items()})

    def rows(self) -> list[list[int]]:
        """The columns as Python lists, in field order (for writers)."""
        return [self.columns[n].tolist() for n in self.names]

    def __len__(self) -> int:
        return self._n

    def _make(self, row: tuple[int, ...]) -> R:
        if self.kind is PfcEvent:
            t, node, ntype, port, prio, pause, src = row
            return PfcEvent(t, node, ntype, port, prio, bool(pause), src)  # type: ignore[return-value]
        return self.kind(*row)  # type: ignore[arg-type]

    @overload
    def __getitem__(self, i: int) -> R: ...

    @overload
    def __getitem__(self, i: slice) -> list[R]: ...

    def __getitem__(self, i: int | slice) -> R | list[R]:
        if isinstance(i, slice):
            return [self._make(tuple(int(c[j]) for c in self._cols())) for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._make(tuple(int(c[i]) for c in self._cols()))

    def _cols(self) -> list[np.ndarray]:
        return [self.columns[n] for n in self.names]

    def __iter__(self) -> Iterator[R]:
        make = self._make
        for row in zip(*self.rows(), strict=True):
            yield make(row)

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same records in the same order."""
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == self._n and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"RecordColumns({self.kind.__name__}, {self._n} records)"


def flow_counts(records: Sequence[Any]) -> dict[int, int]:
    """flow id -> how many of `records` (CNPs, CE marks) name it."""
    import numpy as np

    if isinstance(records, RecordColumns):
        ids, counts = np.unique(records.columns["flow_id"], return_counts=True)
        return dict(zip(ids.tolist(), counts.tolist(), strict=True))
    out: dict[int, int] = {}
    for r in records:
        out[r.flow_id] = out.get(r.flow_id, 0) + 1
    return out
