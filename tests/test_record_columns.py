"""Fabric records as columns (issue 38): the same records, order and files as lists of objects."""

from __future__ import annotations

import tracemalloc
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from phantora.netsim.observe import CnpEvent, Drop, EcnMark, PfcEvent
from phantora.netsim.record_columns import RecordColumns, flow_counts
from phantora.netsim.standalone import StandaloneFct, standalone_fct_ns
from phantora.results import schema as S
from phantora.results.forked import PROCS_ENV
from phantora.results.write import write_cnps_csv, write_columns, write_ecn_csv, write_pfc_csv, write_plain_rows
from phantora.topology.loader import load_topology
from tests.csv_reference import csv_bytes

MARKS = [EcnMark(t, 20 + t % 3, t % 4, 3, 100 + t % 5, t % 7) for t in (5, 1, 9, 1, 3)]


def test_moved_renamed_cut_and_merged_as_objects_sorted() -> None:
    """Shift, rename by position (-1 outside), cut at now and merge stably by time: as list.sort(key=time)."""
    own = [EcnMark(4, 1, 0, 3, 9, 42), EcnMark(10, 1, 0, 3, 9, 43)]
    ids = [70, 71, 72, 73, 74, 75]  # position 6 is outside: -1
    tail = RecordColumns.of(EcnMark, MARKS)
    got = RecordColumns.by_time(EcnMark, [RecordColumns.of(EcnMark, own), tail.moved(3, ids).until(10)])
    want = own + [
        EcnMark(m.time_ns + 3, m.node, m.port, m.prio, m.channel, ids[m.flow_id] if m.flow_id < 6 else -1)
        for m in MARKS
        if m.time_ns + 3 <= 10
    ]
    want.sort(key=lambda m: m.time_ns)
    assert list(got) == want and got == want
    assert got[0] == want[0] and got[-1] == want[-1] and got[1:3] == want[1:3]
    assert flow_counts(got) == dict(Counter(m.flow_id for m in want))


def test_pfc_pause_stays_bool_and_empty_merges() -> None:
    ev = [PfcEvent(7, 3, 1, 2, 3, True, 5), PfcEvent(8, 3, 1, 2, 3, False, 5)]
    got = RecordColumns.of(PfcEvent, ev).moved(2)
    assert [e.pause for e in got] == [True, False] and [e.time_ns for e in got] == [9, 10]
    assert len(RecordColumns.by_time(Drop, [])) == 0 and list(RecordColumns.of(CnpEvent, [])) == []


@pytest.mark.parametrize("name", ["leaf0", 'odd,"name'])
def test_write_columns_is_csv_writer_byte_for_byte(tmp_path: Path, name: str) -> None:
    """The `%` template path, and the csv.writer fallback for a field that needs quoting."""
    cols: list[list[object]] = [[1, 22, 333], [name, "b", ""], [0, -4, 5]]
    path = write_columns(tmp_path / "x.csv", ["t", "n", "v"], cols)
    assert path.read_bytes() == csv_bytes(["t", "n", "v"], [list(r) for r in zip(*cols, strict=True)])


def test_trace_files_equal_from_columns_and_objects(tmp_path: Path) -> None:
    topo = load_topology("testbed16")
    n = len(topo.nodes)
    marks = [EcnMark(t, t % n, 1, 3, 40, t) for t in range(50)]
    cnps = [CnpEvent(t, t % n, t, (t + 1) % n, 1000 * t) for t in range(50)]
    pfc = [PfcEvent(t, t % n, 1, 0, 3, bool(t % 2), (t + 2) % n) for t in range(50)]
    cases: list[tuple[str, Any, Any, Any]] = [
        (S.ECN_CSV, write_ecn_csv, marks, EcnMark),
        (S.CNPS_CSV, write_cnps_csv, cnps, CnpEvent),
        (S.PFC_CSV, write_pfc_csv, pfc, PfcEvent),
    ]
    for name, write, recs, kind in cases:
        a = write(tmp_path / f"obj-{name}", topo, recs)
        b = write(tmp_path / f"col-{name}", topo, RecordColumns.of(kind, recs))
        assert a.read_bytes() == b.read_bytes() and len(a.read_bytes().splitlines()) == 51


def test_plain_rows_are_csv_writer_byte_for_byte(tmp_path: Path) -> None:
    rows: list[list[object]] = [[1, "c0/ring", "gpu3", 7, "", "1.2500"], [2, "", "leaf0", -1, 5, ""]]
    path = write_plain_rows(tmp_path / "f.csv", ["a", "b", "c", "d", "e", "f"], rows)
    assert path.read_bytes() == csv_bytes(["a", "b", "c", "d", "e", "f"], rows)


def test_plain_rows_hold_a_block_not_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows are made and formatted a block at a time: writing a 200,000-row file holds less than half the file's
    bytes at its peak (the whole file at once is its text, the text encoded and each row's string: over twice)."""
    monkeypatch.setenv(PROCS_ENV, "1")  # this process formats every block (forked children are not traced)
    header = ["a", "b", "c", "d", "e", "f"]
    n = 200_000
    tracemalloc.start()
    try:
        path = write_plain_rows(tmp_path / "f.csv", header, range(n), lambda i: [i, "c0/ring", "gpu3", 7, "", n - i])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    data = path.read_bytes()
    assert data.count(b"\r\n") == n + 1 and data.endswith(f"{n - 1},c0/ring,gpu3,7,,1\r\n".encode())
    assert peak < len(data) / 2, (peak, len(data))


def test_standalone_once_a_route_equals_each_flow_its_own() -> None:
    """The memoised fluid standalone FCT equals `standalone_fct_ns` (its closed form) for every flow."""
    topo = load_topology("leafspine1024")
    eps = topo.endpoints
    fluid = StandaloneFct(topo)
    flows = [(eps[i % 50], eps[(i % 50 * 37 + 11) % len(eps)], i * 4096 + 1, i % 3) for i in range(300)]
    flows += [(eps[0], eps[0], 100, 1), (eps[1], eps[2], 0, 1)]
    assert [fluid(*f) for f in flows] == [standalone_fct_ns(topo, *f) for f in flows]
    assert len(fluid._paths) == 150  # 50 pairs x 3 keys: each route taken once
