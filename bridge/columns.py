"""Flows and completions on the wire as columns: one msgpack list per field instead of one list per flow.

A decomposition round carries thousands of flows to each worker and thousands of completions back (issue 38,
"No serial driver in the way"). Per-row lists cost a Python call and a list per flow on both sides; columns are
built with one comprehension per field and packed and checked at C speed (`_ints`). Same fields as
`flow_to_wire` / `completion_to_wire`; a flow's deps are `ndeps` counts over one flat `deps` column, a
completion's lost ranges a sparse `lost` column of [row, [[offset, bytes], ...]]. A wide deps list that flows share
(the one object: an all-to-all's dependents each wait on every flow of the one before) goes once: a later row's
`ndeps` is then -1 - the row it was sent at, and the decoded flows share one tuple again.

A decomposition worker's reply nests the completion columns a driver's books do not read (all but `id` and `end`)
in one msgpack bin, `rest` (`completions_to_columns(..., nested=True)`): the driver's decode copies its bytes and
unpacks them only when the objects are built (`CompletionColumns.ready`), while its workers run the next round.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import accumulate
from typing import Any

import msgpack

from bridge.errors import ProtocolError
from bridge.protocol import E_MALFORMED, _ints
from phantora.netsim.base import _FLOW_SET, Completion, Flow
from phantora.netsim.completion_columns import CompletionColumns, by_column

FLOW_INT_COLUMNS = ("id", "src", "dst", "size", "delay", "prio", "budget", "rate", "conn", "ndeps", "deps")
SHARED_MIN = 16  # a deps list this long that an earlier row of the message sent (the same object) goes as a reference
DONE_INT_COLUMNS = ("id", "start", "end", "size", "src", "dst")
BOOKED = ("id", "end")  # the completion columns a driver's books read; the others go nested in `rest`


def flows_to_columns(flows: Sequence[Flow], deps: Sequence[Sequence[int]] | None = None) -> dict[str, list[Any]]:
    """`flows` as columns; `deps[i]` replaces flow i's own deps when given."""
    dl = [f.deps for f in flows] if deps is None else deps
    ndeps = [len(d) for d in dl]
    first: dict[int, int] = {}  # id of a wide list (each alive in `dl`) -> the row it is sent at
    for i, d in enumerate(dl):
        if ndeps[i] >= SHARED_MIN:
            row = first.setdefault(id(d), i)
            if row != i:
                ndeps[i] = -1 - row
    return {
        "id": [f.id for f in flows],
        "src": [f.src for f in flows],
        "dst": [f.dst for f in flows],
        "size": [f.size for f in flows],
        "delay": [f.delay_ns for f in flows],
        "tag": [f.tag for f in flows],
        "prio": [f.priority for f in flows],
        "key": [f.key for f in flows],
        "budget": [f.loss_budget for f in flows],
        "rate": [f.rate_bps for f in flows],
        "conn": [f.conn for f in flows],
        "queue": [f.queue for f in flows],
        "ndeps": ndeps,
        "deps": [x for d, k in zip(dl, ndeps, strict=True) if k > 0 for x in d],
        **({"nic": [f.via_nic for f in flows]} if any(f.via_nic for f in flows) else {}),
    }


def flows_from_columns(cols: Any) -> list[Flow]:
    """Columns -> flows; ProtocolError if a column is missing, of the wrong type or length. The `queue` column
    may be left out (no flow in a queue), and the `nic` column (no flow through the NICs)."""
    n = _checked(cols, FLOW_INT_COLUMNS, ("tag", "key"), skip="deps")
    queues = cols.get("queue", [0] * n)
    if not isinstance(queues, list) or len(queues) != n or not _ints(queues):
        raise ProtocolError("flow columns: bad column 'queue'", code=E_MALFORMED)
    nics = cols.get("nic", [False] * n)
    if not isinstance(nics, list) or len(nics) != n or not all(type(x) is bool for x in nics):
        raise ProtocolError("flow columns: bad column 'nic' (booleans)", code=E_MALFORMED)
    tags, keys, ndeps = cols["tag"], cols["key"], cols["ndeps"]
    if not all(isinstance(t, str) for t in tags) or not all(k is None or type(k) is int for k in keys):
        raise ProtocolError("flow columns: 'tag' must hold strings, 'key' ints or nil", code=E_MALFORMED)
    flat = cols["deps"]
    counts = [max(k, 0) for k in ndeps]
    if sum(counts) != len(flat):
        raise ProtocolError("flow columns: 'ndeps' does not add up to the 'deps' column", code=E_MALFORMED)
    ends = list(accumulate(counts))
    lists = [tuple(flat[e - k : e]) for e, k in zip(ends, counts, strict=True)]
    for i, k in enumerate(ndeps) if min(ndeps, default=0) < 0 else ():
        if k < 0:  # (the deps of an earlier row that sent its own)
            if not (-1 - k < i and ndeps[-1 - k] >= 0):
                raise ProtocolError(f"flow columns: row {i} refers to row {-1 - k}'s deps", code=E_MALFORMED)
            lists[i] = lists[-1 - k]
    columns = (cols["id"], cols["src"], cols["dst"], cols["size"], lists, cols["delay"], tags, cols["prio"], keys)
    return _by_column(Flow, _FLOW_SET, n, (*columns, cols["budget"], cols["rate"], cols["conn"], queues, nics))


def completions_to_columns(done: Sequence[Completion], nested: bool = False) -> dict[str, Any]:
    """Completions as columns; lost ranges only for the rows that lost bytes. `nested`: the columns but `BOOKED` as
    one msgpack bin of their map, `rest` (a decomposition worker's reply)."""
    cols = _columns(done)
    if nested:
        rest = {k: cols.pop(k) for k in list(cols) if k not in BOOKED}
        cols["rest"] = msgpack.packb(rest, use_bin_type=True)
    return cols


def _columns(done: Sequence[Completion]) -> dict[str, Any]:
    if isinstance(done, CompletionColumns):  # (kept as columns: no object built)
        done.ready()
        lost = [[i, [list(r) for r in done.lost[i]]] for i in sorted(done.lost) if done.lost[i]]
        return {
            "id": done.ids, "start": done.starts, "end": done.ends, "size": done.sizes, "src": done.srcs,
            "dst": done.dsts, "tag": done.tags, "lost": lost,
        }  # fmt: skip
    return {
        "id": [c.flow_id for c in done],
        "start": [c.start_ns for c in done],
        "end": [c.end_ns for c in done],
        "size": [c.size for c in done],
        "src": [c.src for c in done],
        "dst": [c.dst for c in done],
        "tag": [c.tag for c in done],
        "lost": [[i, [list(r) for r in c.lost]] for i, c in enumerate(done) if c.lost],
    }


def completions_from_columns(cols: Any) -> list[Completion]:
    """Columns -> completions; ProtocolError if malformed."""
    return completion_columns(cols).built()


def completion_columns(cols: Any) -> CompletionColumns:
    """Columns -> completions kept as columns (`CompletionColumns`: each object built when read; route (a)'s
    driver reads only ids and ends for its books); ProtocolError if malformed: the ids, ends and every column's
    length now, the other columns before the first object is built (`CompletionColumns.ready`: a driver checks them
    while its workers run the next round)."""
    nested = isinstance(cols, dict) and "rest" in cols
    rest = tuple(c for c in (*DONE_INT_COLUMNS, "tag", "lost") if c not in BOOKED)
    n = _checked(cols, BOOKED, () if nested else rest)
    if nested and not isinstance(cols["rest"], bytes):
        raise ProtocolError("completion columns: 'rest' must be a bin", code=E_MALFORMED)

    def unchecked() -> dict[int, tuple[tuple[int, int], ...]]:
        ints = tuple(c for c in DONE_INT_COLUMNS if c not in BOOKED)
        if nested:
            got = _unpacked(cols["rest"])
            if not isinstance(got, dict):
                raise ProtocolError("completion columns: 'rest' must hold a map", code=E_MALFORMED)
            cols.update((k, got[k]) for k in rest if k in got)
            if _checked(cols, ints, rest) != n:
                raise ProtocolError("completion columns: 'rest' of another length than 'id'", code=E_MALFORMED)
            done.starts, done.sizes, done.srcs, done.dsts, done.tags = (
                cols["start"], cols["size"], cols["src"], cols["dst"], cols["tag"]
            )  # fmt: skip
        else:
            _checked(cols, ints, ())
        if list(map(type, cols["tag"])).count(str) != n:  # (at C speed: the driver reads every completion of the run)
            raise ProtocolError("completion columns: 'tag' must hold strings", code=E_MALFORMED)
        lost: dict[int, tuple[tuple[int, int], ...]] = {}
        for row in cols["lost"]:
            ok = isinstance(row, list) and len(row) == 2 and type(row[0]) is int and 0 <= row[0] < n
            ranges = row[1] if ok else None
            if not (isinstance(ranges, list) and all(isinstance(r, list) and len(r) == 2 and _ints(r) for r in ranges)):
                raise ProtocolError(f"completion columns: bad lost ranges {row!r:.80}", code=E_MALFORMED)
            lost[row[0]] = tuple((int(a), int(b)) for a, b in ranges)
        return lost

    start, size, src, dst, tag = ([] if nested else cols[c] for c in ("start", "size", "src", "dst", "tag"))
    done = CompletionColumns(cols["id"], start, cols["end"], size, src, dst, tag, unchecked=unchecked)
    return done


def _unpacked(raw: bytes) -> Any:
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except Exception as exc:  # noqa: BLE001 - msgpack raises many types (ValueError, ExtraData, FormatError ...)
        raise ProtocolError(
            f"completion columns: 'rest' is not msgpack ({type(exc).__name__})", code=E_MALFORMED
        ) from None


def _by_column(cls: type[Any], setters: tuple[Any, ...], n: int, columns: tuple[Iterable[Any], ...]) -> list[Any]:
    """`phantora.netsim.completion_columns.by_column` (a worker decodes every flow of its part of the DAG this way)."""
    return by_column(cls, setters, n, columns)


def _checked(cols: Any, ints: tuple[str, ...], lists: tuple[str, ...], skip: str = "") -> int:
    """The row count of a column map: every column a list (`ints` lists of ints), all of one length (but `skip`)."""
    if not isinstance(cols, dict):
        raise ProtocolError(f"columns must be a map, got {type(cols).__name__}", code=E_MALFORMED)
    for name in (*ints, *lists):
        if not isinstance(cols.get(name), list) or (name in ints and not _ints(cols[name])):
            raise ProtocolError(f"columns: missing or bad column {name!r}", code=E_MALFORMED)
    lengths = {len(cols[k]) for k in (*ints, *lists) if k != skip and k != "lost"}
    if len(lengths) > 1:
        raise ProtocolError(f"columns of different lengths {sorted(lengths)}", code=E_MALFORMED)
    return lengths.pop() if lengths else 0
