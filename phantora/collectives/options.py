"""NCCL-like defaults: which algorithm `auto` means, and how many channels to open."""

from __future__ import annotations

import dataclasses

from phantora.collectives.layout import host_blocks, multi_host
from phantora.collectives.nccl import Choice, choose, nccl_chunk
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.errors import InputError
from phantora.topology.model import Topology

# Algorithms each kind accepts; the first is what `auto` means.
ALGORITHMS_OF = {
    "all_reduce": ("ring", "tree", "hierarchical", "nvls", "nvls_tree"),
    "all_gather": ("ring", "nvls", "pat"),
    "reduce_scatter": ("ring", "nvls", "pat"),
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
DEFAULT_CHUNK = AlgoOptions().chunk_bytes


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


FROM_NCCL = {
    "ring": "ring",
    "tree": "tree",
    "nvls": "nvls",
    "nvls_tree": "nvls_tree",
    "pat": "pat",
    "p2p": "direct",
    "sym": "sym",  # a symmetric kernel (-R 2; nccl/register.py)
    "ce": "ce",  # the copy engines (-R 2 -x 2; nccl/ce_coll.py)
}


def default_options(coll: Collective, topo: Topology, base: AlgoOptions) -> AlgoOptions:
    """`base` with `auto` and `channels=0` resolved for this collective on this topology (see `resolve`)."""
    return resolve(coll, topo, base)[0]


def resolve(coll: Collective, topo: Topology, base: AlgoOptions) -> tuple[AlgoOptions, Choice | None]:
    """`base` resolved for this collective, and NCCL's choice behind it (None under the ideal model).

    NCCL model: the algorithm, protocol and channels NCCL would pick (restricted by a non-auto algorithm or
    protocol); all-to-all and send/recv run NCCL's grouped p2p (every peer at once: `direct`).
    Ideal model: `auto` picks ring for all-reduce/all-gather/reduce-scatter (tree is opt-in), chain for
    broadcast/reduce, pairwise for all-to-all, direct for send_recv. `hierarchical` falls back to
    ring when the group does not span several hosts with the same number (>= 2) of ranks on each.
    An algorithm that does not apply to the kind is an InputError on field 'algorithm'.
    """
    allowed = ALGORITHMS_OF[coll.kind]
    if base.algorithm != "auto" and base.algorithm not in allowed:
        raise InputError(
            f"algorithm {base.algorithm!r} does not apply to {coll.kind} (choose auto or {', '.join(allowed)})",
            field="algorithm",
        )
    choice = choose(coll, topo, base)
    if choice is not None:
        algo = FROM_NCCL[choice.algorithm]
        if algo == "ring" and coll.kind in ("broadcast", "reduce"):
            algo = "chain"
        channels = base.channels or choice.channels  # p2p: the channels (queue pairs) of each peer's transfer
        chunk = base.chunk_bytes
        if base.granularity == "chunked" and chunk == DEFAULT_CHUNK:  # NCCL's own step for the protocol
            chunk = nccl_chunk(coll, topo, base, choice)
        resolved = dataclasses.replace(
            base, algorithm=algo, channels=channels, protocol=choice.protocol, chunk_bytes=chunk
        )
        return resolved, choice
    algo = allowed[0] if base.algorithm == "auto" else base.algorithm
    if algo in ("nvls", "nvls_tree", "pat"):
        raise InputError(f"algorithm {algo!r} needs the NCCL model (model=nccl)", field="algorithm")
    if algo == "hierarchical":
        nodes = [topo.node_of_rank(r) for r in coll.ranks]
        if not multi_host(host_blocks(topo, nodes)):
            algo = "ring"
    channels = base.channels or default_channels(coll, topo)
    return dataclasses.replace(base, algorithm=algo, channels=channels), None
