"""Busbw gained per doubling of the size (phantora/collectives/nccl/doubling.py): against the closed form of a fixed
cost plus bytes at a rate, and the steps of the published one-host A100 all-reduce curves, worked out by hand from
their CSVs (tests/data/nccl_tests)."""

from __future__ import annotations

import pytest

from phantora.collectives.nccl.doubling import doubling_gains, steps
from phantora.collectives.nccl.published import tables

MiB = 1 << 20


def _busbw(time_ns: dict[int, float]) -> list[tuple[int, float]]:
    """(size, busbw GB/s) of 8-GPU all-reduces taking these times."""
    return [(s, s / t * 14 / 8) for s, t in time_ns.items()]


def _affine(fixed_us: float, rate_gbs: float, sizes: list[int]) -> list[tuple[int, float]]:
    """(size, busbw) of an 8-GPU all-reduce taking fixed_us plus its bytes at rate_gbs (algbw)."""
    return _busbw({s: fixed_us * 1e3 + s / rate_gbs for s in sizes})


def test_a_fixed_cost_plus_bytes_gains_f_over_f_plus_two_s_over_b_and_has_no_step():
    """t = F + S / B: busbw(2 S) / busbw(S) - 1 = F / (F + 2 S / B), smaller at every doubling."""
    sizes = [MiB << k for k in range(5, 12)]
    gains = doubling_gains(_affine(200.0, 130.0, sizes), 32 * MiB, 1 << 30)
    assert [s for s, _ in gains] == sizes[:-1]
    for s, g in gains:
        assert g == pytest.approx(200e3 / (200e3 + 2 * s / 130.0))
    assert all(b < a for (_, a), (_, b) in zip(gains, gains[1:], strict=False))
    assert steps(gains) == []


def test_a_cost_that_stops_at_a_size_is_a_step_there():
    """50 µs + bytes at 130 GB/s, and 600 µs more up to 128 MiB only: 64 -> 128 MiB gains 650 / (650 + 1032)
    = 38.6%, 128 -> 256 MiB 2 x 1682 / 2115 - 1 = 59.1%, a rise of 20 points at 128 MiB and nowhere else."""
    sizes = [MiB << k for k in range(5, 12)]
    rows = _busbw({s: 50e3 + s / 130.0 + (600e3 if s <= 128 * MiB else 0.0) for s in sizes})
    gains = dict(doubling_gains(rows, 32 * MiB, 1 << 30))
    assert gains[64 * MiB] == pytest.approx(650e3 / (650e3 + 128 * MiB / 130.0))
    assert gains[128 * MiB] == pytest.approx(2 * (650e3 + 128 * MiB / 130.0) / (50e3 + 256 * MiB / 130.0) - 1)
    assert steps(list(gains.items())) == [128 * MiB]


def test_sizes_outside_the_range_or_without_their_double_are_left_out():
    rows = [(16 * MiB, 100.0), (32 * MiB, 120.0), (64 * MiB, 150.0), (256 * MiB, 200.0)]
    assert doubling_gains(rows, 32 * MiB, 1 << 30) == [(32 * MiB, pytest.approx(0.25))]


@pytest.mark.parametrize(
    ("name", "step", "before", "after"),
    [
        ("azure_nda100v4", 128 * MiB, 174.18 / 166.63, 213.87 / 174.18),
        ("ocibmgpu48", 128 * MiB, 197.17 / 199.23, 221.38 / 197.17),
        ("galvatronfixture", 512 * MiB, 202.00 / 200.85, 230.84 / 202.00),
    ],
)
def test_each_published_one_host_a100_all_reduce_has_one_step(name, step, before, after):
    """The CSVs' busbw: Azure +4.5% then +22.8% at 128 MiB, Oracle -1.0% then +12.3%, Galvatron's DGX +0.6%
    then +14.3% at 512 MiB (and +7.5% after +4.6% at 128 MiB, under the 5-point rise)."""
    (table,) = [t for t in tables() if t.name == f"a100_8gpu_1node_all_reduce_{name}"]
    gains = dict(doubling_gains(table.rows, 32 * MiB, 1 << 30))
    assert gains[step // 2] == pytest.approx(before - 1, abs=1e-9)
    assert gains[step] == pytest.approx(after - 1, abs=1e-9)
    assert steps(list(gains.items())) == [step]
