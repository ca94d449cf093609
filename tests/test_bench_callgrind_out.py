"""bench/callgrind_out.py: the counts read from a callgrind output file, and the `sum` readers of
bench/plan_marks.py, bench/driver_marks.py and bench/driver_critical.py that use it."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(BENCH))  # the scripts import each other and callgrind_out as top-level modules
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))


def _part(path: Path, ir: int) -> None:
    """A dump part as callgrind writes it (header, one cost line, summary and totals)."""
    path.write_text(f"version: 1\ncreator: callgrind-3.19.0\nevents: Ir\nsummary: {ir}\nfn=(1) main\n5 {ir}\n"
                    f"totals: {ir}\n")  # fmt: skip


def test_totals_pairs_each_event_name_with_its_count(tmp_path: Path) -> None:
    prof = tmp_path / "callgrind.out"
    prof.write_text("version: 1\nevents: Ir D1mr D1mw DLmr DLmw\nfn=(1) main\n5 10 1 0 0 0\nsummary: 1200 30 7 2 1\n")
    assert _load("callgrind_out").totals(prof) == {"Ir": 1200, "D1mr": 30, "D1mw": 7, "DLmr": 2, "DLmw": 1}


def test_totals_reads_a_totals_line_too(tmp_path: Path) -> None:
    prof = tmp_path / "callgrind.out"
    prof.write_text("events: Ir\ntotals: 987654321\n")
    assert _load("callgrind_out").totals(prof) == {"Ir": 987654321}


def test_instructions_are_the_first_event(tmp_path: Path) -> None:
    prof = tmp_path / "cg.1"
    prof.write_text("events: Ir D1mr\nsummary: 4500 12\n")
    assert _load("callgrind_out").instructions(prof) == 4500


def test_a_file_without_counts_is_refused_naming_it(tmp_path: Path) -> None:
    prof = tmp_path / "empty.out"
    prof.write_text("events: Ir\n")
    with pytest.raises(SystemExit, match="empty.out"):
        _load("callgrind_out").instructions(prof)


def test_the_three_sum_readers_order_the_dump_parts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # process 7: parts 1..11 (k x 0.1 G each, so part 10 must follow part 9, not part 1) and its final file;
    # process 9: part 1 and its final file
    for k in range(1, 12):
        _part(tmp_path / f"cg.7.{k}", k * 100_000_000)
    _part(tmp_path / "cg.7", 5_000_000_000)
    _part(tmp_path / "cg.9.1", 3_000)
    _part(tmp_path / "cg.9", 4_000)
    seven = [k * 100_000_000 for k in range(1, 12)] + [5_000_000_000]
    assert _load("driver_critical").parts_by_process(tmp_path) == {7: seven, 9: [3_000, 4_000]}
    for name in ("cg.9", "cg.9.1"):
        (tmp_path / name).unlink()
    assert _load("driver_marks").parts(tmp_path) == seven
    _load("plan_marks").parts(tmp_path)
    want = ["cg.7 5.000 G"] + [f"cg.7.{k} {k / 10:.3f} G" for k in range(1, 12)]
    assert capsys.readouterr().out.splitlines() == want
