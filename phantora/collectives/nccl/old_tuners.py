"""How older NCCL tuners rate an (algorithm, protocol) where they differ from 2.30's model (tuning.py), for the
choice only: the time of what is picked stays the model's (the kernels did not change with these constants).

Each rule is a line of src/graph/tuning.cc `ncclTopoTuneModel` that changed between the tags named (NVIDIA/nccl):

- ring LL bus bandwidth: x 1/4 (all-reduce, reduce, or several nodes) or x 1/3 (else) up to v2.20.5-1; x 0.5 from
  v2.21.5-1 (`busBw * .5`).
- ring LL128 with one GPU per node: x 0.7 in place of 0.92 up to v2.22.3-1 (`ppn < 2 ? 0.7 : 0.92`); gone in
  v2.23.4-1.
- tree Simple: base latency 0 and 28 µs a hop on NVLink, PCI and the network from v2.19.3-1 to v2.22.3-1
  (`{ .6, 1.25, 28 }`); 8.4 and 4 / 4 / 14 µs from v2.23.4-1.
- NVLS on one node: nChannels x min(bwIntra, bwInter), x 5/6 to algorithm bandwidth for all-reduce, from
  v2.19.3-1 to v2.26.6-1; v2.27.3-1 takes all-gather / reduce-scatter at min(bwIntra (ppn - 1) / ppn,
  0.9 bwInter); v2.28.3-1 brought nvlsEfficiency (2.30's model).
- NVLS-Tree: nChannels x min(bwIntra, bwInter or bwInter / 2 beyond two nodes) x 5/6, latency 25 + 2 log2(nodes)
  x 14 µs, v2.21.5-1 to v2.27.7-1 (b017751), and 23 + 2 log2(nodes) x 14 µs in v2.19.3-1 and v2.20.5-1 (their
  hwLat[NVLINK][NVLS_TREE][SIMPLE]); v2.18 rated it otherwise (a ratio of .70 nNodes / (2 (nNodes - 1))): 2.30's.
- PAT: none before v2.23.4-1 (no NCCL_ALGO_PAT); its bus bandwidth x 0.85 there, x 0.75 from v2.24.3-1. NVLS: none
  before v2.17.1-1, NVLS-Tree none before v2.18.1-1.
"""

from __future__ import annotations

import math

from phantora.collectives.nccl.platform import Platform

Version = tuple[int, int]
RING_LL_QUARTER_UNTIL: Version = (2, 20)  # x 1/4 or 1/3 up to 2.20; x 0.5 from 2.21
RING_LL128_PPN1_UNTIL: Version = (2, 22)  # x 0.7 at one GPU per node up to 2.22
TREE_SIMPLE_28_FROM_UNTIL: tuple[Version, Version] = ((2, 19), (2, 22))
TREE_SIMPLE_HW_LAT_US = 28.0  # hwLat[*][TREE][SIMPLE], 2.19-2.22 (baseLat 0)
NVLS_MIN_FROM_UNTIL: tuple[Version, Version] = ((2, 19), (2, 27))  # NVLS rated min(bwIntra, bwInter) x 5/6
NVLS_AGRS_PPN_FROM: Version = (2, 27)  # all-gather / reduce-scatter: min(bwIntra (ppn-1)/ppn, 0.9 bwInter)
NVLS_TREE_FROM_UNTIL: tuple[Version, Version] = ((2, 19), (2, 27))
NVLS_TREE_INTRA_LAT_US = 25.0  # hwLat[NVLINK][NVLS_TREE][SIMPLE], 2.21-2.27
NVLS_TREE_INTRA_LAT_US_2_19 = 23.0  # the same in 2.19-2.20
NVLS_TREE_NET_LAT_US = 14.0  # hwLat[NET][NVLS_TREE][SIMPLE], 2.19-2.27 (20.9 from 2.28)
NVLS_LAT_US = 25.0  # hwLat[NVLINK][NVLS][SIMPLE], 2.21-2.30 (23 in 2.19-2.20: their own pick is the same)
NVLS_RATIO = 5.0 / 6.0  # bus to algorithm bandwidth of NVLS and NVLS-Tree, 2.19-2.27
FIRST: dict[str, Version] = {"pat": (2, 23), "nvls": (2, 17), "nvls_tree": (2, 18)}  # the first NCCL with each
PAT_FACTOR_2_23 = 0.85  # busBw *= .85 in 2.23; .75 (2.30's model) from 2.24


def _within(v: Version, span: tuple[Version, Version]) -> bool:
    return span[0] <= v <= span[1]


def available(v: Version, algo: str) -> bool:
    """Whether NCCL `v` has `algo` at all (PAT from 2.23, NVLS from 2.17, NVLS-Tree from 2.18)."""
    return v >= FIRST.get(algo, (0, 0))


def pat_factor(v: Version) -> float | None:
    """PAT's bandwidth relative to 2.30's model in NCCL `v` (0.85 / 0.75 in 2.23); None: 2.30's."""
    return PAT_FACTOR_2_23 / 0.75 if v == (2, 23) else None


def ring_ll_bus(v: Version, kind: str, p: Platform, raw_bus: float, ll_max: float) -> float | None:
    """Ring LL bus bandwidth (GB/s) as NCCL `v` rates it from the graph's nChannels x bw (`raw_bus`); None: 2.30's."""
    if v > RING_LL_QUARTER_UNTIL:
        return None
    factor = 0.25 if p.nnodes > 1 or kind in ("all_reduce", "reduce") else 1.0 / 3.0
    return min(ll_max, raw_bus * factor)


def ring_ll128_factor(v: Version, p: Platform) -> float | None:
    """The ring LL128 factor on the graph's bandwidth in NCCL `v` (0.7 at one GPU per node up to 2.22); None: 2.30's."""
    return 0.7 if v <= RING_LL128_PPN1_UNTIL and p.ppn < 2 else None


def tree_simple_lat_us(v: Version, kind: str, p: Platform) -> float | None:
    """Tree Simple latency (µs) in NCCL 2.19-2.22: 28 µs a hop, no base; None: 2.30's."""
    if not _within(v, TREE_SIMPLE_28_FROM_UNTIL):
        return None
    if kind != "all_reduce":
        return 0.0
    log_nodes = int(math.log2(p.nnodes)) if p.nnodes > 1 else 0
    return 2 * ((p.nranks // p.nnodes - 1) * TREE_SIMPLE_HW_LAT_US + log_nodes * TREE_SIMPLE_HW_LAT_US)


def nvls_algbw(v: Version, kind: str, p: Platform, nch: int, bw_intra: float, bw_inter: float) -> float | None:
    """One-node NVLS algorithm bandwidth (GB/s) as NCCL 2.19-2.27 rate it; None: 2.30's."""
    if not _within(v, NVLS_MIN_FROM_UNTIL) or nch < 2:
        return None
    if kind == "all_reduce":
        return nch * min(bw_intra, bw_inter) * NVLS_RATIO
    if v >= NVLS_AGRS_PPN_FROM:
        return nch * min(bw_intra * (p.ppn - 1) / p.ppn, 0.9 * bw_inter)
    return nch * min(bw_intra, bw_inter)  # all-gather / reduce-scatter: bus = algorithm bandwidth in NCCL's model


def nvls_tree_rating(v: Version, p: Platform, nch: int, bw_intra: float, bw_inter: float) -> tuple[float, float] | None:
    """(latency µs, algorithm bandwidth GB/s) of NVLS-Tree in NCCL 2.19-2.27; None: 2.30's."""
    if not _within(v, NVLS_TREE_FROM_UNTIL) or p.nnodes < 2 or nch < 2:
        return None
    bw = min(bw_intra, bw_inter if p.nnodes <= 2 else bw_inter / 2) * nch * NVLS_RATIO
    intra = NVLS_TREE_INTRA_LAT_US_2_19 if v <= (2, 20) else NVLS_TREE_INTRA_LAT_US
    lat = intra + 2 * int(math.log2(p.nnodes)) * NVLS_TREE_NET_LAT_US
    return lat, bw
