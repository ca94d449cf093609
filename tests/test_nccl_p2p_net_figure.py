"""A p2p channel across nodes moves NCCL's own per-channel network figure (p2p.net_links): P2P_PER_CHANNEL_NET_BW =
14 GB/s at ~2 GHz, the figure by which NCCL sizes a network peer's channels (paths.cc, v2.29.7-1), for a send/recv
as for an all-to-all (inside a node a send/recv's channel moves twice it: one NVLink). Closed forms on B200 hosts
(1.98 GHz: the figure itself) of 8 GPUs and 8 x 400G NICs, where NCCL halves a network peer's channels while 8-peer
rounds would need more than its 16 p2p channels (`ncclTopoComputeP2pChannels`): 4 channels up to 32 ranks, 2 at 64,
1 at 128; and on A100 hosts of 200G NICs (2 channels a peer, 14 x 1.41 / 1.98 = 9.97 GB/s each)."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective
from phantora.collectives.nccl import choose, platform_of, settings
from phantora.collectives.nccl.p2p import P2P_PER_CHANNEL_NET_BW, net_channel_bw, net_links
from phantora.collectives.nccl.settings import nccl_env
from phantora.topology import rail_optimized

MiB = 1 << 20
NIC_GBS = 50.0  # 400 Gb/s
OPTS = AlgoOptions(nccl_env=nccl_env({}))


def test_net_links_caps_a_channel_at_half_its_nvlink_share() -> None:
    assert net_links(1.0) == 0.5  # a send/recv: one NVLink a channel inside a node, NCCL's figure across
    assert net_links(0.75) == 0.5
    assert net_links(0.5) == 0.5  # an all-to-all: already the figure


def ring_send(nodes: int, group: tuple[tuple[int, int], ...] | None = None) -> tuple[int, float]:
    """Channels and network GB/s NCCL's model gives rank 7's 256 MiB send to rank 8 (GPU 7 of host 0 to GPU 0 of
    host 1) in sendrecv_perf's ring over `nodes` B200 hosts (every rank sends to the next and receives from the
    previous), or in `group`."""
    n = 8 * nodes
    topo = rail_optimized(nodes, 8, spines=8, nic_rate="400Gbps", gpu="b200")
    pairs = group if group is not None else tuple((i, (i + 1) % n) for i in range(n))
    got = choose(Collective("send_recv", (7, 8), 256 * MiB, "fp32", None, tuple(range(n)), pairs), topo, OPTS)
    assert got is not None
    return got.channels, got.net_bw


@pytest.mark.parametrize(("nodes", "channels"), [(8, 2), (16, 1)])
def test_the_ring_moves_nccls_per_channel_figure_a_channel(nodes: int, channels: int) -> None:
    """64 and 128 ranks: 2 and 1 channels a peer, each 14 GB/s (under the NIC): 28 and 14 GB/s (published on
    Together's use3a-ss, held out: 26.2 and 14.7 at 256 MiB)."""
    nch, bw = ring_send(nodes)
    assert nch == channels
    assert bw == pytest.approx(channels * P2P_PER_CHANNEL_NET_BW, rel=1e-9)


def test_a_send_alone_in_its_group_moves_the_same() -> None:
    """The same send with nothing else in its group: its channels are the communicator's (2 at 64 ranks), each
    NCCL's figure, 28 GB/s; not twice it (56, above the NIC)."""
    nch, bw = ring_send(8, group=((7, 8),))
    assert nch == 2
    assert bw == pytest.approx(2 * P2P_PER_CHANNEL_NET_BW, rel=1e-9)


def test_four_channels_stay_nic_bound() -> None:
    """Up to 32 ranks a peer has 4 channels: 4 x 14 = 56 GB/s, above the NIC: 50, as before."""
    nch, bw = ring_send(2)
    assert nch == 4
    assert bw == pytest.approx(NIC_GBS, rel=1e-9)


def test_a100_pairs_across_hosts_move_two_channels_of_the_figure() -> None:
    """Two A100s on two hosts (200G NICs: 2 channels a peer, ceil(25 / 14)): a lone send and a two-rank all-to-all
    each move 2 x 9.97 = 19.9 GB/s a way, under the NIC's 25 (a send moved 2 x 19.9, NIC-bound, before)."""
    topo = rail_optimized(2, 8, spines=8, nic_rate="200Gbps", gpu="a100")
    a2a = choose(Collective("all_to_all", (0, 8), 256 * MiB, "fp32"), topo, OPTS)
    lone = choose(Collective("send_recv", (0, 8), 128 * MiB, "fp32"), topo, OPTS)
    assert a2a is not None and lone is not None
    assert a2a.channels == lone.channels == 2
    per_channel = net_channel_bw(platform_of(topo, (0, 8), settings(OPTS)), "all_to_all")
    assert per_channel == pytest.approx(14.0 * 1.41 / 1.98, rel=1e-3)
    assert a2a.net_bw == pytest.approx(2 * per_channel, rel=1e-9)
    assert lone.net_bw == pytest.approx(2 * per_channel, rel=1e-9)
    assert lone.algbw == pytest.approx(2 * per_channel, rel=1e-9)
