"""Older NCCL tuners' ratings (old_tuners.py, through tuning.rated): the choice moves where their tuning.cc differs
from 2.30's, by closed forms of that tuning.cc; the chosen algorithm's time stays the model's.

One 8-GPU host. A100 (12 NVLink links of 20 GB/s): the ring graph is 12 channels x 20 GB/s (240 GB/s bus); ring LL
costs 6.6 + 14 x 0.6 = 15.0 µs and, from NCCL 2.21, min(87.7, 240 / 2) x 8 / 14 = 50.11 GB/s, but up to 2.20
min(87.7, 240 / 4) x 8 / 14 = 34.29 GB/s; ring LL128 costs 14 + 14 x 1.9 = 40.6 µs at min(0.92 x 240, 12 x 20)
x 8 / 14 = 126.17 GB/s. H100 (18 links of 20.6): NVLS is 8 channels x 40 GB/s at 25 µs, rated 40 x 0.85 x 7/8 x 2
x 8 x 8 / 14 = 272.0 GB/s by 2.28+ and 8 x 40 x 5/6 = 266.67 by 2.19-2.27; ring LL is 15.0 µs at
min(141, 360 / 2) x 8 / 14 = 80.57 GB/s."""

from __future__ import annotations

from dataclasses import replace

import pytest

from phantora.collectives.nccl import old_tuners, tuning
from phantora.collectives.nccl.settings import settings_from_env
from tests.nccl_tables import table_platform

A100 = "a100_8gpu_1node_all_reduce_azure_nda100v4"
H100 = "h100_8gpu_1node_all_reduce_azure_ndh100v5_nvls"
H100_2HOSTS = "h100_16gpu_2node_ndr400_all_reduce_nccltests309_baremetal"


def _crossing(lat_a: float, bw_a: float, lat_b: float, bw_b: float) -> float:
    """Bytes at which lat_a + S / bw_a (GB/s) = lat_b + S / bw_b, bw_a < bw_b."""
    return (lat_b - lat_a) / (1 / (1000.0 * bw_a) - 1 / (1000.0 * bw_b))


def _pick(name: str, version: tuple[int, int], nbytes: int) -> tuple[str, str]:
    st = replace(settings_from_env({}), nccl_version=version)
    choice = tuning.select("all_reduce", table_platform(name), st, nbytes)
    assert choice is not None
    return choice.algorithm, choice.protocol


def test_ring_ll_turns_to_ll128_where_each_version_s_closed_forms_cross():
    """A100 one host: LL meets LL128 at 1.206 MB in NCCL 2.18 (LL at a quarter of the ring's bus bandwidth) and at
    2.128 MB from 2.21 (a half): 1.5 MiB runs LL128 under 2.18 and LL under 2.26 / 2.30."""
    old = _crossing(15.0, 240 / 4 * 8 / 14, 40.6, 0.92 * 240 * 8 / 14)
    new = _crossing(15.0, 87.7 * 8 / 14, 40.6, 0.92 * 240 * 8 / 14)
    assert 1.20e6 < old < 1.21e6 and 2.12e6 < new < 2.14e6
    for size, v18, v30 in (
        (int(old) - 20_000, "LL", "LL"),
        (int(old) + 20_000, "LL128", "LL"),
        (int(new) - 20_000, "LL128", "LL"),
        (int(new) + 20_000, "LL128", "LL128"),
    ):
        assert _pick(A100, (2, 18), size) == ("ring", v18)
        assert _pick(A100, (2, 26), size) == ("ring", v30)
        assert _pick(A100, (2, 30), size) == ("ring", v30)


def test_nvls_rated_by_the_5_6_ratio_until_2_27_moves_its_first_size():
    """H100 one host: ring LL meets NVLS at 1.1448 MB by 2.28+'s rating (272.0 GB/s) and at 1.1545 MB by
    2.19-2.27's (266.67): between them 2.26 still runs LL, 2.30 NVLS."""
    new = _crossing(15.0, 141 * 8 / 14, 25.0, 40 * 0.85 * 7 / 8 * 2 * 8 * 8 / 14)
    old = _crossing(15.0, 141 * 8 / 14, 25.0, 8 * 40 * 5 / 6)
    assert new < 1_150_000 < old
    assert _pick(H100, (2, 26), 1_150_000) == ("ring", "LL")
    assert _pick(H100, (2, 30), 1_150_000) == ("nvls", "Simple")
    assert _pick(H100, (2, 26), int(old) + 5_000) == ("nvls", "Simple")


def test_the_chosen_algorithm_s_time_is_the_model_s_whichever_version_picked_it():
    st = settings_from_env({})
    p = table_platform(A100)
    # 2.20: 2.18's tuner constants (ring LL at busBw / 4), but the kernel's chunks are already even; before 2.20
    # the kernel's LL128 round-up also slows the time (test_nccl_ring_round_up.py)
    a = tuning.select("all_reduce", p, replace(st, nccl_version=(2, 20)), 3 << 20)
    b = tuning.select("all_reduce", p, replace(st, nccl_version=(2, 30)), 3 << 20)
    assert a == b and a is not None and a.protocol == "LL128"


@pytest.mark.parametrize(("version", "lat"), [((2, 22), 2 * (7 * 28.0 + 28.0)), ((2, 19), 448.0), ((2, 23), None)])
def test_tree_simple_latency_of_2_19_to_2_22(version, lat):
    """Two 8-GPU hosts: tree Simple's latency is 2 x (7 x 28 + log2(2) x 28) = 448 µs in 2.19-2.22 (no base); from
    2.23 the model's own latency (None)."""
    p = table_platform(H100_2HOSTS)
    assert old_tuners.tree_simple_lat_us(version, "all_reduce", p) == lat
    st = replace(settings_from_env({}), nccl_version=version)
    tree = next(c for c in tuning.costs("all_reduce", p, st) if (c.algorithm, c.protocol) == ("tree", "Simple"))
    rated = tuning.rated(tree, "all_reduce", p, st)
    assert rated is not None
    assert rated.lat_us == (tree.lat_us if lat is None else lat)
    assert rated.algbw == tree.algbw


def test_ring_ll128_at_one_gpu_per_node_is_0_7_until_2_22():
    """Ring LL128 keeps 0.7 of the graph's 384 GB/s at one GPU a node up to 2.22 (268.8), 0.92 from 2.23 (None:
    2.30's); at 8 GPUs a node 0.92 in both."""
    p = replace(table_platform(H100_2HOSTS), ppn=1)
    assert old_tuners.graph_bus_bw((2, 22), "all_reduce", "ring", "LL128", p, 384.0, 8, 0.0) == pytest.approx(268.8)
    assert old_tuners.graph_bus_bw((2, 23), "all_reduce", "ring", "LL128", p, 384.0, 8, 0.0) is None
    p8 = table_platform(H100_2HOSTS)
    assert old_tuners.graph_bus_bw((2, 22), "all_reduce", "ring", "LL128", p8, 384.0, 8, 0.0) is None


def test_nvls_all_gather_rating_by_version():
    """One H100 host, 8 channels x 40 GB/s: 2.23-2.26 rate NVLS all-gather at 8 x 40 = 320 GB/s, 2.27 at
    8 x min(40 x 7/8, 0.9 x 40) = 280, 2.28+ as the model (None); the all-reduce 8 x 40 x 5/6 from v2.18.3-1."""
    p = table_platform(H100)
    assert old_tuners.nvls_algbw((2, 26), "all_gather", p, 8, 40.0, 40.0) == pytest.approx(320.0)
    assert old_tuners.nvls_algbw((2, 27), "all_gather", p, 8, 40.0, 40.0) == pytest.approx(280.0)
    assert old_tuners.nvls_algbw((2, 28), "all_gather", p, 8, 40.0, 40.0) is None
    assert old_tuners.nvls_algbw((2, 18), "all_reduce", p, 8, 40.0, 40.0) == pytest.approx(8 * 40 * 5 / 6)


def test_algorithms_exist_from_their_first_nccl():
    """PAT from 2.23 (x 0.85 there, x 0.75 from 2.24: 2.30's), NVLS from 2.17, NVLS-Tree from 2.18."""
    p, st = table_platform(H100), settings_from_env({})
    pat = tuning.Cost("pat", "Simple", 10.0, 75.0)
    assert tuning.rated(pat, "all_gather", p, replace(st, nccl_version=(2, 22))) is None
    rated = tuning.rated(pat, "all_gather", p, replace(st, nccl_version=(2, 23)))
    assert rated is not None and rated.algbw == pytest.approx(85.0)
    assert tuning.rated(pat, "all_gather", p, replace(st, nccl_version=(2, 24))) == pat
    assert not old_tuners.available((2, 16), "nvls") and old_tuners.available((2, 17), "nvls")
    assert not old_tuners.available((2, 17), "nvls_tree") and old_tuners.available((2, 18), "nvls_tree")
    assert _pick(H100, (2, 16), 64 << 20)[0] == "ring"  # no NVLS: the ring at a size NVLS takes from 2.17
    assert _pick(H100, (2, 17), 64 << 20)[0] == "nvls"
