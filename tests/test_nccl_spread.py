"""The spread of published tables of one experiment on different clusters (phantora/collectives/nccl/spread.py):
the goal's band against its closed form, and the grouping against what the CSVs' first lines state."""

from __future__ import annotations

import pytest

from phantora.collectives.nccl.published import tables
from phantora.collectives.nccl.spread import Spread, groups, spreads

MiB = 1 << 20


@pytest.mark.parametrize(("size", "limit"), [(MiB, 1.15 / 0.85), (64 * MiB, 1.10 / 0.90)])
def test_one_prediction_meets_the_goal_on_both_tables_up_to_the_closed_form_ratio(size, limit):
    """p (1 - tol) <= v <= q (1 + tol) for p >= q has a solution iff p / q <= (1 + tol) / (1 - tol)."""
    inside = Spread(size, (100.0, 100.0 * limit * 0.999))
    outside = Spread(size, (100.0 * limit * 1.001, 100.0))
    assert inside.reachable and not outside.reachable
    tol = 0.15 if size < 64 * MiB else 0.10
    assert inside.band == pytest.approx((100.0 * limit * 0.999 * (1 - tol), 100.0 * (1 + tol)))
    assert outside.ratio == pytest.approx(limit * 1.001)


def test_the_four_host_default_all_reduces_of_two_clusters_form_one_group_on_their_shared_sizes():
    """#309's VM cluster (8 B-16 GiB) and gj-aion (1 MiB-8 GiB): same H100 hosts, 400G NICs, default NCCL; the
    shared sizes are gj-aion's 14. gj-aion's 8-host runs differ in NCCL_MIN_CTAS, so they are two experiments."""
    by_name = {tuple(t.name for t in g): g for g in groups(tables())}
    gjaion = "h100_32gpu_4node_ib400_all_reduce_nccltests309_gjaion_default"
    four = by_name[(gjaion, "h100_32gpu_4node_ndr400_all_reduce_nccltests309_vm")]
    rows = spreads(four)
    assert [r.size for r in rows] == [MiB << i for i in range(14)]
    assert rows[0].published == (6.41, 24.73)  # 1 MiB: 317.0 µs on gj-aion, 82 µs on the VMs
    assert not rows[0].reachable and rows[-1].reachable
    assert not any("minctas24" in name for names in by_name for name in names)
