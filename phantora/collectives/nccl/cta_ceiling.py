"""NCCL's per-channel protocol ceilings when more CTAs run than NCCL's model counts.

tuning.cc caps the bandwidth of some (algorithm, protocol) pairs at a per-channel ceiling times the channels of the
search graph (`graphs[a]->nChannels`): ring LL128 at `perChMaxRingLL128Bw`, tree all-reduce at `perChMaxTreeBw`,
tree LL128 at `perChMaxTreeLL128Bw` (v2.21.5-1 to v2.30.7-1, src/graph/tuning.cc `ncclTopoTuneModel`). The ceiling
is a channel's copy rate (its CTA's warps writing and polling lines), measured on NCCL's default launch, where the
communicator runs a fixed number of CTAs per search channel (`connectRings`, `ncclTopoPostset`). A user who forces
more channels (NCCL_MIN_NCHANNELS, NCCL_MIN_CTAS: the extra channels copy the first ones, connect.cc) runs more
CTAs, each with its own copy rate, while NCCL's model, and so its choice, still counts the graph's channels. The
ceiling then scales with the CTAs that run over NCCL's default count; the graph's own rate (its channels times
their bandwidth, the NICs' share: `busBw * 0.92` for LL128's 120 of 128 bytes) still bounds it.

`channel_limit` (tuning.py) is the converse: fewer channels than the default, every algorithm scaled down.
"""

from __future__ import annotations

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.platform import Platform

RING_LL128_FACTOR = 0.92  # tuning.cc: ring LL128 keeps 0.92 of the graph's rate (its comment: 120.0/128.0)
TREE_FACTOR = 0.92  # tuning.cc: tree all-reduce keeps 0.92 of the graph's rate


def has_ceiling(algo: str, proto: str) -> bool:
    """Whether tuning.cc caps (algo, proto) of an all-reduce at per-channel ceilings only (tree LL's is `llMaxBw`)."""
    return (algo == "ring" and proto == "LL128") or (algo == "tree" and proto in ("LL128", "Simple"))


def capped_bus_bw(
    algo: str, proto: str, p: Platform, graph_bus: float, graph_channels: int, scale: float = 1.0
) -> float:
    """tuning.cc's bus bandwidth (GB/s) of an all-reduce's (algo, proto) from the graph's rate `graph_bus` (its
    channels x per-channel GB/s) after the per-channel ceilings, each times `scale` (at least 1; 1 = NCCL's default
    CTAs). Ring LL128 and tree (every protocol: tree LL's own ÷3.8 follows in `costs`); other pairs unchanged."""
    s = max(1.0, scale)
    ix = p.index2
    if algo == "ring" and proto == "LL128":
        return min(graph_bus * RING_LL128_FACTOR, graph_channels * T.PER_CH_MAX_RING_LL128_BW[p.arch] * s)
    if algo != "tree":
        return graph_bus
    bus = min(graph_bus * TREE_FACTOR, graph_channels * T.PER_CH_MAX_TREE_BW[p.arch][ix] * s)
    if proto == "LL128":
        factor = 7.0 / 9.0 if p.nnodes == 1 else 120.0 / 128.0
        bus = min(bus * factor, graph_channels * T.PER_CH_MAX_TREE_LL128_BW[p.arch][ix] * s)
    return bus


def raised_bus_bw(algo: str, proto: str, p: Platform, graph_bus: float, graph_channels: int, scale: float) -> float:
    """Bus bandwidth (GB/s) of a per-channel-capped ring LL128 or tree LL128/Simple all-reduce when its CTAs are
    `scale` times NCCL's default (`capped_bus_bw`). 0 for a pair without such a ceiling."""
    if not has_ceiling(algo, proto):
        return 0.0
    return capped_bus_bw(algo, proto, p, graph_bus, graph_channels, scale)
