"""The spread of published tables of one experiment on different clusters (phantora/collectives/nccl/spread.py):
the goal's band against its closed form, and the grouping against what the CSVs' first lines state."""

from __future__ import annotations

import pytest

from phantora.collectives.nccl.published import tables
from phantora.collectives.nccl.spread import Spread, fit, groups, runs, spreads, time_us

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


def test_a_fit_of_times_affine_in_size_returns_their_fixed_cost_and_rate():
    """Rows whose times are exactly 50 µs + S x f / 300 GB/s give back a = 50 µs and B = 300 GB/s, for any f."""
    factor = 2 * 63 / 64
    rows = [(size, size * factor / ((size * factor / 300e3 + 50.0) * 1e3)) for size in (16 * MiB, 64 * MiB, 512 * MiB)]
    f = fit(rows, factor)
    assert f.intercept_us == pytest.approx(50.0) and f.busbw == pytest.approx(300.0)
    assert (f.lo, f.hi, f.points) == (16 * MiB, 512 * MiB, 3)


def test_a_fit_of_two_published_rows_is_the_line_through_them():
    """gj-aion's 4 hosts at 1 and 2 GiB (322.02, 322.71 GB/s; f = 2 x 31 / 32): the times 6,460.4 and 12,893.2 µs
    give B = 2^30 f / (12,893.2 - 6,460.4) µs and a = 6,460.4 - 2^30 f / B."""
    factor = 2 * 31 / 32
    f = fit([(1 << 30, 322.02), (2 << 30, 322.71)], factor)
    t1 = time_us(1 << 30, 322.02, factor)
    t2 = time_us(2 << 30, 322.71, factor)
    assert t1 == pytest.approx(6460.4, abs=0.1) and t2 == pytest.approx(12893.2, abs=0.1)
    assert f.busbw == pytest.approx((1 << 30) * factor / (t2 - t1) / 1e3)
    assert f.intercept_us == pytest.approx(2 * t1 - t2)


def test_a_fit_needs_two_sizes_and_a_flat_time_has_no_rate():
    with pytest.raises(ValueError, match="two sizes"):
        fit([(MiB, 10.0), (2 * MiB, 0.0)], 1.0)
    flat = fit([(MiB, MiB / 100e3), (2 * MiB, 2 * MiB / 100e3)], 1.0)  # 100 µs at both sizes
    assert flat.busbw == float("inf") and flat.intercept_us == pytest.approx(100.0)


def test_runs_are_the_stretches_of_one_label_at_least_three_long():
    assert runs(["tree", "tree", "nvls", "nvls", "nvls", "nvls", "ring", "ring", "ring", "tree"]) == [(2, 6), (6, 9)]
    assert runs(["a", "a"]) == [] and runs(["a", "a"], shortest=2) == [(0, 2)] and runs([]) == []
