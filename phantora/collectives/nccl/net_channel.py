"""A collective channel's network traffic: how fast one channel (one CTA and its proxy connections, over their
queue pairs) moves its ring, tree or NVLS-Tree hops to and from other hosts.

NCCL rates a multi-host ring by its search channels (8 on a host of 8 GPUs and 8 NICs: 48 GB/s each at 400G)
and runs two compute channels a search channel (connect.cc `connectRings`), four when a host has fewer than 8
GPUs: "Use 4 compute channels per search channel to reach peak BW on <8 PPN" (v2.30.7-1 src/graph/connect.cc).
So one compute channel does not move half a NIC, and two leave a 400G NIC short of its line rate. The published
runs say by how much (tests/data/nccl_tests/SOURCES.md): in nccl-tests #309 NVIDIA puts 8 x 400G at 400 GB/s and
says `NCCL_MIN_CTAS=24` (three channels a NIC) "may get you above 380". gj-aion's cluster there levels off at
320-325 GB/s busbw with its default 16 ring channels on 4 and 8 hosts (20.0-20.3 GB/s a channel) and at 391-393
with 24 (NIC-bound), and the issue's 4-host VM cluster at 365 with 16 (22.9 a channel). `COLL_NET_CHANNEL_BW`
is the middle of the two clusters' figures, (20.16 + 22.87) / 2: a measured rate, not a constant of NCCL's, as
`p2p.P2P_PER_CHANNEL_NET_BW` is this model's rate of a p2p channel. What bounds a channel (its CTA's loop, its
proxy's steps or one connection's queue pairs) the tables do not separate: every run with 24 channels also had 2
queue pairs a connection. A GPU's channels move their figure's total each way, shared by its network flows at
once (shape._channel_caps): a ring channel's one hop, or an NVLS-Tree head's tree parent and children. An
NVLS-Tree head GPU moves two channels' worth (its two trees, 43 GB/s each way on H100) whatever its CTAs: all of
them cross its one NIC (search.cc `getNvlsNetDev`, v2.26.5-1) through its one proxy thread (proxy.cc), and #309's
8-host run on 24 CTAs (`NCCL_MIN_CTAS=24`) is slower at every NVLS-Tree size (16-512 MiB; NCCL 2.26's tuner runs
the ring from 1 GiB there, tuning.rated) than the same cluster's run on 16. Like the p2p figure it is taken at the
H100's SM clock and scaled by the GPU's; on an A100 with a 200G NIC (12.5 GB/s a channel) it does not bind.
Every figure above is a Simple run's; LL and LL128 have NCCL's own per-channel rates (their tuning ceilings and
wire factors), so the limit applies to Simple only: applied to LL's wire bytes it made a 64 KiB LL all-gather on one
channel 11.9% and a broadcast 29.2% slower than NCCL's own time, with no published table to say so.
"""

from __future__ import annotations

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.channels import default_nvls_channels, nvls_heads
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.ring_kernel import REFERENCE_CLOCK_GHZ

COLL_NET_CHANNEL_BW = 21.5  # GB/s one collective channel moves to or from another host, at REFERENCE_CLOCK_GHZ
NET_CHANNEL_ALGOS = ("ring", "tree", "nvls_tree")


def coll_net_channel_bw(
    algo: str, protocol: str, p: Platform, channels: int, version: tuple[int, int] = T.MODEL_NCCL_VERSION
) -> float:
    """GB/s each way that one channel of `algo`'s decomposed flows may move across hosts (0: no limit; always for
    LL and LL128):
    `COLL_NET_CHANNEL_BW` scaled by the GPU's SM clock, times the channels a decomposed channel stands for: one
    for a ring or tree; NVLS-Tree's flows have a channel per head GPU and tree (`nvls.nvls_tree_flows`: 2 x heads)
    for NCCL's default NVLS CTAs (those of NCCL `version`: `channels.default_nvls_channels`), not the `channels`
    it runs (a head's CTAs share its NIC and proxy: above)."""
    if p.nnodes < 2 or algo not in NET_CHANNEL_ALGOS or protocol != "Simple" or channels < 1:
        return 0.0
    clock = p.sm_clock_ghz or REFERENCE_CLOCK_GHZ
    default_ctas = default_nvls_channels(p, version)
    per = default_ctas / (2.0 * nvls_heads(p)) if algo == "nvls_tree" else 1.0
    return COLL_NET_CHANNEL_BW * clock / REFERENCE_CLOCK_GHZ * per
