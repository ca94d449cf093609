"""NCCL's per-channel ceilings with more CTAs than its model counts (phantora/collectives/nccl/cta_ceiling.py):
tuning.cc caps ring LL128 at perChMaxRingLL128Bw (36.7 GB/s on H100) times the search graph's channels; two H100
hosts of 8 x 400G have a graph of 8 channels of 48 GB/s, so NCCL rates ring LL128 at min(8 x 48 x 0.92, 8 x 36.7)
= 293.6 GB/s busbw, and 24 CTAs (NCCL_MIN_CTAS=24, 1.5 x its 16) raise the ceiling to 440.4, above the graph's
353.28: bus 353.28, algbw 353.28 x 16 / 30."""

from __future__ import annotations

import pytest

from phantora.collectives.nccl import platform_of
from phantora.collectives.nccl.cta_ceiling import capped_bus_bw, raised_bus_bw
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import settings_from_env as nccl_env
from phantora.collectives.nccl.tuning import Cost, comm_channels, costs, more_ctas_algbw, ring_graph, select
from phantora.topology import rail_optimized

MiB = 1 << 20


def h100(n: int) -> Platform:
    """n H100 hosts of 8 GPUs, a 400G NIC per GPU on its rail."""
    return platform_of(rail_optimized(n, 8, spines=8, nic_rate="400Gbps", gpu="h100"), tuple(range(8 * n)))


def test_the_two_host_graph_is_the_one_the_closed_forms_assume():
    p = h100(2)
    g = ring_graph(p)
    assert (g.nchannels, g.bw_intra) == (8, 48.0)
    assert comm_channels(p, g, nccl_env({})) == 16


def test_ring_ll128_ceiling_scales_with_the_ctas_under_the_graphs_rate():
    p = h100(2)
    assert raised_bus_bw("ring", "LL128", p, 8 * 48.0, 8, 1.0) == pytest.approx(8 * 36.7)
    assert raised_bus_bw("ring", "LL128", p, 8 * 48.0, 8, 0.5) == pytest.approx(8 * 36.7)  # never below NCCL's
    assert raised_bus_bw("ring", "LL128", p, 8 * 48.0, 8, 1.5) == pytest.approx(8 * 48.0 * 0.92)
    assert raised_bus_bw("ring", "LL128", p, 8 * 48.0, 8, 1.1) == pytest.approx(8 * 36.7 * 1.1)
    assert raised_bus_bw("ring", "Simple", p, 8 * 48.0, 8, 1.5) == 0.0
    assert raised_bus_bw("ring", "LL", p, 8 * 48.0, 8, 1.5) == 0.0


def test_tree_ll128_on_eight_hosts_applies_both_ceilings():
    """8 hosts (index 2): tree min(384 x 0.92, 8 x 36.0 s), then x 120/128 and min 8 x 29.0 s."""
    p = h100(8)
    assert raised_bus_bw("tree", "LL128", p, 384.0, 8, 1.0) == pytest.approx(8 * 29.0)
    assert raised_bus_bw("tree", "LL128", p, 384.0, 8, 1.5) == pytest.approx(384 * 0.92 * 120 / 128)
    assert raised_bus_bw("tree", "Simple", p, 384.0, 8, 1.0) == pytest.approx(8 * 36.0)


def test_the_shared_ceilings_cap_tree_ll_and_leave_uncapped_pairs():
    """capped_bus_bw (tuning.costs' ceilings at scale 1): tree LL on 8 hosts gets the tree ceiling min(384 x 0.92,
    8 x 36.0) = 288 before costs' own ÷ 3.8; ring Simple is not capped at any scale, nor a pair raised for it."""
    p = h100(8)
    assert capped_bus_bw("tree", "LL", p, 384.0, 8) == pytest.approx(8 * 36.0)
    assert capped_bus_bw("tree", "LL", p, 300.0, 8) == pytest.approx(300 * 0.92)
    assert capped_bus_bw("ring", "Simple", p, 384.0, 8, 2.0) == 384.0
    assert raised_bus_bw("tree", "LL", p, 384.0, 8, 2.0) == 0.0


def test_24_ctas_run_ring_ll128_at_the_graphs_rate_and_16_at_nccls():
    p = h100(2)
    env = {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128"}
    default = select("all_reduce", p, nccl_env(env), 64 * MiB)
    more = select("all_reduce", p, nccl_env({**env, "NCCL_MIN_CTAS": "24"}), 64 * MiB)
    assert default is not None and more is not None
    assert (default.channels, more.channels) == (16, 24)
    assert default.algbw == pytest.approx(8 * 36.7 * 16 / 30)
    assert more.algbw == pytest.approx(8 * 48.0 * 0.92 * 16 / 30)
    assert more.lat_us == pytest.approx(default.lat_us)  # NCCL's latency and choice are unchanged


def test_default_or_fewer_ctas_and_uncapped_pairs_are_left_alone():
    p = h100(2)
    ll128 = select("all_reduce", p, nccl_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128"}), 64 * MiB)
    assert ll128 is not None
    cost = Cost("ring", "LL128", ll128.lat_us, 8 * 36.7 * 16 / 30)
    assert more_ctas_algbw(cost, "all_reduce", p, 16) == 0.0
    assert more_ctas_algbw(cost, "all_reduce", p, 8) == 0.0
    assert more_ctas_algbw(Cost("ring", "Simple", 1.0, 204.8), "all_reduce", p, 24) == 0.0


def test_at_nccls_default_the_formula_is_nccls_own_rating():
    """Scale 1 restates tuning.costs: ring LL128 on 2 hosts 293.6 x 16 / 30, tree LL128 on 8 hosts 232 x 0.5."""
    for hosts, algo, ratio in ((2, "ring", 16 / 30), (8, "tree", 0.5)):
        p = h100(hosts)
        g = ring_graph(p)
        rated = {(c.algorithm, c.protocol): c.algbw for c in costs("all_reduce", p, nccl_env({}))}
        raised = raised_bus_bw(algo, "LL128", p, g.nchannels * (g.bw_intra if hosts <= 2 else g.bw_inter), 8, 1.0)
        assert rated[(algo, "LL128")] == pytest.approx(raised * ratio)
