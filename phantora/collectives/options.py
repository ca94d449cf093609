"""NCCL-like defaults: which algorithm `auto` means, and how many channels to open."""

from __future__ import annotations

import dataclasses

from phantora.collectives.layout import host_blocks, multi_host
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.errors import InputError
from phantora.topology.model import Topology

# Algorithms each kind accepts; the first is what `auto` means.
ALGORITHMS_OF = {
    "all_reduce": ("ring", "tree", "hierarchical"),
    "all_gather": ("ring",),
    "reduce_scatter": ("ring",),
    "broadcast": ("chain", "direct"),
    "reduce": ("chain", "direct"),
    "all_to_all": ("pairwise", "direct"),
    "send_recv": ("direct",),
    "barrier": ("tree",),
}
MAX_CHANNELS = 32  # NCCL's MAXCHANNELS
CHANNELS_PER_NIC = 2  # NCCL opens two rings per NIC on InfiniBand/RoCE systems
MIN_CHANNEL_BYTES = 64 * 1024  # a channel is opened only if it carries at least this much per rank
P2P_KINDS = ("all_to_all", "send_recv", "barrier")


def default_channels(coll: Collective, topo: Topology) -> int:
    """Channels NCCL would use, roughly.

    Each GPU endpoint has its own NIC, so the NICs one host gives the group are the group's ranks
    on that host (m; 1 without host information). Collectives get 2 channels per NIC: 2*m, at most
    32, and no more than leave MIN_CHANNEL_BYTES per rank in each channel (small messages use fewer
    channels). Peer-to-peer kinds and barrier use 1: each peer pair already has its own ECMP key.
    """
    if coll.kind in P2P_KINDS:
        return 1
    nodes = [topo.node_of_rank(r) for r in coll.ranks]
    m = max(len(block) for block in host_blocks(topo, nodes))
    want = min(MAX_CHANNELS, CHANNELS_PER_NIC * m)
    return max(1, min(want, coll.nbytes // (coll.size * MIN_CHANNEL_BYTES)))


def default_options(coll: Collective, topo: Topology, base: AlgoOptions) -> AlgoOptions:
    """`base` with `auto` and `channels=0` resolved for this collective on this topology.

    `auto` picks ring for all-reduce/all-gather/reduce-scatter (tree is opt-in), chain for
    broadcast/reduce, pairwise for all-to-all, direct for send_recv. `hierarchical` falls back to
    ring when the group does not span several hosts with the same number (>= 2) of ranks on each.
    An algorithm that does not apply to the kind is an InputError on field 'algorithm'.
    """
    allowed = ALGORITHMS_OF[coll.kind]
    algo = allowed[0] if base.algorithm == "auto" else base.algorithm
    if algo not in allowed:
        raise InputError(
            f"algorithm {algo!r} does not apply to {coll.kind} (choose auto or {', '.join(allowed)})",
            field="algorithm",
        )
    if algo == "hierarchical":
        nodes = [topo.node_of_rank(r) for r in coll.ranks]
        if not multi_host(host_blocks(topo, nodes)):
            algo = "ring"
    channels = base.channels or default_channels(coll, topo)
    return dataclasses.replace(base, algorithm=algo, channels=channels)
