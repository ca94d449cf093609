"""Published points that time an algorithm's connection set-up (phantora/collectives/nccl/first_use.py): NCCL
2.22-2.27's tuner, written out from its constants, first picks NVLS-Tree at the sizes where the multi-host
tables' out-of-place time is longer than at twice the size."""

from __future__ import annotations

import pytest

from phantora.collectives.nccl.first_use import choice_2_2x, first_uses, nvls_tree_cost_2_2x
from phantora.collectives.nccl.published import SETUP_POINTS
from phantora.collectives.nccl.settings import settings_from_env
from tests.nccl_tables import BY_NAME, table_platform

MiB = 1 << 20
VM4 = "h100_32gpu_4node_ndr400_all_reduce_nccltests309_vm"
GJ8 = "h100_64gpu_8node_ib400_all_reduce_nccltests309_gjaion_default"
GJ8_CTAS = "h100_64gpu_8node_ib400_all_reduce_nccltests309_gjaion_minctas24"
EFA2 = "h100_16gpu_2node_efa_all_reduce_awsp5keitaw"


def _sweep(lo: int, hi: int) -> list[int]:
    return [lo << i for i in range((hi // lo).bit_length())]


def _tree_ll128_us(nodes: int, nbytes: int, correction: float) -> float:
    """Tree/LL128 all-reduce on 8-GPU H100 hosts with a 400G NIC per GPU: latency 14 + 2 (7 x 1.25 + log2(nodes)
    x 8.5) µs; bandwidth min(8 x 48 x 0.92, 8 x 36) x 120/128, capped at 8 x 29, halved: 116 GB/s, times NCCL's
    treeCorrectionFactor for LL128 at log2(bytes / 64)."""
    lat = 14.0 + 2 * (7 * 1.25 + (nodes.bit_length() - 1) * 8.5)
    return lat + nbytes / (1000.0 * 116.0 * correction)


def _nvls_tree_us(nodes: int, nbytes: int) -> float:
    """NVLS-Tree in NCCL 2.22-2.27: 8 channels x min(40, 48 / 2) x 5/6 = 160 GB/s beyond two hosts; latency 25 +
    2 log2(nodes) x 14 µs."""
    return 25.0 + 2 * (nodes.bit_length() - 1) * 14.0 + nbytes / (1000.0 * 160.0)


@pytest.mark.parametrize("nodes", [4, 8])
def test_nvls_tree_as_nccl_2_2x_rates_it(nodes):
    p = table_platform(VM4 if nodes == 4 else GJ8)
    cost = nvls_tree_cost_2_2x(p)
    assert cost is not None
    assert cost.algbw == pytest.approx(160.0)
    assert cost.lat_us == pytest.approx(25.0 + 2 * (nodes.bit_length() - 1) * 14.0)


@pytest.mark.parametrize(
    ("name", "nodes", "below", "at", "correction"),
    [(VM4, 4, 1 * MiB, 2 * MiB, (0.6, 0.6)), (GJ8, 8, 4 * MiB, 8 * MiB, (0.8, 0.9))],
)
def test_nccl_2_2x_turns_from_tree_ll128_to_nvls_tree_where_the_closed_forms_cross(name, nodes, below, at, correction):
    """4 hosts: 80.57 vs 87.55 µs at 1 MiB, 95.63 vs 94.11 at 2 MiB; 8 hosts: 127.70 vs 135.21 at 4 MiB, 162.85 vs
    161.43 at 8 MiB."""
    assert _tree_ll128_us(nodes, below, correction[0]) < _nvls_tree_us(nodes, below)
    assert _tree_ll128_us(nodes, at, correction[1]) > _nvls_tree_us(nodes, at)
    p, st = table_platform(name), settings_from_env({})
    assert choice_2_2x(p, st, below) == "tree/LL128"
    assert choice_2_2x(p, st, at) == "nvls_tree/Simple"


@pytest.mark.parametrize(
    ("name", "lo", "hi", "expected"),
    [
        (VM4, 8, 16 << 30, {2 * MiB: "nvls_tree"}),  # -b 8 -e 16g: warm-ups on Tree/LL and the ring
        (GJ8, MiB, 8 << 30, {8 * MiB: "nvls_tree"}),  # 1 MiB - 8 GiB
        (GJ8_CTAS, MiB, 8 << 30, {8 * MiB: "nvls_tree"}),
        (EFA2, 8, 16 << 30, {}),  # -b 8 -e 16G: NVLS-Tree is the 16 GiB warm-up's ("Connected NVLS tree" first)
    ],
)
def test_first_uses_of_each_sweep(name, lo, hi, expected):
    table = BY_NAME[name]
    assert first_uses(table_platform(name), settings_from_env(table.env), _sweep(lo, hi)) == expected


@pytest.mark.parametrize("name", [VM4, GJ8, GJ8_CTAS])
def test_published_time_at_the_first_use_is_longer_than_at_twice_the_size(name):
    """Out-of-place µs from busbw: 2 (n-1)/n x size / busbw. VM: 191 at 2 MiB vs 151 at 4 MiB; gj-aion's 8 hosts:
    1272 / 889 at 8 MiB vs 378 / 511 at 16 MiB."""
    table = BY_NAME[name]
    n, rows = table.gpus, dict(table.rows)
    (size,) = SETUP_POINTS[name]

    def us(s: int) -> float:
        return 2 * (n - 1) / n * s / (rows[s] * 1000.0)

    assert us(size) > us(2 * size)


def test_every_setup_point_is_a_first_use_of_its_run():
    for name, points in SETUP_POINTS.items():
        table = BY_NAME[name]
        sizes = _sweep(8 if name == VM4 else MiB, (16 if name == VM4 else 8) << 30)
        assert first_uses(table_platform(name), settings_from_env(table.env), sizes) == points, name


GJ2 = "h100_16gpu_2node_ib400_all_reduce_nccltests309_gjaion_default"
GJ2_RING = "h100_16gpu_2node_ib400_all_reduce_nccltests309_gjaion_ring"
GJ4 = "h100_32gpu_4node_ib400_all_reduce_nccltests309_gjaion_default"
BM2 = "h100_16gpu_2node_ndr400_all_reduce_nccltests309_baremetal"


def test_two_hosts_nccl_2_2x_run_nvls_tree_from_1_mib():
    """Two hosts at 1 MiB: Tree/LL128 48.5 + 1 MiB / (116 x 0.6) = 63.57 µs against NVLS-Tree (8 channels x
    min(40, 48) x 5/6 = 266.7 GB/s, not halved on two hosts) 53 + 1 MiB / 266.7 = 56.93: the default two-host
    sweeps (1 MiB - 8 GiB) run NVLS-Tree at both warm-ups and every size, so none of their sizes is a first use."""
    assert _tree_ll128_us(2, MiB, 0.6) == pytest.approx(63.57, abs=0.01)
    assert 53.0 + MiB / (1000.0 * 8 * 40 * 5 / 6) == pytest.approx(56.93, abs=0.01)
    p, st = table_platform(GJ2), settings_from_env({})
    assert {choice_2_2x(p, st, s) for s in (MiB, 8 << 30)} == {"nvls_tree/Simple"}


@pytest.mark.parametrize(
    ("name", "lo", "hi"),
    [(GJ2, MiB, 8 << 30), (GJ2_RING, MiB, 8 << 30), (BM2, 8, 16 << 30), (GJ4, MiB, 8 << 30)],
)
def test_the_other_309_sweeps_have_no_first_use_but_the_listed_ones(name, lo, hi):
    """gj-aion's 4-host 1 MiB (317 µs, +201% in the model) is its own smallest-size warm-up's call (Tree/LL128),
    so its only first use is NVLS-Tree at 2 MiB; the forced ring and the two-host default runs have none."""
    table = BY_NAME[name]
    assert first_uses(table_platform(name), settings_from_env(table.env), _sweep(lo, hi)) == SETUP_POINTS.get(name, {})
