"""scripts/calibrate_bands.py: held-out errors by measured time, against hand-worked rows."""

from __future__ import annotations

from pathlib import Path

import pytest
from script_modules import load

ROOT = Path(__file__).resolve().parents[1]
calibrate_bands = load("scripts/calibrate_bands.py")


def test_bands_count_median_p90_and_share_within_ten_percent(tmp_path: Path) -> None:
    csv = tmp_path / "e.csv"
    rows = [("gemm", 1000, 0.05), ("copy", 8000, 0.20), ("gemm", 2000, 0.30), ("noop", 500, 0.90)]
    rows += [("gemm", 200_000, 0.01), ("gemm", 8001, 0.5)]  # a long kernel; one between the bands
    csv.write_text(
        "class,op,source,measured_ns,predicted_ns,rel_error\n"
        + "".join(f"{c},Op,t.csv:1,{m},0,{e}\n" for c, m, e in rows)
    )
    small, long = calibrate_bands.band_lines(csv)
    # errors 0.05, 0.20, 0.30 (noop left out): median 0.20; p90 by linear interpolation 0.20 + 0.8 x 0.10 = 0.28
    assert small == "measured <= 8 us: 3 rows, median 20.0%, p90 28.0%, within 10%: 33%"
    assert long == "measured > 100 us: 1 rows, median 1.0%, p90 1.0%, within 10%: 100%"


def test_a_file_that_is_not_an_errors_file_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit, match="bad.csv"):
        calibrate_bands.band_lines(bad)
