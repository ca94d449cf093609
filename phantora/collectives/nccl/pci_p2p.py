"""What p2p transfers (send/recv, all-to-all) between the GPUs of one PCIe host move: each pair's rate over the
host's PCIe and CPU links (`pci_paths.PciHost`), as NCCL's transports carry the bytes (NVIDIA/nccl v2.30.7-1).

- paths.cc `ncclTopoGetNchannels`: a local peer over any path but NVLink (PATH_NVL / PATH_NVB) gets 2 p2p channels,
  so a transfer between PCIe peers (every pair once P2P is off) runs on at most `PCI_PEER_CHANNELS`.
- shm.cc: a pair without P2P runs SHM, its buffer on the receiver's side (NCCL_SHM_LOCALITY default 2): the sender's
  kernel stores each step into the receiver's host memory and the receiver's kernel loads it from there. Each byte
  climbs the sender's x16 link and switch uplink, crosses the inter-CPU link when the CPUs differ, and comes down
  the receiver's: the path `addInterStep` gives the pair (`pci_paths.hop_links`).
- p2p.cc: a pair with P2P copies GPU to GPU over its PCIe path (PIX under one switch, through the CPU's root complex
  PHB, where search.cc charges 6/5 on Intel for P2P through the root complex: `INTEL_P2P_OVERHEAD`, kept here).
- enqueue.cc: an all-to-all is one group of a send and a receive per peer, every peer's in flight at once (8 peers
  a batch fit every host modelled), so its transfers share those links.

NCCL has no rate model for p2p: its transfers move at what the links allow. Here each pair takes its max-min fair
share of every directed link on its path (the GPU's x16, the switch uplink, NCCL's inter-CPU figure), the pairs
in flight together filling the links at one rate until a link is full (progressive filling).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from phantora.collectives.nccl.pci_paths import (
    INTEL_P2P_OVERHEAD,
    PHB,
    Link,
    PciHost,
    hop_links,
    link_bw,
    transport,
)

PCI_PEER_CHANNELS = 2  # paths.cc ncclTopoGetNchannels: "PCIe connection"
K = TypeVar("K")
L = TypeVar("L", bound=tuple[object, ...])  # a directed link: (from, to)


def _loads(h: PciHost, i: int, j: int) -> dict[Link, float]:
    """GB/s each link of pair (i, j)'s path carries per GB/s of the transfer: 6/5 on the PCIe links of a P2P copy
    through an Intel CPU's root complex (PATH_PHB), else 1."""
    links, kind = hop_links(h, i, j)
    over = INTEL_P2P_OVERHEAD if kind == PHB and h.cpu == "intel" and transport(h, i, j) == "P2P" else 1.0
    return {link: (1.0 if link[0][0] == link[1][0] == "cpu" else over) for link in links}


def pair_rates(h: PciHost, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], float]:
    """The GB/s each of the (sender, receiver) position pairs moves while all of them are in flight: max-min fair
    shares of the directed links of their paths."""
    return max_min({pair: _loads(h, *pair) for pair in pairs}, lambda link: link_bw(h, link))


def max_min(loads: Mapping[K, Mapping[L, float]], capacity: Callable[[L], float]) -> dict[K, float]:
    """Progressive filling: each transfer's rate (GB/s) when all of them are in flight, `loads[t][link]` the GB/s
    `link` carries per GB/s of transfer t, `capacity(link)` its GB/s."""
    rate: dict[K, float] = {}
    used: dict[L, float] = {}
    while len(rate) < len(loads):
        best, tight = float("inf"), None
        for link in sorted({link for t, on in loads.items() if t not in rate for link in on}):
            weight = sum(on[link] for t, on in loads.items() if t not in rate and link in on)
            share = (capacity(link) - used.get(link, 0.0)) / weight
            if share < best - 1e-12:
                best, tight = share, link
        assert tight is not None
        for t, on in loads.items():
            if t not in rate and tight in on:
                rate[t] = best
                for link, w in on.items():
                    used[link] = used.get(link, 0.0) + w * best
    return rate


def group_ends(
    rates_of: Callable[[list[tuple[int, int]]], dict[tuple[int, int], float]],
    starts: dict[tuple[int, int], float],
    sizes: dict[tuple[int, int], float],
) -> dict[tuple[int, int], float]:
    """When each pair of one NCCL group ends (ns) whose transfers start at `starts` (ns; a pair runs once both
    peers' kernels run) with `sizes` bytes: the pairs in flight at each moment move at `rates_of(those pairs)` (a
    PCIe host: their shares of its links, `pair_rates`; NVLink and network: nccl/p2p_group.py), set again at every
    start and end (GB/s = bytes per ns)."""
    left = dict(sizes)
    ends: dict[tuple[int, int], float] = {p: starts[p] for p, b in sizes.items() if b <= 0}
    now = min(starts.values(), default=0.0)
    while len(ends) < len(sizes):
        running = sorted(p for p in sizes if p not in ends and starts[p] <= now)
        later = [starts[p] for p in sizes if p not in ends and starts[p] > now]
        if not running:
            now = min(later)
            continue
        rate = rates_of(running)
        step = min(left[p] / rate[p] for p in running)
        if later and min(later) - now < step:
            step = min(later) - now
        now += step
        for p in running:
            left[p] -= rate[p] * step
            if left[p] <= 1e-6 * sizes[p]:
                ends[p] = now
    return ends
