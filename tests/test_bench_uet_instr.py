"""bench/bench_uet_instr.py: the counters read from a callgrind output file."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # it imports bench_uet_cpu and bench_uet_live as top-level modules
    try:
        import bench_uet_instr

        return bench_uet_instr
    finally:
        sys.path.remove(str(BENCH))


def test_totals_pairs_each_event_name_with_its_count(tmp_path: Path) -> None:
    prof = tmp_path / "callgrind.out"
    prof.write_text("version: 1\nevents: Ir D1mr D1mw DLmr DLmw\nfn=(1) main\n5 10 1 0 0 0\nsummary: 1200 30 7 2 1\n")
    assert _load().totals(prof) == {"Ir": 1200, "D1mr": 30, "D1mw": 7, "DLmr": 2, "DLmw": 1}


def test_totals_reads_a_totals_line_too(tmp_path: Path) -> None:
    prof = tmp_path / "callgrind.out"
    prof.write_text("events: Ir\ntotals: 987654321\n")
    assert _load().totals(prof) == {"Ir": 987654321}


def test_a_file_without_counts_is_refused_naming_it(tmp_path: Path) -> None:
    prof = tmp_path / "empty.out"
    prof.write_text("events: Ir\n")
    with pytest.raises(SystemExit, match="empty.out"):
        _load().totals(prof)
