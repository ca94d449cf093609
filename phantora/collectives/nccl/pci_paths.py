"""NCCL's view of the GPU-to-GPU paths of one PCIe host (NVIDIA/nccl v2.30.7-1): their type, the transport NCCL
picks for each pair, and the ring channels its topology search finds over them.

- topo.h / topo.cc: a PCIe link is worth NCCL's width x speed / 80 GB/s; the CPUs of one host are joined by a
  LINK_SYS of `ncclTopoGetInterCpuBw` (Intel by model: BDW_QPI_BW 6, SKL_QPI_BW 10 from model 0x55, SRP_QPI_BW 22
  from 0x8F, ERP_QPI_BW 40 from 0xCF; AMD_BW 16; ARM_BW 6).
- paths.cc: GPUs under one PCIe switch are PATH_PIX apart, GPUs on the same CPU's root ports PATH_PHB, GPUs under
  different CPUs PATH_SYS. `ncclTopoCheckP2p` uses P2P up to PATH_PXB (PATH_SYS on AMD hosts where the communicator
  has at most two GPUs), or up to the user's NCCL_P2P_LEVEL (NCCL_P2P_DISABLE=1: PATH_LOC, no P2P at all). A pair
  without P2P is diverted through the receiver's CPU (`addInterStep`: its path climbs to the CPU, PATH_PHB inside a
  socket) and runs the SHM transport (shm.cc), unless NCCL_SHM_DISABLE=1, which leaves only the network transport.
- search.cc `followPath`: each channel takes its speed off every link of each hop's path; a PATH_PHB hop through an
  Intel CPU takes 6/5 of it off its PCIe links (`INTEL_P2P_OVERHEAD`). `ncclTopoCompute` starts at the fastest speed
  not above the best GPU-to-GPU path, keeps the graph of most channels x speed, stops once that fills the GPU's link,
  and lowers the speed while the next is above .49 of the best; with no ring at any speed it falls back to one
  channel of 0.1 GB/s.

The ring is phantora's: the group's ranks in order (NCCL's search would reorder an interleaved group).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from phantora.errors import InputError

PATH_NAMES = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")  # topoPathTypeStr
LOC, NVL, PIX, PXB, PHB, SYS = 0, 1, 4, 5, 8, 9
OLD_LEVELS = (LOC, PIX, PXB, PHB, SYS, SYS)  # paths.cc levelsOldToNew: NCCL_P2P_LEVEL given as a number
UNSET = -2  # NCCL_P2P_LEVEL / NCCL_P2P_DISABLE not given
INTEL_P2P_OVERHEAD = 6 / 5
FALLBACK_BW = 0.1  # search.cc: "Could not find a path ..., falling back to simple order"
SEARCH_STEP_DOWN = 0.49

# CPU models as NCCL's topology detection classes them: (vendor, Intel familyId 6 model id)
CPU_MODELS = {
    "bdw": ("intel", 0x4F),  # Broadwell
    "skl": ("intel", 0x55),  # Skylake / Cascade Lake
    "icx": ("intel", 0x6A),  # Ice Lake
    "spr": ("intel", 0x8F),  # Sapphire Rapids
    "gnr": ("intel", 0xAD),  # Granite Rapids
    "emr": ("intel", 0xCF),  # Emerald Rapids
    "zen": ("amd", 0),
    "arm": ("arm", 0),
}
DEFAULT_CPU_MODEL = {"intel": "skl", "amd": "zen", "arm": "arm"}


def cpu_model_name(value: object, vendor: str | None, field: str = "cpu_model") -> str:
    """The CPU model (`CPU_MODELS`), its vendor's default when None; an error if it is not the hosts' vendor."""
    if value is None:
        return DEFAULT_CPU_MODEL[vendor or "intel"]
    name = value.strip().lower() if isinstance(value, str) else None
    if name not in CPU_MODELS:
        raise InputError(f"expected one of {', '.join(CPU_MODELS)}, got {value!r}", field=field)
    if vendor is not None and CPU_MODELS[name][0] != vendor:
        raise InputError(f"{name!r} is an {CPU_MODELS[name][0]} CPU, but the hosts' cpu is {vendor!r}", field=field)
    return name


def inter_cpu_bw(model: str) -> float:
    """`ncclTopoGetInterCpuBw` (GB/s) of a CPU model."""
    vendor, model_id = CPU_MODELS[model]
    if vendor == "amd":
        return 16.0
    if vendor == "arm":
        return 6.0
    return 40.0 if model_id >= 0xCF else 22.0 if model_id >= 0x8F else 10.0 if model_id >= 0x55 else 6.0


@dataclass(frozen=True)
class PciHost:
    """One communicator's GPUs on one PCIe host, and the NCCL variables that decide their transports."""

    sockets: tuple[int, ...]  # the CPU socket of each rank's GPU, in rank order
    switched: bool  # each socket's GPUs under one PCIe switch (PIX between them), else on its root ports (PHB)
    cpu: str  # vendor: intel | amd | arm
    inter_cpu_bw: float  # GB/s of the link between two CPUs, NCCL's figure
    link_bw: float  # GB/s NCCL gives a GPU's PCIe link (and a switch's uplink)
    comm_gpus: int  # the communicator's GPUs on the host (NCCL's DEV count: topo.cc fuses only theirs)
    p2p_level: int = UNSET  # NCCL_P2P_DISABLE / NCCL_P2P_LEVEL, a path type
    shm: bool = True  # not NCCL_SHM_DISABLE=1
    switch_of: tuple[int, ...] = ()  # each rank's PCIe switch when `switched` and a socket has several; () one each


def switch(h: PciHost, i: int) -> int:
    """The PCIe switch of position i's GPU: its own entry in `switch_of`, else its socket's one switch."""
    return h.switch_of[i] if h.switch_of else h.sockets[i]


def p2p_level_of(disable: str | None, level: str | None) -> int:
    """`ncclGetLevel`: NCCL_P2P_DISABLE=1 is PATH_LOC; else NCCL_P2P_LEVEL by name or old number; UNSET if neither."""
    if disable not in (None, ""):
        if disable.strip() not in ("0", "1"):
            raise InputError(f"NCCL_P2P_DISABLE={disable!r}: expected 0 or 1", field="NCCL_P2P_DISABLE")
        if disable.strip() == "1":
            return LOC
    if level in (None, ""):
        return UNSET
    text = level.strip()
    if text in PATH_NAMES:
        return PATH_NAMES.index(text)
    if text.isdigit():
        return OLD_LEVELS[min(int(text), len(OLD_LEVELS) - 1)]
    raise InputError(
        f"NCCL_P2P_LEVEL={level!r}: expected one of {', '.join(PATH_NAMES)} or a number 0-5", field="NCCL_P2P_LEVEL"
    )


def path_type(h: PciHost, i: int, j: int) -> int:
    """The PCIe path type between the GPUs of positions i and j, before any diversion."""
    if h.sockets[i] != h.sockets[j]:
        return SYS
    return PIX if h.switched and switch(h, i) == switch(h, j) else PHB


def p2p_level(h: PciHost) -> int:
    """`ncclTopoCheckP2p`'s level: the user's, else PXB, or SYS on an AMD host where the communicator has at most
    two GPUs (topo.cc fuses only the communicator's GPUs into the system it counts)."""
    if h.p2p_level != UNSET:
        return h.p2p_level
    return SYS if h.cpu == "amd" and h.comm_gpus <= 2 else PXB


def transport(h: PciHost, i: int, j: int) -> str:
    """The transport NCCL connects position i to position j with: P2P, else SHM."""
    if path_type(h, i, j) <= p2p_level(h):
        return "P2P"
    if h.shm:
        return "SHM"
    raise InputError(
        "NCCL_SHM_DISABLE=1 with P2P off between GPUs of one PCIe host: NCCL would use its network transport, "
        "which is not modelled inside a host",
        field="NCCL_SHM_DISABLE",
    )


Link = tuple[tuple[str, int], tuple[str, int]]


def hop_links(h: PciHost, i: int, j: int) -> tuple[list[Link], int]:
    """The directed links of the path from position i to position j as NCCL routes it, and its type: a pair
    without P2P goes up to the receiver's CPU and down (addInterStep)."""
    si, sj, wi, wj = h.sockets[i], h.sockets[j], ("sw", switch(h, i)), ("sw", switch(h, j))
    gi, gj, ci, cj = ("gpu", i), ("gpu", j), ("cpu", si), ("cpu", sj)
    up = [(gi, wi), (wi, ci)] if h.switched else [(gi, ci)]
    down = [(cj, wj), (wj, gj)] if h.switched else [(cj, gj)]
    if si != sj:
        return [*up, (ci, cj), *down], SYS
    if path_type(h, i, j) == PIX and transport(h, i, j) == "P2P":
        return [(gi, wi), (wi, gj)], PIX
    return [*up, *down], PHB


def link_bw(h: PciHost, link: Link) -> float:
    """GB/s of a directed link: NCCL's inter-CPU figure between two CPUs, else the PCIe link's."""
    return h.inter_cpu_bw if link[0][0] == link[1][0] == "cpu" else h.link_bw


def ring_hops(h: PciHost) -> list[tuple[int, int]]:
    n = len(h.sockets)
    return [(i, (i + 1) % n) for i in range(n)]


def ring_loads(h: PciHost) -> dict[Link, float]:
    """GB/s each directed link carries per GB/s of one ring channel: a hop's path once, its PCIe links 6/5 on a
    PATH_PHB hop through an Intel CPU."""
    loads: dict[Link, float] = {}
    for i, j in ring_hops(h):
        links, kind = hop_links(h, i, j)
        pci = INTEL_P2P_OVERHEAD if kind == PHB and h.cpu == "intel" else 1.0
        for link in links:
            loads[link] = loads.get(link, 0.0) + (1.0 if link[0][0] == link[1][0] == "cpu" else pci)
    return loads


def ring_capacity(h: PciHost) -> tuple[float, Link]:
    """The most GB/s the ring's channels can carry in all, and the link that bounds it."""
    return min(((link_bw(h, link) / load, link) for link, load in ring_loads(h).items()), key=lambda x: x[0])


def max_path_bw(h: PciHost) -> float:
    """`getMaxBw`: the best GPU-to-GPU path's bandwidth (its narrowest link)."""
    n = len(h.sockets)
    return max(min(link_bw(h, link) for link in hop_links(h, i, j)[0]) for i in range(n) for j in range(n) if i != j)


def ring_search(h: PciHost, speeds: tuple[float, ...], max_channels: int) -> tuple[int, float]:
    """`ncclTopoCompute` for the ring: (channels, GB/s each) before NCCL's channel duplication; NCCL's one channel
    of `FALLBACK_BW` where no ring fits at any speed (what NCCL's tuner rates, not what its kernel moves)."""
    found = _search(h, speeds, max_channels)
    return found if found[0] else (1, FALLBACK_BW)


def link_ring(h: PciHost, speeds: tuple[float, ...], max_channels: int) -> tuple[int, float]:
    """The ring's channels and the GB/s each moves: `ring_search`'s, except NCCL's fallback, whose one channel
    moves what the host's links allow that ring (`ring_capacity`, Intel's 6/5 on PHB hops as NCCL charges it):
    the 0.1 GB/s feeds NCCL's tuning only (its choice and model time), the kernel copies at the hardware's rate."""
    found = _search(h, speeds, max_channels)
    return found if found[0] else (1, ring_capacity(h)[0])


def search_fails(h: PciHost, speeds: tuple[float, ...], max_channels: int) -> bool:
    """Whether NCCL's ring search finds no ring at any speed, so that it falls back to one channel of
    `FALLBACK_BW` (and logs "Could not find a path for pattern 4, falling back to simple order")."""
    return not _search(h, speeds, max_channels)[0]


@lru_cache(maxsize=256)
def _search(h: PciHost, speeds: tuple[float, ...], max_channels: int) -> tuple[int, float]:
    """The ring search proper: the best (channels, GB/s each), (0, 0.0) if no ring fits at any speed."""
    cap = ring_capacity(h)[0]
    top = max_path_bw(h)
    k = 0
    while k < len(speeds) - 1 and (speeds[k] > top or speeds[k] > h.link_bw):
        k += 1
    best = (0, 0.0)
    while True:
        s = speeds[k]
        n = min(max_channels, math.floor(cap / s + 1e-9))
        if n * s > best[0] * best[1] + 1e-9:
            best = (n, s)
        if best[0] * best[1] >= h.link_bw - 1e-9:
            break
        if k >= len(speeds) - 1 or (best[0] and speeds[k + 1] / best[1] <= SEARCH_STEP_DOWN):
            break
        k += 1
    return best


def all_pairs(h: PciHost) -> list[tuple[int, int]]:
    """Every ordered pair of positions (an all-to-all's transfers)."""
    n = len(h.sockets)
    return [(i, j) for i in range(n) for j in range(n) if i != j]


def transports(h: PciHost, pairs: list[tuple[int, int]]) -> tuple[tuple[str, int], ...]:
    """How many of the (sender, receiver) pairs run each transport."""
    counts: dict[str, int] = {}
    for i, j in pairs:
        t = transport(h, i, j)
        counts[t] = counts.get(t, 0) + 1
    return tuple(sorted(counts.items()))


def farthest_path(h: PciHost, pairs: list[tuple[int, int]]) -> str:
    """The worst path type of the pairs' paths (for a ring: the graph's typeIntra)."""
    return PATH_NAMES[max(hop_links(h, i, j)[1] for i, j in pairs)]


def ring_transports(h: PciHost) -> tuple[tuple[str, int], ...]:
    """How many of the ring's hops run each transport."""
    return transports(h, ring_hops(h))


def ring_path(h: PciHost) -> str:
    """The ring's farthest path type."""
    return farthest_path(h, ring_hops(h))
