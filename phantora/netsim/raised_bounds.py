"""A decomposition worker's completion bounds that rose since its last report, found by arrays (issue 38, item 2).

Each round a worker reports the bounds of its started flows that rose (`bridge.netserver`): ns-3 gives every started
flow's bound each round (tens of thousands on the hierarchical all-reduce), so the last report is kept as an int64
array indexed by flow id (ids are dense: a DAG's flows count from 0) and compared in one gather, not one dict entry
made and read a flow. Ids at or above `DENSE_MAX` are kept in a dict instead (the same answers)."""

from __future__ import annotations

import numpy as np

DENSE_MAX = 1 << 22  # (32 MiB of int64 at most)


class RaisedBounds:
    """The last report: ns by flow id (-1: none), and the ids it held."""

    def __init__(self) -> None:
        self._last = np.full(0, -1, dtype=np.int64)
        self._ids = np.empty(0, dtype=np.int64)
        self._sparse: dict[int, int] | None = None  # (once an id reached DENSE_MAX)

    def update(self, ids: np.ndarray, ns: np.ndarray) -> list[int]:
        """Flat [id, ns, ...] of the flows in (`ids`, `ns`) (unique ids >= 0, any order, ns >= 0) whose bound is new
        or above the last report's, in their order here; they become the last report (a flow absent here is
        dropped from it)."""
        ids = np.asarray(ids, dtype=np.int64)
        ns = np.asarray(ns, dtype=np.int64)
        if len(ids) != len(ns):
            raise ValueError(f"completion bounds: {len(ids)} ids for {len(ns)} ns")
        top = int(ids.max()) + 1 if len(ids) else 0
        if self._sparse is None and top > DENSE_MAX:
            kept = self._ids.tolist()
            self._sparse = dict(zip(kept, self._last[self._ids].tolist(), strict=True))
        if self._sparse is not None:
            now = dict(zip(ids.tolist(), ns.tolist(), strict=True))
            before = self._sparse
            self._sparse = now
            return [x for fid, b in now.items() if b > before.get(fid, -1) for x in (fid, b)]
        by_id = self._last
        if top > len(by_id):
            grown = np.full(min(max(top, 2 * len(by_id)), DENSE_MAX), -1, dtype=np.int64)  # (top <= DENSE_MAX)
            grown[: len(by_id)] = by_id
            self._last = by_id = grown
        up = ns > by_id[ids]
        by_id[self._ids] = -1
        by_id[ids] = ns
        self._ids = ids
        out = np.empty(2 * int(np.count_nonzero(up)), dtype=np.int64)
        out[0::2] = ids[up]
        out[1::2] = ns[up]
        return list(out.tolist())
