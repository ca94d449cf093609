"""bench/bench_episodes.py: busy periods of the packet side and the share of bytes reuse=on still runs."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
from script_modules import load

from phantora.errors import InputError


def _load() -> ModuleType:
    return load("bench/bench_episodes.py")


def test_periods_merge_overlaps_and_share_counts_first_of_each_shape() -> None:
    ep = _load()
    us = 1000
    # two shapes, each twice: (2 flows, 3 bytes, 20 us) and (1 flow, 3 bytes, 10 us)
    iv = [
        (0, 10 * us, 1),
        (5 * us, 20 * us, 2),
        (30 * us, 40 * us, 3),
        (100 * us, 110 * us, 1),
        (105 * us, 120 * us, 2),
        (200 * us, 210 * us, 3),
    ]
    periods = ep.busy_periods(iv)
    assert [(p.start_ns, p.end_ns, p.flows, p.nbytes) for p in periods] == [
        (0, 20 * us, 2, 3),
        (30 * us, 40 * us, 1, 3),
        (100 * us, 120 * us, 2, 3),
        (200 * us, 210 * us, 1, 3),
    ]
    assert ep.first_of_shape_share(periods) == pytest.approx(6 / 12)
    assert ep.busy_periods([(0, 5, 1), (5, 9, 1)])[0].flows == 2  # touching intervals are one period


def test_bad_flows_csv_names_the_file(tmp_path: Path) -> None:
    ep = _load()
    bad = tmp_path / "flows.csv"
    bad.write_text("flow_id,src_id\n1,x\n")
    with pytest.raises(InputError, match="flows.csv"):
        ep.packet_side_intervals(str(bad), "testbed16")
