"""NCCL's model across several hosts against closed forms written out by hand from NCCL 2.30's tuning.cc tables
(baseLat, hwLat, perChMaxTreeLL128Bw, perChMaxNVLSTreeBw, treeCorrectionFactor, nvlsEfficiency) and its p2p
channel rules: the latency sum of a multi-node ring, the size where NCCL's model turns from the tree to NVLS-Tree,
and an all-to-all's channels per peer across hosts."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective
from phantora.collectives.nccl import choose, platform_of
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.collectives.nccl.tuning import costs, select
from phantora.errors import InputError
from phantora.topology import rail_optimized
from phantora.topology.model import Topology

MiB = 1 << 20


def hosts(n: int) -> Topology:
    """n H100 hosts of 8 GPUs, a 400G NIC per GPU on its rail."""
    return rail_optimized(n, 8, spines=8, nic_rate="400Gbps", gpu="h100")


@pytest.mark.parametrize(
    ("proto", "base", "nvlink_step", "net_step"),
    [("LL128", 14.0, 1.9, 4.0), ("Simple", 8.4, 3.4, 14.0), ("LL", 6.6, 1.0, 2.7)],
)
def test_ring_all_gather_over_ten_hosts_sums_nccls_per_step_latencies(proto, base, nvlink_step, net_step):
    """80 ranks on 10 hosts: 79 steps, of which nNodes - 1 = 9 cross the network (hwLat NET ring) and 70 stay on
    NVLink at max(hwLat NVLINK ring, the proxy's 1 µs net overhead, x3 for Simple): LL 6.6 + 70 x max(0.6, 1.0)
    + 9 x 2.7, LL128 14 + 70 x 1.9 + 9 x 4.0, Simple 8.4 + 70 x max(3.4, 3.0) + 9 x 14."""
    p = platform_of(hosts(10), tuple(range(80)))
    ring = [c for c in costs("all_gather", p, settings_from_env({})) if c.algorithm == "ring" and c.protocol == proto]
    assert len(ring) == 1
    assert ring[0].lat_us == pytest.approx(base + 70 * nvlink_step + 9 * net_step)


def test_eight_hosts_turn_from_tree_ll128_to_nvls_tree_where_nccls_times_meet():
    """64 ranks on 8 hosts (NCCL's index2 = 2, "N4" columns). Tree/LL128: 14 + 2 x (7 x 1.25 + log2(8) x 8.5) =
    82.5 µs; 8 channels x 48 GB/s, min(x 0.92, 8 x 36.0) then min(x 120/128, 8 x 29.0) = 232, x 0.5 = 116 GB/s,
    x treeCorrectionFactor 0.9 (LL128, 8-32 MiB). NVLS-Tree/Simple: 25 + 2 x 3 x 20.9 = 150.4 µs; 8 channels x
    min(40 x 0.85 x 7/8 x 2, 48, 45.5) x 64/126 GB/s. The times meet near 15.5 MiB: the tree below, NVLS-Tree
    above (the published 8-host tables dip at 8 MiB, below that size: not a switch of NCCL's model)."""
    p = platform_of(hosts(8), tuple(range(64)))
    st = settings_from_env({})
    tree_lat, tree_bw = 14.0 + 2 * (7 * 1.25 + 3 * 8.5), 116.0 * 0.9
    nvls_lat, nvls_bw = 25.0 + 2 * 3 * 20.9, 8 * min(40 * 0.85 * 7 / 8 * 2, 48.0, 45.5) * 64 / 126
    cross = (nvls_lat - tree_lat) / (1 / (1000 * tree_bw) - 1 / (1000 * nvls_bw))
    assert 8 * MiB < cross < 32 * MiB  # where the correction factor is 0.9 on both sides
    below, above = select("all_reduce", p, st, int(cross * 0.97)), select("all_reduce", p, st, int(cross * 1.03))
    assert below is not None and above is not None
    assert (below.algorithm, below.protocol) == ("tree", "LL128")
    assert (above.algorithm, above.protocol) == ("nvls_tree", "Simple")
    assert cross / MiB == pytest.approx(15.5, abs=0.1)


def a100_hosts(n: int) -> Topology:
    """n DGX A100 hosts, a 200G NIC per GPU on its rail, AMD EPYC CPUs."""
    topo = rail_optimized(n, 8, spines=8, nic_rate="200Gbps", gpu="a100")
    topo.meta["cpu"] = "AMD EPYC 7742"
    return topo


@pytest.mark.parametrize(
    ("topo", "ranks", "size", "channels"),
    [
        (a100_hosts(2), 16, 2 * MiB, 1),  # 128 KiB a peer: one part of at most the 128 KiB chunk
        (a100_hosts(2), 16, 2 * MiB + 16 * 8, 2),  # just over 128 KiB a peer: split in two, up to the most (2)
        (a100_hosts(2), 16, 1 << 30, 2),  # never more than the most
        (hosts(10), 80, 1 << 30, 1),  # 80 peers: the most halves from 4 to 1
    ],
)
def test_all_to_all_channels_per_peer_across_hosts(topo, ranks, size, channels):
    """NCCL's p2p channels across nodes (paths.cc, enqueue.cc): the most per peer is pow2Up(ceil(NIC GB/s / 14)),
    halved while (peers per 8-peer round) x most exceeds the 16 p2p channels (pow2Up of 16 comm channels); a
    transfer takes one channel per 128 KiB part (NCCL_P2P_NET_CHUNKSIZE) past the least, doubling up to the most.
    200G (25 GB/s): ceil(25/14) = 2, 2 rounds x 2 <= 16, so 2; the least is 1 (16 peers x 2 > 16). 400G with 80
    ranks: ceil(50/14) = 4 -> 10 rounds x 4 > 16 -> 2 -> 20 > 16 -> 1."""
    choice = choose(Collective("all_to_all", tuple(range(ranks)), size, "bf16"), topo, AlgoOptions())
    assert choice.algorithm == "p2p" and choice.protocol == "Simple"
    assert choice.channels == channels


def test_nchannels_per_net_peer_sets_the_network_peers_channels_without_the_rounds_halving():
    """NCCL_NCHANNELS_PER_NET_PEER=4 on 80 H100 ranks: NCCL takes it as the network need (pow2Up 4) and, set by the
    user, does not halve it for the 10 rounds of 8 peers (paths.cc), so a 1 GiB all-to-all (13.4 MB a peer, past the
    128 KiB chunk) stripes each peer over 4 channels where the default runs 1; 0 or less is ignored, as NCCL does."""
    ranks = tuple(range(80))
    coll = Collective("all_to_all", ranks, 1 << 30, "bf16")
    four = choose(coll, hosts(10), AlgoOptions(nccl_env=nccl_env({"NCCL_NCHANNELS_PER_NET_PEER": "4"})))
    ignored = choose(coll, hosts(10), AlgoOptions(nccl_env=nccl_env({"NCCL_NCHANNELS_PER_NET_PEER": "0"})))
    assert (four.channels, ignored.channels) == (4, 1)
    with pytest.raises(InputError, match="NCCL_NCHANNELS_PER_NET_PEER"):
        settings_from_env({"NCCL_NCHANNELS_PER_NET_PEER": "four"})


def test_ten_host_ring_all_gather_turns_from_ll128_to_simple_where_nccls_times_meet():
    """80 ranks on 10 hosts: the ring graph is 8 channels x 48 GB/s (8 NICs at 50, one channel each; no doubling at
    48 < 50 with more than 4 channels). Ring/LL128: 14 + 70 x 1.9 + 9 x 4.0 = 183 µs, min(8 x 48 x 0.92, 8 x 36.7)
    x 80/79 GB/s; Ring/Simple: 8.4 + 70 x 3.4 + 9 x 14 = 372.4 µs, 8 x 48 x 80/79. They meet near 228 MiB, between
    the published 128 and 256 MiB points of the 10-host cluster, whose time there doubles (840.85 -> 1765.69 µs)
    where 64 -> 128 MiB added 104 µs: its NCCL changed protocol in the same interval."""
    p = platform_of(hosts(10), tuple(range(80)))
    st = settings_from_env({})
    ll128_lat, ll128_bw = 14.0 + 70 * 1.9 + 9 * 4.0, min(8 * 48 * 0.92, 8 * 36.7) * 80 / 79
    simple_lat, simple_bw = 8.4 + 70 * 3.4 + 9 * 14.0, 8 * 48 * 80 / 79
    cross = (simple_lat - ll128_lat) / (1 / (1000 * ll128_bw) - 1 / (1000 * simple_bw))
    assert cross / MiB == pytest.approx(228.0, abs=1.0)
    for kind in ("all_gather", "reduce_scatter"):
        below, above = select(kind, p, st, int(cross * 0.98)), select(kind, p, st, int(cross * 1.02))
        assert below is not None and above is not None
        assert (below.algorithm, below.protocol, above.algorithm, above.protocol) == ("ring", "LL128", "ring", "Simple")
    published = {64: 736.65, 128: 840.85, 256: 1765.69}  # µs, h100_80gpu_10node_..._all_gather_xxrjuncluster01.csv
    assert published[256] - published[128] > 8 * (published[128] - published[64])
