"""Large results files formatted by forked processes (`phantora.results.forked`): byte for byte csv.writer's file,
a failing process named, no part file left."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from phantora.errors import InputError, PhantoraError
from phantora.netsim.base import Completion
from phantora.results import forked
from phantora.results import write as W
from phantora.topology.loader import load_topology
from tests.csv_reference import csv_bytes


@pytest.fixture
def split(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every 3 rows a process, at most 4, blocks of 2 rows: a 20-row file takes 4 processes."""
    monkeypatch.setattr(forked, "MIN_ROWS", 3)
    monkeypatch.setattr(W, "ROWS_AT_ONCE", 2)
    monkeypatch.setenv(forked.PROCS_ENV, "4")


def test_columns_by_four_processes_are_csv_writers_file(tmp_path: Path, split: None) -> None:
    cols: list[list[object]] = [list(range(20)), [f"n{i}" for i in range(20)], [i * -7 for i in range(20)]]
    path = W.write_columns(tmp_path / "x.csv", ["t", "n", "v"], cols)
    assert len(forked.last_child_cpu_s) == 4  # four children, 5 rows each
    assert path.read_bytes() == csv_bytes(["t", "n", "v"], [list(r) for r in zip(*cols, strict=True)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.csv"]


def test_flows_csv_by_four_processes(tmp_path: Path, split: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """flows.csv's rows, each made as its block is formatted, in flow id order whichever process made them, each
    with its closed-form standalone FCT (bytes at the bottleneck plus the path's latency)."""
    from phantora.netsim.standalone import standalone_fct_ns as alone_ns

    topo = load_topology("testbed16")
    eps = topo.endpoints
    done = [Completion(i, 10 * i, 10 * i + 5_000 + i, 4096 * (i + 1), eps[i % 8], eps[8 + i % 8]) for i in range(20)]
    path = W.write_flows_csv(tmp_path / "flows.csv", topo, reversed(done))
    assert len(forked.last_child_cpu_s) == 4
    rows = list(csv.reader(io.StringIO(path.read_bytes().decode())))
    assert [int(r[0]) for r in rows[1:]] == list(range(20))
    assert [int(r[11]) for r in rows[1:]] == [alone_ns(topo, c.src, c.dst, c.size, c.flow_id) for c in done]
    monkeypatch.setenv(forked.PROCS_ENV, "1")
    one = W.write_flows_csv(tmp_path / "one.csv", topo, done)
    assert one.read_bytes() == path.read_bytes()


def test_a_failing_process_is_named_and_leaves_nothing(tmp_path: Path, split: None) -> None:
    def make(i: int) -> list[object]:
        if i == 17:  # in the last child's range
            raise ValueError(f"row {i} cannot be made")
        return [i, "x"]

    with pytest.raises(PhantoraError, match=r"writing f\.csv: a process formatting its rows failed \(ValueError: row"):
        W.write_plain_rows(tmp_path / "f.csv", ["a", "b"], list(range(20)), make)
    assert list(tmp_path.iterdir()) == []


def test_procs_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(forked.PROCS_ENV, "3")
    assert [forked.procs(n) for n in (0, forked.MIN_ROWS - 1, 2 * forked.MIN_ROWS, 50 * forked.MIN_ROWS)] == [
        1,
        1,
        2,
        3,
    ]
    monkeypatch.setenv(forked.PROCS_ENV, "many")
    with pytest.raises(InputError, match="PHANTORA_WRITE_PROCS='many' is not a whole number"):
        forked.procs(10**9)
