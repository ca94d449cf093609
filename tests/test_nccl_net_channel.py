"""A collective channel's network traffic (phantora/collectives/nccl/net_channel.py): a GPU's channels move at most
COLL_NET_CHANNEL_BW (21.5 GB/s on H100) each across hosts, each way, shared by its queue pairs and its flows at
once, so a multi-host ring of 16 channels levels off at 16 x 21.5 = 344 GB/s busbw, 24 channels (three a 400G
NIC) reach the NICs, and an NVLS-Tree head GPU moves at most 2 x 21.5 = 43 GB/s each way, on 16 CTAs or 24."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import platform_of
from phantora.collectives.nccl.net_channel import COLL_NET_CHANNEL_BW, coll_net_channel_bw
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host, rail_optimized
from phantora.topology.model import Topology

GiB = 1 << 30


def h100_hosts(n: int) -> Topology:
    """n H100 hosts of 8 GPUs, a 400G NIC per GPU on its rail."""
    return rail_optimized(n, 8, spines=8, nic_rate="400Gbps", gpu="h100")


def ring(topo: Topology, nbytes: int, env: dict[str, str], algo: str = "Ring") -> tuple[list, float]:
    """The flows of an all-reduce over every GPU of `topo` under `env` and NCCL_ALGO=`algo`, and its busbw."""
    coll = Collective("all_reduce", tuple(range(topo.num_ranks)), nbytes, "fp32")
    dag = decompose(coll, topo, AlgoOptions(nccl_env=nccl_env({"NCCL_ALGO": algo, **env})))
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return dag.flows, nbytes / max(c.end_ns for c in sim.drain()) * coll.busbw_factor()


def crossing(topo: Topology, flows: list) -> list:
    return [f for f in flows if f.size and topo.shared_nvswitch(f.src, f.dst) is None]


def test_the_rate_is_the_figure_at_the_h100_clock_scaled_by_the_sm_clock_and_none_inside_a_host():
    """H100 SXM (1.98 GHz): 21.5 GB/s; an A100 (1.41 GHz): 21.5 x 1.41 / 1.98 = 15.31; one host: no limit.
    NVLS-Tree's flows stand for 2 of NCCL's 16 default CTAs per head GPU of 8, whatever CTAs run: 24 CTAs share
    the same 21.5 each (a head's CTAs share its NIC and proxy)."""
    h100 = platform_of(h100_hosts(2), tuple(range(16)))
    a100 = platform_of(rail_optimized(2, 8, spines=8, nic_rate="200Gbps", gpu="a100"), tuple(range(16)))
    assert coll_net_channel_bw("ring", "Simple", h100, 16) == pytest.approx(21.5)
    assert coll_net_channel_bw("ring", "Simple", a100, 16) == pytest.approx(21.5 * 1.41 / 1.98, rel=1e-3)
    assert coll_net_channel_bw("nvls_tree", "Simple", h100, 24) == pytest.approx(21.5)
    assert coll_net_channel_bw("nvls_tree", "Simple", h100, 16) == pytest.approx(21.5)
    assert coll_net_channel_bw("ring", "Simple", platform_of(dgx_host(8, gpu="h100"), tuple(range(8))), 24) == 0.0
    assert COLL_NET_CHANNEL_BW == 21.5
    assert coll_net_channel_bw("ring", "LL", h100, 16) == coll_net_channel_bw("tree", "LL128", h100, 16) == 0.0


def test_ll_keeps_nccls_own_rate_across_hosts():
    """The figure is measured on Simple runs; LL's network hops keep NCCL's own per-channel rate (its LL ceiling),
    not 21.5 GB/s of wire bytes: a 64 KiB LL ring all-reduce on 2 hosts caps no flow at 172 Gb/s, a Simple one
    caps every network flow there."""
    topo = h100_hosts(2)
    ll, _ = ring(topo, 64 * 1024, {"NCCL_PROTO": "LL"})
    simple, _ = ring(topo, 64 * 1024, {"NCCL_PROTO": "Simple"})
    cap = round(21.5 * 8e9)
    assert all(f.rate_bps != cap for f in crossing(topo, ll))
    assert {f.rate_bps for f in crossing(topo, simple)} == {cap}


def test_each_network_connection_is_capped_and_queue_pairs_share_it():
    """4 hosts, ring all-reduce of 1 GiB: each of the 16 channels' network hops (4 hosts x 16 = 64 flows, one a
    channel and host) is capped at 21.5 GB/s = 172 Gb/s; with 2 queue pairs a connection each carries half."""
    topo = h100_hosts(4)
    one, _ = ring(topo, GiB, {})
    net = crossing(topo, one)
    assert len(net) == 64
    assert all(f.rate_bps == round(21.5 * 8e9) for f in net)
    two, _ = ring(topo, GiB, {"NCCL_IB_QPS_PER_CONNECTION": "2"})
    assert {f.rate_bps for f in crossing(topo, two)} == {round(21.5 * 8e9 / 2)}


def test_sixteen_channels_level_off_at_sixteen_channel_rates_and_twenty_four_reach_the_nics():
    """8 GiB on 4 hosts: a ring all-reduce moves 2 (n-1)/n of the buffer over each channel's network hop, so 16
    channels at 21.5 GB/s give busbw <= 16 x 21.5 = 344 GB/s (the ring's latency and passes take a little more);
    with NCCL_MIN_CTAS=24 three channels share each NIC (64.5 GB/s > 50), so the NIC's share of NCCL's rating
    bounds it instead: more than 344, at most 8 NICs x 50 = 400."""
    topo = h100_hosts(4)
    _, sixteen = ring(topo, 8 * GiB, {})
    assert 0.97 * 344 < sixteen <= 344
    _, twenty_four = ring(topo, 8 * GiB, {"NCCL_MIN_CTAS": "24"})
    assert 344 < twenty_four <= 400


def per_gpu_caps(flows: list, end: str) -> dict[int, tuple[float, int, int]]:
    """Each GPU's network flows out of it (`end` "src") or into it ("dst"): (sum of caps, flows, bytes)."""
    out: dict[int, tuple[float, int, int]] = {}
    for f in flows:
        g = getattr(f, end)
        cap, n, b = out.get(g, (0.0, 0, 0))
        out[g] = (cap + f.rate_bps, n + 1, b + f.size)
    return out


def test_an_nvls_tree_head_moves_its_two_channels_worth_each_way_shared_by_its_tree_hops():
    """8 hosts, NVLS-Tree all-reduce of 2 GiB on 16 CTAs: a head GPU runs 2 of them (one a tree), so its network
    flows at once (to and from its tree parents and children) share 2 x 21.5 = 43 GB/s = 344 Gb/s each way by
    bytes (each flow the lower of its sender's and its receiver's share): the caps out of any GPU, and into any,
    add up to at most 344 Gb/s (plus rounding), the busiest reach it, and the call takes at least the busiest
    GPU's bytes over 43 GB/s. With 24 CTAs the head's figure stays 43 GB/s (its CTAs share its one NIC and proxy):
    no GPU's caps pass 344 Gb/s."""
    topo = h100_hosts(8)
    size = 2 * GiB
    flows, bus = ring(topo, size, {}, algo="NVLSTree")
    net = crossing(topo, flows)
    limit = 2 * 21.5 * 8e9
    for end in ("src", "dst"):
        caps = per_gpu_caps(net, end)
        assert len(caps) == 64  # every GPU heads its local index's trees
        assert all(cap <= limit + n for cap, n, _ in caps.values())
        assert max(cap for cap, _, _ in caps.values()) >= limit
    busiest = max(b for _, _, b in per_gpu_caps(net, "src").values())
    assert size / (busiest / 43.0) * 2 * 63 / 64 >= bus  # algbw <= size / (busiest / 43 GB/s), as busbw
    wide, _ = ring(topo, size, {"NCCL_MIN_CTAS": "24"}, algo="NVLSTree")
    wide_caps = per_gpu_caps(crossing(topo, wide), "src").values()
    assert all(cap <= limit + n for cap, n, _ in wide_caps)
    assert max(cap for cap, _, _ in wide_caps) >= limit


def test_a100_hosts_of_200g_keep_nccls_rate_below_the_channel_limit():
    """2 DGX A100 hosts of 200G NICs, ring all-reduce of 1 GiB: NCCL's ring graph is 8 channels x 24 GB/s, algbw
    192 x 16 / 30 = 102.4 GB/s, run on 16 channels, each network hop carrying 30/16 of S/16 in S / 102.4: 12 GB/s,
    under the A100's channel limit of 21.5 x 1.41 / 1.98 = 15.31 GB/s, so every network flow keeps NCCL's rate
    (the end-to-end A100 rows are not moved)."""
    topo = rail_optimized(2, 8, spines=8, nic_rate="200Gbps", gpu="a100")
    flows, _ = ring(topo, GiB, {})
    net = crossing(topo, flows)
    assert net
    assert all(f.rate_bps == pytest.approx(12.0 * 8e9, rel=1e-3) for f in net)
