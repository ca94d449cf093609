"""Send/recv and all-to-all as NCCL runs them: grouped point-to-point transfers to every peer at once.

NCCL has no cost model for p2p (its tuner covers the five collectives), so this one is built from its mechanics:
- all-to-all is one grouped launch of a send and a receive per peer, all in flight together (ncclAlltoAll);
- a transfer inside a node uses LL when it is small (at most 16 KiB per channel it runs on), else Simple; across
  nodes Simple (NCCL allocates no LL buffers for network p2p by default);
- latency: one launch (the ring's base latency of the protocol) and one step over the link kind, plus, across
  nodes, NCCL's network overhead (`getNetOverhead`: 1 µs, 2 on AMD hosts) for each proxy op of a transfer to or
  from a peer on another node, one per channel part and direction (`addP2pToPlan`): one proxy thread per GPU
  posts them one after another (two DGX A100s, AMD: 16 ops, 22.4 + 32 = 54.4 µs; ALCF measures 59-60 µs for
  64 B-8 KiB, NDmv4 49.75 µs at 1 KiB);
- throughput inside a node: the GPU's NVLink bandwidth in NCCL's units, shared by the peers it sends to
  at once, halved by LL's flags, and bounded by the channels at work (`addP2pToPlan` stripes a transfer over more
  of them as it grows; the distinct channels of the rank's rounds, at most its p2p channels): a send/recv's
  channel moves at most one NVLink (NCCL's per-link rate), an all-to-all's half of one (both measured:
  tests/data/nccl_tests, docs/collectives.md);
- throughput on one PCIe host (a `pcie_host`, or an NVLink host with P2P off): each pair's max-min share of the
  host's PCIe and CPU links, all of a call's transfers in flight at once (`pci_p2p.py`), times the protocol's
  share as above; a PCIe peer gets 2 channels (paths.cc);
- throughput across nodes: the NIC, and the channels the remote rounds run on. Rounds of one schedule group (8
  peers) share one channel base (`ncclP2pChannelBaseForRound`), so the 8 peers of a GPU on another node of 8 all
  run on the same nChannelsPerPeer channels (2 on an A100 with a 200G NIC), each moving NCCL's per-channel network
  figure (`net_channel_bw`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.chunking import comm_p2p_chunk, refuse_empty_chunk, step_bytes
from phantora.collectives.nccl.p2p_schedule import (
    LATEST,
    P2P_PER_BATCH,
    Version,
    pow2_up,
    send_rounds,
    transfer_channel_ids,
)
from phantora.collectives.nccl.pci_p2p import PCI_PEER_CHANNELS, group_ends, pair_rates
from phantora.collectives.nccl.pci_paths import PciHost, all_pairs
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.ring_kernel import REFERENCE_CLOCK_GHZ
from phantora.collectives.nccl.settings import NcclSettings
from phantora.collectives.nccl.tuning import Choice, comm_channels, net_overhead_us, ring_graph, running_release
from phantora.collectives.spec import Collective

if TYPE_CHECKING:
    import numpy as np

P2P_NVLINK_PEER = 32  # per-peer channel need over an NVSwitch: 2 x 18 links, power of two, at most p2pnChannels
P2P_PER_CHANNEL_NET_BW = 14.0  # GB/s one p2p channel moves over the network (NCCL_P2P_PER_CHANNEL_NET_BW)
P2P_PEERS_PER_ROUND = 8  # NCCL_MAX_DEV_WORK_P2P_PER_BATCH
LL128_SHARE = 0.92  # p2p's LL128 keeps 0.92 of the rate (NCCL's 120 of each 128 bytes)
# NVLinks (at NCCL's per-link rate) one p2p channel moves inside a host. A send/recv's channel (one CTA, its warps
# split between one send and one receive) moves one: H100 sendrecv_perf on 8 and 4 ranks runs 4 and 8 channels a
# peer at 79.5 and 149-157 GB/s, 8 at 162.5, i.e. 19.9-20.3 GB/s a channel against 20.6 a link. When a GPU sends
# to all its peers at once (all-to-all, 28 channels busy on 8 H100s) the same host measures about half a link per
# channel (302 GB/s busbw on 4 channels a peer at 256 MiB), the rate NCCL's sizing of two channels per NVLink
# implies (paths.cc `ncclTopoGetNchannels`). Sources: tests/data/nccl_tests/SOURCES.md.
P2P_LINKS_PER_CHANNEL = {"send_recv": 1.0, "all_to_all": 0.5}
LL_BY_PEER_CHANNELS = ((2, 22), (2, 29))  # NCCL releases whose p2p LL threshold counts a peer's most channels


def channel_links(k: np.ndarray | int, peers: int) -> np.ndarray | float:
    """NVLinks one p2p channel moves on a GPU with `k` peers in flight one way (a number or an array), of the `peers`
    it has: one for one peer (send/recv), half for all of them (all-to-all), linear between (nccl/p2p_group.py's
    docstring). With one peer both ends hold: a 2-rank all-to-all is a send/recv's exchange, at one link."""
    one, every = P2P_LINKS_PER_CHANNEL["send_recv"], P2P_LINKS_PER_CHANNEL["all_to_all"]
    if not hasattr(k, "shape"):  # a number: no numpy (kept off the netsim CLI's start-up)
        return one if peers <= 1 else one - (one - every) * (min(max(k, 1), peers) - 1) / (peers - 1)
    import numpy as np

    if peers <= 1:
        return np.full(np.shape(k), one)
    return one - (one - every) * (np.clip(k, 1, peers) - 1) / (peers - 1)


def net_links(links: float) -> float:
    """The share of twice NCCL's per-channel network figure (`net_channel_bw`'s send/recv rate) one p2p channel
    moves across nodes, given its `links` inside a node (`channel_links`): at most half, so a channel moves
    NCCL's own `P2P_PER_CHANNEL_NET_BW` (14 GB/s at ~2 GHz, the figure by which paths.cc sizes a network peer's
    channels, v2.29.7-1) whatever its peers. Measured (tests/data/nccl_tests): the compared A100 all-to-all's
    channels move 9.97 GB/s at 1.41 GHz, and the held-out sendrecv_perf rings over 16 B200 hosts, one channel a
    peer, 14.7 at 1.98 GHz, though there a send has its channel's whole block (its receive is another round's,
    on other channels: init.cc `ncclP2pSchedule`); inside a node a send/recv's channel moves twice that (one
    NVLink)."""
    return min(links, P2P_LINKS_PER_CHANNEL["all_to_all"])


def p2p_total(comm_channels: int, st: NcclSettings) -> int:
    """The communicator's p2p channels (paths.cc `ncclTopoComputeP2pChannels`, v2.18.5-1 to v2.30.7-1): its
    channels capped at NCCL_MAX_P2P_NCHANNELS, then raised to NCCL_MIN_P2P_NCHANNELS (the least wins), pow2Up,
    at most MAXCHANNELS (the channels a kernel's arguments hold: `ncclDevMaxChannelsForArgsBytes`)."""
    wanted = max(min(comm_channels, st.max_p2p_channels), st.min_p2p_channels)
    return min(pow2_up(wanted), T.MAX_CHANNELS)


def p2p_channel_range(p: Platform, total: int, net_peer: int = 0) -> tuple[int, int]:
    """NCCL's nChannelsMin and nChannelsMax of one transfer on `total` p2p channels (`p2p_total`). The most is the
    per-peer need, pow2Up (NVLink: 32; PCIe: 2; network: one per 14 GB/s of NIC, then halved while the peers of one
    batch round, 8 per round, would need more than the p2p channels: paths.cc), at most the p2p channels; the least is
    it halved while all peers at once would (enqueue.cc). `net_peer` (NCCL_NCHANNELS_PER_NET_PEER) replaces the
    network's need and, set by the user, is not halved for the rounds, only capped at the p2p channels."""
    if p.nnodes == 1:  # paths.cc ncclTopoGetNchannels: 2 x the NVLinks to an NVLink peer, 2 to a PCIe one
        most = min(P2P_NVLINK_PEER if p.intra == "nvlink" else PCI_PEER_CHANNELS, total)
    elif net_peer:
        most = min(pow2_up(min(net_peer, P2P_NVLINK_PEER) if p.ppn > 1 else net_peer), total)
    else:
        most = 1 << max(0, math.ceil(p.nic_bw / P2P_PER_CHANNEL_NET_BW) - 1).bit_length()
        while most > 1 and most * math.ceil(p.nranks / P2P_PEERS_PER_ROUND) > total:
            most //= 2
    least = most
    while least > 1 and least * p.nranks > total:
        least //= 2
    return least, most


def transfer_channels(nbytes: int, least: int, most: int, min_part: int, max_part: int) -> int:
    """Channels NCCL stripes one transfer of `nbytes` over (`addP2pToPlan`): at least one part of `min_part` each,
    up to `least`; doubled, up to `most`, while a part would exceed `max_part`."""
    n = max(1, min(least, math.ceil(nbytes / max(1, min_part))))
    part = max(min_part, math.ceil(nbytes / n))
    while part > max_part and n <= most // 2:
        n *= 2
        part = math.ceil(nbytes / n)
    return n


@dataclass(frozen=True)
class TransferLayout:
    """How a communicator cuts its p2p transfers into channel parts (enqueue.cc `addP2pToPlan`): its p2p channels,
    a transfer's least and most channels, and the smallest and largest part."""

    total: int
    least: int
    most: int
    min_part: int
    max_part: int

    def channels(self, nbytes: int) -> int:
        """The channels a transfer of `nbytes` runs on (`transfer_channels`)."""
        return transfer_channels(nbytes, self.least, self.most, self.min_part, self.max_part)


def transfer_layout(on: Platform, st: NcclSettings, moves: bool = True) -> TransferLayout:
    """The p2p layout of communicator `on` (`moves`: some transfer has bytes, so an empty chunk is refused)."""
    chunk = comm_p2p_chunk(on, st)
    if moves:  # p2pChunkSize = min(its chunk, buffSize / NCCL_STEPS): NCCL's part sizes divide by it
        refuse_empty_chunk(chunk, "a send/recv's p2p chunk", "Simple", st)
    min_part, max_part = (chunk // 8, chunk * 32) if on.nnodes == 1 else (chunk // 2, chunk)
    total = p2p_channels(on, st)
    least, most = p2p_channel_range(on, total, st.net_peer_channels)
    return TransferLayout(total, least, most, min_part, max_part)


def auto_protocol(intra: bool, nbytes: int, nch: int) -> str:
    """NCCL's protocol for a transfer of `nbytes` on `nch` channels: LL inside a node up to 16 KiB a channel, else
    Simple."""
    return "LL" if intra and nbytes <= nch * T.P2P_LL_THRESHOLD else "Simple"


def auto_plan(layout: TransferLayout, on: Platform, st: NcclSettings, intra: bool, nbytes: int) -> tuple[str, int]:
    """NCCL's protocol and channels for a transfer of `nbytes` on communicator `on` (enqueue.cc `addP2pToPlan`).
    From 2.29 (v2.29.2-1 .. v2.30.7-1) the channels come from Simple's part sizes, then LL if at most 16 KiB a
    channel (`auto_protocol`; before 2.22 each part of at most 16 KiB took LL, taken as the same). 2.22 - 2.28
    (v2.22.3-1 .. v2.28.9-1) took LL up to 16 KiB for each channel a peer may have (`thresholdLL =
    nChannelsMax * P2P_LL_THRESHOLD`, nChannelsMax = p2pnChannelsPerPeer: `layout.most`), then cut the parts by
    LL's step (its buffer over NCCL_STEPS) instead of the p2p chunk."""
    if LL_BY_PEER_CHANNELS[0] <= st.nccl_version < LL_BY_PEER_CHANNELS[1]:
        if intra and nbytes <= layout.most * T.P2P_LL_THRESHOLD:
            step = step_bytes("LL", st)
            lo, hi = (step // 8, step * 32) if on.nnodes == 1 else (step // 2, step)
            return "LL", transfer_channels(nbytes, layout.least, layout.most, lo, hi)
        return "Simple", layout.channels(nbytes)
    nch = layout.channels(nbytes)
    return auto_protocol(intra, nbytes, nch), nch


@lru_cache(maxsize=1024)
def channels_at_work(
    p: Platform, parts: int, p2p_total: int, remote: bool, v: Version = LATEST, group: int = P2P_PER_BATCH
) -> int:
    """The distinct p2p channels one rank's transfers of `parts` parts each run on, to its peers on other nodes
    (`remote`) or on its own, by NCCL `v`'s round schedule (`p2p_schedule.transfer_channel_ids`; `group`:
    NCCL_P2P_SCHEDULE_GROUP_SIZE), for nodes of `p.ppn` ranks in order."""
    nodes = tuple(i // p.ppn for i in range(p.nranks))
    used: set[int] = set()
    for dst in send_rounds(nodes, 0, v, group):
        if dst != 0 and (nodes[dst] != nodes[0]) == remote:
            used.update(transfer_channel_ids(nodes, 0, dst, parts, p2p_total, v, group))
    return len(used)


def net_channel_bw(p: Platform, kind: str) -> float:
    """GB/s one p2p channel moves over the network each way: NCCL's P2P_PER_CHANNEL_NET_BW (14 GB/s, by which
    NCCL 2.29+ sizes a peer's network channels: paths.cc), taken at the ~2 GHz SM clock of the GPUs it was set for
    (Hopper, Blackwell; `REFERENCE_CLOCK_GHZ`) and scaled by this GPU's, a channel being one CTA's copy loop (9.97
    GB/s on an A100 at 1.41 GHz). An all-to-all's channel splits its warps between a send and a receive; a
    send/recv's figure is twice it, as inside a node (`P2P_LINKS_PER_CHANNEL`), but across nodes a channel moves
    at most the all-to-all's (`net_links`)."""
    clock = p.sm_clock_ghz or REFERENCE_CLOCK_GHZ
    ratio = P2P_LINKS_PER_CHANNEL[kind] / P2P_LINKS_PER_CHANNEL["all_to_all"]
    return P2P_PER_CHANNEL_NET_BW * clock / REFERENCE_CLOCK_GHZ * ratio


def p2p_channels(p: Platform, st: NcclSettings) -> int:
    """The communicator's p2p channels (NCCL's p2pnChannels, `p2p_total`)."""
    return p2p_total(comm_channels(p, ring_graph(p), st), st)


def p2p_choice(
    coll: Collective,
    p: Platform,
    st: NcclSettings,
    protocol: str = "auto",
    comm: Platform | None = None,
    nodes: tuple[int, ...] = (),
    inflight: tuple[tuple[int, int], ...] = (),
    inflight_at: dict[tuple[int, int], tuple[int, int]] | None = None,
    shm: dict[tuple[int, int], float] | None = None,
) -> Choice:
    """The protocol, channels, latency and per-peer throughput of a send/recv or an all-to-all. `comm`: the
    platform of the communicator a grouped send/recv runs on (its channels per peer are the communicator's);
    None: the call's own ranks. `nodes`: the topology node of each rank, which keys the pairs' rates on a PCIe
    host (`Choice.pair_bw`). `inflight`: a grouped send/recv's transfers as positions in `comm`'s PCIe host, its
    own first, which share that host's links with it (one NCCL group); (): it alone. `inflight_at`: the (start
    offset ns, bytes) of those pairs that start at another time than it or move other bytes (`group_ends`); the
    others start with it and move its bytes, all in flight at once as in nccl-tests' sendrecv_perf. `shm`: the
    GB/s of the pairs over the hosts' PCIe and CPU links on NCCL nodes of NVLink hosts with P2P off (positions in
    the call's ranks, `node_p2p.py`: SHM pairs inside a node, NET pairs' x16 legs), which set those pairs' rates;
    the NET pairs' network part is the NIC's."""
    peers = 1 if coll.kind == "send_recv" else p.nranks - 1
    per_peer = coll.nbytes if coll.kind == "send_recv" else coll.nbytes // p.nranks
    intra = p.nnodes == 1
    on = comm or p  # the communicator sets the chunk, the part sizes and the channels (init.cc, enqueue.cc)
    layout = transfer_layout(on, st, per_peer > 0)
    total = layout.total
    if protocol == "auto":
        protocol, nch = auto_plan(layout, on, st, intra, per_peer)
    else:
        nch = layout.channels(per_peer)

    def at_work(remote: bool) -> int:  # a send/recv has one peer: its own channels are all at work
        if coll.kind != "all_to_all":
            return nch
        return channels_at_work(on, nch, total, remote, running_release(st), st.p2p_sched_group)

    if protocol == "LL" and per_peer > 0:
        refuse_empty_chunk(step_bytes("LL", st) // 2, "a send/recv's LL step", "LL", st)
    pi = T.PROTOCOLS.index(protocol)
    hw = (p.intra if p.intra == "nvlink" else "pci") if intra else "net"
    lat = T.BASE_LAT["ring"][pi] + T.HW_LAT[hw]["ring"][pi]
    if not intra:  # the proxy posts one op per part and direction of each remote transfer in turn (addP2pToPlan)
        remote = 1 if coll.kind == "send_recv" else p.nranks - p.ppn
        lat += 2 * remote * nch * net_overhead_us(p, st)
    local_peers = min(peers, p.ppn - 1)
    bw = p.gpu_intra_bw
    links = float(channel_links(peers, peers))  # a channel's NVLinks with all its peers in flight: 1 or 1/2 (n > 2)
    if intra and p.intra == "nvlink":  # the channels at work, each one or half an NVLink (measured)
        bw = min(bw, at_work(False) * T.NVLINK_BW_PER_LINK[p.arch] * links)
    net_bw = 0.0 if intra else at_work(True) * net_channel_bw(p, "send_recv") * net_links(links)
    nic = min(p.nic_bw, net_bw) if p.nic_bw else net_bw
    raw = bw
    if protocol == "LL":
        bw = min(bw * 0.5, T.LL_MAX_BW[p.arch][0])
    elif protocol == "LL128":
        bw *= LL128_SHARE
    peer_bw = bw / local_peers if local_peers > 0 else 0.0
    if shm:  # SHM pairs inside NCCL nodes of NVLink hosts with P2P off: their shares of the host's links
        rates = {pair: r * bw / raw for pair, r in shm.items()}  # the protocol's share
        slowest = min(rates.values())
        t_ns = per_peer / slowest
        if coll.kind == "all_to_all" and nic and p.nranks > p.ppn:  # the remote blocks through the NIC
            t_ns = max(t_ns, (p.nranks - p.ppn) / p.nranks * coll.nbytes / nic)
        elif not intra and nic:  # a NET send/recv: its x16 share and its network channels
            t_ns = max(t_ns, coll.nbytes / nic)
        algbw = coll.nbytes / t_ns if t_ns > 0 else slowest
        keyed = tuple((nodes[i], nodes[j], r) for (i, j), r in rates.items()) if nodes else ()
        return Choice("p2p", protocol, nch, lat, algbw, lat + t_ns / 1000.0, slowest, pair_bw=keyed, net_bw=net_bw)
    if intra and p.pci is not None:  # a PCIe host's pairs: their links' max-min shares (pci_p2p.py)
        pairs = [(0, 1)] if coll.kind == "send_recv" else all_pairs(p.pci)
        rates = {pair: r * bw / raw for pair, r in pair_rates(p.pci, pairs).items()}  # the protocol's share
        if inflight and comm is not None and comm.pci is not None:  # its group's pairs share the host's links
            rates = {(0, 1): _group_rate(comm.pci, inflight, inflight_at or {}, per_peer) * bw / raw}
        slowest = min(rates.values())
        t_ns = max(per_peer / r for r in rates.values())
        algbw = coll.nbytes / t_ns if t_ns > 0 else slowest
        keyed = tuple((nodes[i], nodes[j], r) for (i, j), r in rates.items()) if nodes else ()
        return Choice("p2p", protocol, nch, lat, algbw, lat + t_ns / 1000.0, slowest, pair_bw=keyed)
    if coll.kind == "all_to_all":  # each rank sends (ppn - 1) blocks over NVLink and (n - ppn) over its NIC
        n = p.nranks
        t_ns = max((p.ppn - 1) / n / bw, (n - p.ppn) / n / nic if nic else 0.0) * coll.nbytes
    else:
        t_ns = coll.nbytes / (bw if intra else nic or bw)
    algbw = coll.nbytes / t_ns if t_ns > 0 else bw
    return Choice("p2p", protocol, nch, lat, algbw, lat + t_ns / 1000.0, peer_bw, net_bw=net_bw)


def _group_rate(
    h: PciHost, inflight: tuple[tuple[int, int], ...], at: dict[tuple[int, int], tuple[int, int]], nbytes: int
) -> float:
    """The GB/s the first pair of `inflight` moves on average in its group: its share while all are in flight, or
    its bytes over its time in the group's schedule when the pairs start apart or differ in size (`group_ends`)."""
    own = inflight[0]
    if not at:
        return pair_rates(h, list(inflight))[own]
    starts = {p: float(at.get(p, (0, nbytes))[0]) for p in inflight}
    sizes = {p: float(at.get(p, (0, nbytes))[1]) for p in inflight}
    starts[own], sizes[own] = 0.0, float(nbytes)
    end = group_ends(lambda running: pair_rates(h, running), starts, sizes)[own]
    return nbytes / end if end > 0 else pair_rates(h, list(inflight))[own]
