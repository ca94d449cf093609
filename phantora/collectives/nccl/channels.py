"""A communicator's channels: the ring graph NCCL's search finds, `comm->nChannels`, `comm->nvlsChannels`, and the
channels NCCL 2.22+ deals a collective over (enqueue.cc `scheduleCollTasksToPlan`, v2.22.3-1 to v2.30.7-1).

`scheduleCollTasksToPlan` keeps two counts apart. A collective's budget per channel is its traffic over the
channels its algorithm runs (the task's `nMaxChannels`, which `topoGetAlgoInfo` lowers for small sizes; the plan's
`nChannels[kind]`, at most the communicator's), but the parts go on the COMMUNICATOR's channels of its kind,
`nMaxChannels[kind]`: `comm->nChannels` for ring, tree and PAT, `comm->nvlsChannels` for NVLS and NVLS-Tree
(v2.29.2-1 on: min(nChannels, nvlsChannels) for NVLS with CollNet, across nodes, which the model does not run).
A split that needs more parts than the algorithm's channels uses the communicator's next ones; only past the
communicator's last does the rest pile onto that last one, and a communicator of one channel puts the whole
count on it. NCCL_MIN_NCHANNELS / NCCL_MAX_NCHANNELS (and the CTA bounds) set `comm->nChannels` (connect.cc);
the NVLS CTAs are clamped to [minCTAs, maxCTAs] (nvls.cc).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from phantora.collectives.nccl import pci_paths
from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings

NVLS_ALGORITHMS = ("nvls", "nvls_tree")  # the tasks enqueue.cc counts as isNvls


@dataclass(frozen=True)
class Graph:
    """A channel graph: how many channels, and the bandwidth of each inside a node and across nodes (GB/s)."""

    nchannels: int
    bw_intra: float
    bw_inter: float


@lru_cache(maxsize=256)
def ring_graph(p: Platform) -> Graph:
    """The ring (and tree) graph: the per-channel bandwidth that carries the most in total, then duplicated."""
    return _duplicated(*_found(p), p)


def found_channels(p: Platform) -> int:
    """The ring graph's channels as the search found them, before `ncclTopoDupChannels` (whose copies, channel
    g + found of channel g, run g's chain: `tree_channels.chain_of`)."""
    return _found(p)[0]


def found_speed(p: Platform) -> float:
    """The GB/s of each channel the ring search found (before `ncclTopoDupChannels` halves doubled ones)."""
    return _found(p)[1]


@lru_cache(maxsize=256)
def _found(p: Platform) -> tuple[int, float]:
    """(channels, GB/s each) of the search's first pass: the per-channel speed that carries the most in total."""
    speeds = _speeds(p)
    if p.pci is not None:  # a described PCIe host: the search over its links (sockets, CPU link, SHM diversions)
        return pci_paths.ring_search(p.pci, speeds, T.RING_GRAPH_MAX_CHANNELS)
    best = (0, 0.0)
    for s in speeds:
        if p.node_bw and best[0] and s / best[1] <= pci_paths.SEARCH_STEP_DOWN:
            break  # ncclTopoCompute lowers the speed only while above .49 of the best found (NCCL nodes over PCIe)
        if p.nnodes == 1:
            n = math.floor(p.gpu_intra_bw / s + 1e-9) if s <= p.gpu_intra_bw else 0
        else:
            n = p.nics_per_node * math.floor(p.nic_bw / s + 1e-9) if s <= p.nic_bw else 0
            if p.node_bw:  # an NVLink host, or its socket, over SHM, its NICs beside its GPUs (net_split.py)
                n = min(n, math.floor(p.node_bw / s + 1e-9))
            elif p.ppn > 1:  # a channel crosses the node on NVLink: every GPU but the last forwards it once
                n = min(n, math.floor(p.gpu_intra_bw / (s * (p.ppn - 1) / p.ppn) + 1e-9))
        n = min(n, T.RING_GRAPH_MAX_CHANNELS)
        if n * s > best[0] * best[1] + 1e-9:
            best = (n, s)
    n, s = best
    if n == 0:
        n, s = 1, speeds[-1]
    return n, s


@lru_cache(maxsize=256)
def link_graph(p: Platform) -> Graph:
    """The ring graph at the rate its kernel moves data: `ring_graph`'s, except on a PCIe host where NCCL's search
    found no ring. There NCCL's one channel of 0.1 GB/s is what its tuner rates (`ring_graph`: the choice and
    NCCL's model time), while the copy runs at what the host's links allow that ring (`pci_paths.link_ring`)."""
    if p.pci is None:
        return ring_graph(p)
    return _duplicated(*pci_paths.link_ring(p.pci, _speeds(p), T.RING_GRAPH_MAX_CHANNELS), p)


def search_fallback(p: Platform) -> bool:
    """Whether NCCL's ring search on `p` fell back to its one channel of 0.1 GB/s (a PCIe host where no ring fits
    at any speed): `ring_graph` is then NCCL's tuning figure, `link_graph` the rate the kernel moves."""
    return p.pci is not None and pci_paths.search_fails(p.pci, _speeds(p), T.RING_GRAPH_MAX_CHANNELS)


def _speeds(p: Platform) -> tuple[float, ...]:
    """The per-channel speeds NCCL's search tries (search.cc sm-specific lists), inside a node or across nodes."""
    return T.SPEEDS_INTRA[p.arch] if p.nnodes == 1 else T.SPEEDS_INTER[p.arch]


def _duplicated(n: int, s: float, p: Platform) -> Graph:
    """`ncclTopoDupChannels` (v2.18.3-1 to v2.30.7-1): channels of 25 GB/s or more are doubled at half the speed
    (not on sm > 80 below 50 GB/s with more than 4 channels), channel n + g a copy of channel g. v2.18.1-1 doubled
    on sm <= 80 from 25 GB/s and on sm90 from 50 GB/s only (never on sm100): not modelled apart."""
    if s >= 25.0 and not (p.compcap > 80 and s < 50.0 and n > 4):
        dup = min(2 * n, T.RING_GRAPH_MAX_CHANNELS)
        s /= math.ceil(dup / n)
        n = dup
    return Graph(n, s, s)


def comm_channels(p: Platform, ring: Graph, st: NcclSettings) -> int:
    """comm->nChannels: the ring graph's channels doubled (connectRings), then NCCL_MAX/MIN_NCHANNELS."""
    n = min(T.MAX_CHANNELS, 2 * ring.nchannels)
    if p.compcap >= 90 and p.nnodes > 1 and ring.bw_intra > 45.0 and n < 16:
        n *= 2
    n = min(n, st.max_channels)
    return max(n, st.min_channels, 1)


def nvls_heads(p: Platform) -> int:
    """`channels[c].nvls.nHeads`: the NVLS graph's channels, one head GPU each, at most NCCL_MAX_NVLS_ARITY (32)
    however many GPUs share the NVLink domain (search.cc caps the NVLS pattern's maxChannels at
    min(NCCL_MAX_NVLS_ARITY, GPUs), connect.cc makes each a head; v2.17.1-1 to v2.30.7-1). A GB200 NVL72 rack
    runs its NVLS on 32 heads: each reduces and multicasts 1/32 of the buffer, the other 40 GPUs only feed it."""
    return min(T.NVLS_MAX_ARITY, p.ppn)


def default_nvls_channels(p: Platform, version: tuple[int, int]) -> int:
    """NCCL's own NVLS CTA count before the user's bounds (nvls.cc `ncclNvlsInit`, `ncclNvlsTuning`): 16 on
    Hopper; on Blackwell 32 up to 2.26, then (v2.27.3-1 on) 24 inside one node or one MNNVL domain and 32 across
    nodes, and from v2.30.3-1 the SM100 NVLS-Tree tuning's count across nodes (`sm100_nvls_tree`)."""
    if p.arch != "blackwell":
        return T.NVLS_CHANNELS.get(p.arch, 16)
    if version < T.NVLS_SM100_NVL_FROM or p.nnodes > 1:
        tuned = sm100_nvls_tree(p, version)
        return tuned[0] if tuned else T.NVLS_CHANNELS_SM100
    return T.NVLS_CHANNELS["blackwell"]


def sm100_nvls_tree(p: Platform, version: tuple[int, int]) -> tuple[int, int, int] | None:
    """`ncclNvlsTreeSm100Tuning` (nvls.cc, v2.30.3-1 on): (NVLS CTAs, NVLS chunk, NVLS-Tree's largest chunk) for
    Blackwell across nodes, from the node count, GPUs per node and the NIC's GB/s; None before 2.30, on one node, or
    where its rules leave NCCL's defaults (NICs under 48 GB/s). A GPU's NIC is taken behind a PCIe switch (PXB or
    closer: the rail-optimised hosts phantora builds)."""
    if version < T.NVLS_SM100_TREE_TUNING_FROM or p.arch != "blackwell" or p.nnodes < 2:
        return None
    nic, ppn, kib = p.nic_bw, p.ppn, 1024
    if p.nnodes == 2 and nic >= 48.0:
        if ppn <= 4:
            return 32, 256 * kib, 256 * kib
        return 32, 128 * kib, 64 * kib if ppn >= 16 or (ppn <= 8 and nic < 96.0) else 128 * kib
    if nic >= 96.0:
        return (24, 256 * kib, 256 * kib) if ppn <= 8 else (32, 128 * kib, 128 * kib if ppn < 32 else 64 * kib)
    if nic >= 48.0:
        return 24, 128 * kib, 64 * kib
    return None


def nvls_channels(p: Platform, st: NcclSettings) -> int:
    """comm->nvlsChannels (nvls.cc, v2.18.5-1 to v2.30.7-1): NCCL_NVLS_NCHANNELS or NCCL's default for the GPU,
    the NCCL version and the node count (`default_nvls_channels`), clamped to [NCCL_MIN_CTAS, NCCL_MAX_CTAS];
    NCCL_MIN/MAX_NCHANNELS bound comm->nChannels only (connect.cc)."""
    default = st.nvls_channels or default_nvls_channels(p, st.nccl_version)
    return max(1, st.min_ctas, min(default, st.max_ctas))


def plan_channels(algo: str, p: Platform, st: NcclSettings) -> int:
    """nMaxChannels[kind] of `scheduleCollTasksToPlan`: the communicator's channels a collective of `algo` can be
    dealt over (its NVLS channels for NVLS and NVLS-Tree, else comm->nChannels)."""
    return nvls_channels(p, st) if algo in NVLS_ALGORITHMS else comm_channels(p, ring_graph(p), st)
