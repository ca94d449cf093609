"""How older NCCL tuners rate an (algorithm, protocol) where they differ from 2.30's model (tuning.py), for the
choice only: the time of what is picked stays the model's (the kernels did not change with these constants).

A version is (major, minor) or (major, minor, patch); a minor alone is its newest patch (2.28 is v2.28.9-1). Each
rule is a line of src/graph/tuning.cc (`ncclTopoTuneModel`, `ncclTopoGetAlgoTime`) with the first tag that has the
new line (NVIDIA/nccl, every tag v2.17.1-1 to v2.30.7-1 diffed; v2.30.4-1 to v2.30.7-1 only reformats):

- v2.18.1-1: baseLat tree LL / LL128 4.4 / 4.4 -> 6.8 / 14, ring LL / LL128 3.6 / 10 -> 6.6 / 14; hwLat[NVLINK]
  tree LL .52 -> .6, ring LL .47 -> .6; hwLat[NET] ring Simple 9.6 -> 14; the bus caps 235 (Ampere) / 370 (Hopper)
  on every algorithm, LL's intra-node latency x 1.8 across nodes and the ring plateau's `nBytes >= nRanks / 16 x
  64 KiB`, x 1.9 below sm90 (else 1.5) go (64 B a channel and rank, x 1.9 below sm80, else 1.4); getNetOverhead
  floors a ring's intra-node step across nodes. NVLS: base 40 -> 23 µs, rated on its own graph (2.17: the ring's),
  none for all-gather / reduce-scatter until v2.19.1-1. NVLS-Tree appears: nChannels x bw x .70 nNodes /
  (2 (nNodes - 1)), 23 + 2 (nNodes - 1) x 19 µs.
- v2.18.3-1: tree Simple 28 µs a hop -> 4 / 6 / 14 (NVLink / PCI / network, base 0); the NVLS ratio .75 -> 5/6.
- v2.19.1-1: tree Simple back to 28 µs a hop (base 0); NVLS min(bwIntra, bwInter) x 5/6 at 23 µs (hwLat, no base);
  NVLS-Tree min(bwIntra, bwInter or bwInter / 2 beyond two nodes) x 5/6 at 23 + 2 log2(nNodes) x 14 µs.
- v2.21.5-1: ring LL x 1/4 (all-reduce, reduce, several nodes) or 1/3 -> x .5; NVLS / NVLS-Tree 23 -> 25 µs;
  llMaxBws[Hopper] one node 87.7 -> 141.
- v2.23.4-1: tree Simple base 8.4, 4 / 4 / 14 µs a hop; ring LL128 x 0.7 at one GPU a node goes (0.92 always); a
  ring all-reduce crosses the network 2 (nNodes - 1) times, not 2 nNodes; one GPU a node takes the tree's network
  latency; all-gather / reduce-scatter bandwidths other than the ring's are no longer converted (NVLS x 5/6 goes
  there); PAT appears (x 0.85).
- v2.24.3-1: PAT x 0.75. v2.25.1-1: Blackwell rows (before: Hopper's): ring LL128 73.4 a channel, tree
  (77.4, 82.8, 72), tree LL128 (73.4, 73.4, 58) for one / two / more nodes.
- v2.27.3-1: NVLS all-gather / reduce-scatter min(bwIntra (ppn - 1) / ppn, 0.9 bwInter).
- v2.28.3-1: nvlsEfficiency and perChMaxNVLSTreeBws (2.30's NVLS and NVLS-Tree formula); Blackwell tree (70, 42.8,
  24), tree LL128 (55.6, 31.67, 20); NVLS-Tree's network hop still 14 µs, Blackwell's cap beyond two nodes 43.1.
- v2.28.7-1: Blackwell ring LL128 two nodes 73.4 -> 34.6. v2.28.9-1: hwLat[NET][NVLS_TREE] 14 -> 20.9, Blackwell
  NVLS-Tree beyond two nodes 43.8. v2.29.2-1: Blackwell ring LL128 (34.5, 34.6, 34.5); NVLS-Tree tree-corrected
  on Blackwell x86 (tuning.nvls_tree_corrected). v2.29.7-1: Blackwell ring LL128 40. v2.30.3-1: Blackwell NVLS-Tree
  beyond two nodes 80 (2.30's model).

Not restated: CollNet, Power CPUs, Blackwell before v2.25.1-1 (rated as Hopper), LL128's enables (tuning.py's).
"""

from __future__ import annotations

import math

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.platform import Platform

Version = tuple[int, ...]  # (major, minor) or (major, minor, patch)
Release = tuple[int, int, int]
NEWEST_PATCH = 99  # a minor named alone: its newest release

V2_18_1: Release = (2, 18, 1)
V2_18_3: Release = (2, 18, 3)
V2_19_1: Release = (2, 19, 1)
V2_21_5: Release = (2, 21, 5)
V2_23_4: Release = (2, 23, 4)
V2_24_3: Release = (2, 24, 3)
V2_25_1: Release = (2, 25, 1)
V2_27_3: Release = (2, 27, 3)
V2_28_3: Release = (2, 28, 3)
V2_28_9: Release = (2, 28, 9)
FIRST: dict[str, Release] = {"pat": V2_23_4, "nvls": (2, 17, 1), "nvls_tree": V2_18_1}  # the first NCCL with each

# tuning.cc's tables before they took 2.30's values: (first tag with this value, value); the last entry holds on
# until 2.30's (tables.py) takes over at the given end tag.
HOPPER_LL_MAX_1NODE_OLD = 87.7  # llMaxBws[Hopper][N1] before v2.21.5-1 (Ampere's)
BUS_CAP_2_17 = {"ampere": 235.0, "hopper": 370.0}  # busBw cap on every algorithm before v2.18.1-1
# perChMaxRingLL128Bws[Blackwell] (one node, two, more) from each tag until v2.29.7-1 (40.0: tables.py)
BLACKWELL_RING_LL128 = (
    ((2, 25, 1), (73.4, 73.4, 73.4)),
    ((2, 28, 7), (73.4, 34.6, 73.4)),
    ((2, 29, 2), (34.5, 34.6, 34.5)),
)
BLACKWELL_RING_LL128_MODEL_FROM: Release = (2, 29, 7)
BLACKWELL_TREE_OLD = (77.4, 82.8, 72.0)  # perChMaxTreeBws[Blackwell], v2.25.1-1 to v2.27.7-1
BLACKWELL_TREE_LL128_OLD = (73.4, 73.4, 58.0)  # perChMaxTreeLL128Bws[Blackwell], the same tags
# perChMaxNVLSTreeBws[Blackwell] beyond two nodes from each tag until v2.30.3-1 (80.0: tables.py)
BLACKWELL_NVLS_TREE_N4 = (((2, 28, 3), 43.1), ((2, 28, 9), 43.8))
NVLS_TREE_MODEL_FROM: Release = (2, 30, 3)

# Latencies (µs) of v2.17.1-1 where they differ: base (LL, LL128, Simple) and a hop by link kind.
BASE_LAT_2_17 = {"tree": (4.4, 4.4, 0.0), "ring": (3.6, 10.0, 8.4)}
HW_LAT_2_17 = {
    "nvlink": {"tree": (0.52, 1.25, 28.0), "ring": (0.47, 1.9, 3.4)},
    "pci": {"tree": (1.0, 1.9, 28.0), "ring": (1.0, 2.5, 5.7)},
    "net": {"tree": (5.0, 8.5, 28.0), "ring": (2.7, 4.0, 9.6)},
}
LL_INTRA_FACTOR_2_17 = 1.8  # LL's intra-node hop across nodes, v2.17.1-1
TREE_SIMPLE_HOP_US_28 = 28.0  # hwLat[*][TREE][SIMPLE] up to v2.18.1-1 and v2.19.1-1 to v2.22.3-1 (base 0)
TREE_SIMPLE_HOP_US_2_18_3 = {"nvlink": 4.0, "pci": 6.0, "net": 14.0}  # v2.18.3-1 to v2.18.6-1 (base 0)
NVLS_LAT_US = {(2, 17, 1): 40.0, V2_18_1: 23.0}  # one node, until v2.21.5-1 (25: 2.30's)
NVLS_TREE_NET_LAT_US = 14.0  # hwLat[NET][NVLS_TREE][SIMPLE], v2.19.1-1 to v2.28.7-1 (20.9 from v2.28.9-1)
NVLS_TREE_NET_LAT_US_2_18 = 19.0  # the same in v2.18.x
NVLS_TREE_BASE_US_2_18 = 23.0  # baseLat[NVLS_TREE][SIMPLE], v2.18.x
NVLS_TREE_INTRA_LAT_US = 25.0  # hwLat[NVLINK][NVLS_TREE][SIMPLE] from v2.21.5-1
NVLS_TREE_INTRA_LAT_US_2_19 = 23.0  # the same in v2.19.1-1 to v2.20.5-1
NVLS_RATIO = 5.0 / 6.0  # bus to algorithm bandwidth of NVLS and NVLS-Tree, v2.18.3-1 to v2.27.7-1
NVLS_RATIO_2_17 = 0.75  # the same before v2.18.3-1
PAT_FACTOR_2_23 = 0.85  # busBw *= .85 in v2.23.4-1; .75 (2.30's model) from v2.24.3-1
RING_PLATEAU_2_17 = (1.9, 1.5)  # ring Simple all-reduce latency x, below sm90 / from sm90, before v2.18.1-1


def release(v: Version) -> Release:
    """`v` as (major, minor, patch); a minor without a patch (or patch 0) is its newest release."""
    return v[0], v[1], v[2] if len(v) > 2 and v[2] > 0 else NEWEST_PATCH


def available(v: Version, algo: str, kind: str = "all_reduce") -> bool:
    """Whether NCCL `v` runs `algo` for `kind` (PAT from 2.23, NVLS from 2.17 but not for all-gather /
    reduce-scatter in 2.18, NVLS-Tree from 2.18)."""
    r = release(v)
    if algo == "nvls" and kind in ("all_gather", "reduce_scatter") and V2_18_1 <= r < V2_19_1:
        return False
    return r >= FIRST.get(algo, (0, 0, 0))


def pat_factor(v: Version) -> float | None:
    """PAT's bandwidth relative to 2.30's model in NCCL `v` (0.85 / 0.75 in 2.23); None: 2.30's."""
    return PAT_FACTOR_2_23 / 0.75 if V2_23_4 <= release(v) < V2_24_3 else None


def _ll_max(r: Release, p: Platform) -> float | None:
    if p.nnodes == 1 and p.arch == "hopper" and r < V2_21_5:
        return HOPPER_LL_MAX_1NODE_OLD
    return None


def _ring_ll128_cap(r: Release, p: Platform) -> float | None:
    if p.arch != "blackwell" or r >= BLACKWELL_RING_LL128_MODEL_FROM:
        return None
    caps = [c for first, c in BLACKWELL_RING_LL128 if r >= first]
    return caps[-1][p.index2] if caps else None


def _tree_caps(r: Release, p: Platform) -> tuple[float, float] | None:
    if p.arch == "blackwell" and V2_25_1 <= r < V2_28_3:
        return BLACKWELL_TREE_OLD[p.index2], BLACKWELL_TREE_LL128_OLD[p.index2]
    if p.arch == "hopper" and r < V2_18_3 and p.index2 == 2:
        return 33.0, 36.7  # perChMaxTreeBws[Hopper][N4] 33 before v2.18.3-1; LL128 at ll128MaxBwPerCh
    return None


def graph_bus_bw(
    v: Version, kind: str, algo: str, proto: str, p: Platform, raw: float, nch: int, ll_max: float
) -> float | None:
    """Bus bandwidth (GB/s) NCCL `v` rates ring or tree `proto` at from the graph's nChannels x bw (`raw`, `nch`
    channels; `ll_max` 2.30's llMaxBw); None where it equals 2.30's."""
    r = release(v)
    cap = BUS_CAP_2_17.get(p.arch, math.inf) if r < V2_18_1 else math.inf
    llm = _ll_max(r, p)
    old_ll = r < V2_21_5
    ppn1 = r < V2_23_4 and p.ppn < 2
    ring128 = _ring_ll128_cap(r, p)
    tree = _tree_caps(r, p)
    bus = min(raw, cap)
    if algo == "ring":
        if proto == "LL" and (cap < raw or llm is not None or old_ll):
            factor = (0.25 if p.nnodes > 1 or kind in ("all_reduce", "reduce") else 1.0 / 3.0) if old_ll else 0.5
            return min(llm or ll_max, bus * factor)
        if proto == "LL128" and (cap < raw or ppn1 or ring128 is not None):
            per_ch = ring128 or T.PER_CH_MAX_RING_LL128_BW[p.arch]
            return min(bus * (0.7 if ppn1 else 0.92), nch * per_ch)
        if proto == "Simple" and cap < raw:
            return bus
        return None
    if algo != "tree" or not (cap < raw or tree is not None or (proto == "LL" and llm is not None)):
        return None
    tree_cap, ll128_cap = tree or (T.PER_CH_MAX_TREE_BW[p.arch][p.index2], T.PER_CH_MAX_TREE_LL128_BW[p.arch][p.index2])
    bus = min(bus * 0.92, nch * tree_cap)
    if proto == "LL":
        return min(bus / 3.8, llm or ll_max)
    if proto == "LL128":
        return min(bus * (7.0 / 9.0 if p.nnodes == 1 else 120.0 / 128.0), nch * ll128_cap)
    return bus


def _hw(p: Platform) -> str:
    return "nvlink" if p.intra == "nvlink" else "pci"


def tree_lat_us(v: Version, kind: str, pi: int, p: Platform) -> float | None:
    """Tree latency (µs) of protocol index `pi` in NCCL `v`: v2.17's tables, or Simple's 28 µs a hop (up to
    v2.18.1-1, v2.19.1-1 to v2.22.3-1) or 4 / 6 / 14 (v2.18.3-1 to v2.18.6-1), no base; None: 2.30's."""
    r = release(v)
    log_nodes = int(math.log2(p.nnodes)) if p.nnodes > 1 else 0
    hops = p.nranks // p.nnodes - 1
    if r < V2_18_1:
        intra = HW_LAT_2_17[_hw(p)]["tree"][pi] * (LL_INTRA_FACTOR_2_17 if p.nnodes > 1 and pi == 0 else 1.0)
        base = BASE_LAT_2_17["tree"][pi]
        return base + (2 * (hops * intra + log_nodes * HW_LAT_2_17["net"]["tree"][pi]) if kind == "all_reduce" else 0)
    if pi != 2 or r >= V2_23_4:
        return None
    if kind != "all_reduce":
        return 0.0
    if V2_18_3 <= r < V2_19_1:
        hop = TREE_SIMPLE_HOP_US_2_18_3
        return 2 * (hops * hop[_hw(p)] + log_nodes * hop["net"])
    return 2 * (hops * TREE_SIMPLE_HOP_US_28 + log_nodes * TREE_SIMPLE_HOP_US_28)


def tree_simple_lat_us(v: Version, kind: str, p: Platform) -> float | None:
    """Tree Simple latency (µs) in NCCL `v` (`tree_lat_us`); None: 2.30's."""
    return tree_lat_us(v, kind, 2, p)


def ring_lat_us(v: Version, kind: str, pi: int, p: Platform, nsteps: int, overhead: float) -> float | None:
    """Ring latency (µs) of protocol index `pi` in NCCL `v` before v2.23.4-1: an all-reduce across nodes crosses the
    network 2 nNodes times, one GPU a node takes the ring's network latency, and v2.17 has its own tables, no net
    overhead floor and LL's intra-node hop x 1.8 across nodes; None: 2.30's (`overhead`: getNetOverhead, µs)."""
    r = release(v)
    if r >= V2_23_4:
        return None
    old = r < V2_18_1
    base = BASE_LAT_2_17["ring"][pi] if old else T.BASE_LAT["ring"][pi]
    hw = HW_LAT_2_17 if old else {k: {"ring": T.HW_LAT[k]["ring"]} for k in ("nvlink", "pci", "net")}
    if kind in ("broadcast", "reduce"):
        if not old:
            return None
        return base + hw["net" if p.nnodes > 1 else _hw(p)]["ring"][pi]
    nn = p.nnodes
    intra, inter = hw[_hw(p)]["ring"][pi], hw["net"]["ring"][pi]
    if nn > 1:
        intra = intra * LL_INTRA_FACTOR_2_17 if old and pi == 0 else intra
        intra = intra if old else max(intra, overhead * (3 if pi == 2 else 1))
    inter_steps = (2 * nn if nn > 1 else 0) if kind == "all_reduce" else nn - 1
    return base + (nsteps - inter_steps) * intra + inter_steps * inter


def ring_plateau(v: Version, p: Platform, nbytes: int) -> float | None:
    """The ring Simple all-reduce latency factor across nodes in NCCL `v` before v2.18.1-1 (from nRanks / 16 x
    64 KiB, x 1.9 below sm90, else 1.5; 1.0 below that size); None: 2.30's rule."""
    if release(v) >= V2_18_1:
        return None
    if p.nnodes <= 1 or nbytes < p.nranks / 16.0 * 65536:
        return 1.0
    return RING_PLATEAU_2_17[0] if p.compcap < 90 else RING_PLATEAU_2_17[1]


def nvls_lat_us(v: Version, p: Platform) -> float | None:
    """One-node NVLS latency (µs) in NCCL `v`: 40 in v2.17, 23 in v2.18.1-1 to v2.20.5-1; None: 2.30's 25."""
    r = release(v)
    if p.nnodes > 1 or r >= V2_21_5:
        return None
    return [lat for first, lat in NVLS_LAT_US.items() if r >= first][-1]


def nvls_algbw(v: Version, kind: str, p: Platform, nch: int, bw_intra: float, bw_inter: float) -> float | None:
    """One-node NVLS algorithm bandwidth (GB/s) as NCCL v2.17.1-1 to v2.27.7-1 rate it, on the NVLS graph's `nch`
    channels (v2.17: the ring graph's); None: 2.30's."""
    r = release(v)
    if r >= V2_28_3 or nch < 2:
        return None
    ratio = NVLS_RATIO_2_17 if r < V2_18_3 else NVLS_RATIO
    cap = BUS_CAP_2_17.get(p.arch, math.inf) if r < V2_18_1 else math.inf  # v2.17 caps every algorithm's bus
    if kind == "all_reduce":
        return min(nch * (bw_intra if r < V2_19_1 else min(bw_intra, bw_inter)), cap) * ratio
    if r >= V2_27_3:
        return nch * min(bw_intra * (p.ppn - 1) / p.ppn, 0.9 * bw_inter)
    if r < V2_23_4:  # all-gather / reduce-scatter converted to algorithm bandwidth like all-reduce
        return min(nch * (bw_intra if r < V2_19_1 else min(bw_intra, bw_inter)), cap) * ratio
    return nch * min(bw_intra, bw_inter)  # bus = algorithm bandwidth in NCCL's model


def nvls_tree_rating(
    v: Version, p: Platform, nch: int, bw_intra: float, bw_inter: float, nsteps: int = 0
) -> tuple[float, float] | None:
    """(latency µs, algorithm bandwidth GB/s) of an NVLS-Tree all-reduce in NCCL `v` (`nsteps`: the ring's, for
    2.28-2.29's bus-to-algorithm ratio; 0: 2 (nRanks - 1)); None: 2.30's."""
    r = release(v)
    if p.nnodes < 2 or nch < 2 or r >= NVLS_TREE_MODEL_FROM or r < V2_18_1:
        return None
    log_nodes = int(math.log2(p.nnodes))
    if r < V2_19_1:
        bw = bw_intra if p.nnodes <= 2 else bw_inter
        ratio = 0.70 * p.nnodes / (2 * (p.nnodes - 1))
        return NVLS_TREE_BASE_US_2_18 + 2 * (p.nnodes - 1) * NVLS_TREE_NET_LAT_US_2_18, nch * bw * ratio
    if r < V2_28_3:
        bw = min(bw_intra, bw_inter if p.nnodes <= 2 else bw_inter / 2) * nch * NVLS_RATIO
        intra = NVLS_TREE_INTRA_LAT_US_2_19 if r < V2_21_5 else NVLS_TREE_INTRA_LAT_US
        return intra + 2 * log_nodes * NVLS_TREE_NET_LAT_US, bw
    blackwell_n4 = p.arch == "blackwell" and p.index2 == 2
    if r >= V2_28_9 and not blackwell_n4:
        return None
    net = NVLS_TREE_NET_LAT_US if r < V2_28_9 else T.HW_LAT["net"]["nvls_tree"][2]
    cap = T.PER_CH_MAX_NVLS_TREE_BW[p.arch][p.index2]
    if blackwell_n4:
        cap = [c for first, c in BLACKWELL_NVLS_TREE_N4 if r >= first][-1]
    intra_bw = bw_intra * T.NVLS_EFFICIENCY[p.arch] * (nch - 1) / nch  # as tuning.costs computes it, step by step
    intra_bw *= 2.0
    inter_bw = bw_inter * (2 if p.nnodes <= 2 else 1)
    bus = nch * min(intra_bw, inter_bw, cap)
    bus *= p.nranks / (nsteps or 2 * (p.nranks - 1))
    lat = T.BASE_LAT["nvls_tree"][2] + T.HW_LAT["nvlink"]["nvls_tree"][2] + 2 * log_nodes * net
    return lat, bus
