"""`phantora sweep` reads each run directory once: the table's metrics and the plots (the FCT CDF) come from the
same read. A packet run's queues.csv can hold a million rows (the CC user trial of 2026-12-02: 1,212,796 in one
4-host all-to-all replay), read cell by cell, and the plots read every run a second time."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from phantora.results import read
from phantora.sweep import SweepSpec, run_sweep

WORKLOAD = """
name = "a2a"
[[op]]
name = "a2a"
kind = "all_to_all"
bytes = 1048576
ranks = "all"
"""


def test_each_run_directory_is_read_once_and_the_cdf_is_drawn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two flow-mode replays: each directory's flows.csv is read exactly once (the real reader, counted), and
    fct_cdf.png is still written from those flows."""
    wl = tmp_path / "a2a.toml"
    wl.write_text(WORKLOAD)
    real = read._load_flows
    reads: collections.Counter[Path] = collections.Counter()

    def counted(run: Any, root: Path) -> Any:
        reads[Path(root)] += 1
        return real(run, root)

    monkeypatch.setattr(read, "_load_flows", counted)
    spec = SweepSpec(
        name="once", fixed={"workload": str(wl), "network": "flow"}, grid={"topology": ["star8", "twoleaf8"]}
    )
    res = run_sweep(spec, tmp_path / "out", jobs=2, progress=False, report=lambda _m: None)
    assert [r["status"] for r in res.rows] == ["ok", "ok"]
    assert sorted(reads.values()) == [1, 1] and set(reads) == {Path(r["dir"]) for r in res.rows}
    png = tmp_path / "out" / "fct_cdf.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
