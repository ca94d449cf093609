"""Which p2p channels NCCL runs a transfer on: its per-rank round schedule and the channel base of each round.

NCCL (init.cc `ncclP2pSchedule`) orders a rank's peers in rounds: round k sends to one peer and receives from
another. Inside one node the send peer of round k is local rank `(local + k) % nLocal`. Across nodes the ranks
are cut into groups of `NCCL_P2P_SCHEDULE_GROUP_SIZE` (8, or the gcd with each node's local ranks); group deltas
run in the quadratic order `(x*x + x)/2 mod pow2Up(nGroups)` (those >= nGroups skipped), and inside each group
delta the local delta runs 0..groupSize-1. A transfer of round k runs on channels `(base + part) & (nCh - 1)`
for its parts, where base is the round's base with its bits reversed over log2(nCh) bits (channel.h
`ncclP2pChannelBaseForRound`, device.h `ncclP2pChannelForPart`); nCh is the communicator's p2p channels.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from functools import lru_cache

P2P_PER_BATCH = 8  # NCCL_MAX_DEV_WORK_P2P_PER_BATCH, the default NCCL_P2P_SCHEDULE_GROUP_SIZE


def pow2_up(n: int) -> int:
    """NCCL's pow2Up: the least power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


def _reverse_bits(x: int, nbits: int) -> int:
    return int(format(x, f"0{nbits}b")[::-1], 2) if nbits > 0 else 0


def group_size(local_ranks: Sequence[int]) -> int:
    """NCCL's p2p schedule group size for nodes holding `local_ranks[i]` ranks each: the per-batch 8 across
    nodes (cut down to the gcd with a node's ranks that it does not divide), every local rank in one node."""
    if len(local_ranks) == 1:
        return local_ranks[0]
    g = P2P_PER_BATCH
    for n in local_ranks:
        if n % g != 0 or n < g:
            g = math.gcd(g, n)
    return g


def group_deltas(n_groups: int) -> list[int]:
    """The group deltas in NCCL's quadratic order: (x*x + x)/2 mod pow2Up(n), those >= n skipped."""
    p2 = pow2_up(n_groups)
    out, delta = [], 0
    for x in range(1, p2 + 1):
        if delta < n_groups:
            out.append(delta)
        delta = (delta + x) & (p2 - 1)
    return out


@lru_cache(maxsize=4096)
def send_rounds(nodes: tuple[Hashable, ...], me: int) -> tuple[int, ...]:
    """Position `me`'s send peer in each round (round 0: itself), for a communicator whose position i lives on
    node `nodes[i]`; a node's local ranks in order of position. Needs every node's ranks to be a multiple of the
    group size (NCCL fails otherwise; here the last group of a node is shorter)."""
    hosts: dict[Hashable, list[int]] = {}
    for pos, node in enumerate(nodes):
        hosts.setdefault(node, []).append(pos)
    members = list(hosts.values())  # node index (order of first appearance) -> its positions, local rank order
    g = group_size([len(m) for m in members])
    groups = [m[i : i + g] for m in members for i in range(0, len(m), g)]
    mine = next(k for k, grp in enumerate(groups) if me in grp)
    local = groups[mine].index(me)
    out: list[int] = []
    for gd in group_deltas(len(groups)):
        peers = groups[(mine + gd) % len(groups)]
        out.extend(peers[(local + d) % g] for d in range(g))
    return tuple(out)


def channel_base(round_: int, n_nodes: int, sched_group: int, p2p_channels: int) -> int:
    """The first p2p channel of round `round_` (NCCL's ncclP2pChannelBaseForRound)."""
    if n_nodes > 1:
        base = (round_ // sched_group) * -(-sched_group // P2P_PER_BATCH) + (round_ % sched_group) // P2P_PER_BATCH
    else:
        base = round_
    return _reverse_bits(base % p2p_channels, max(0, (p2p_channels - 1).bit_length()))


@lru_cache(maxsize=4096)
def round_bases(nodes: tuple[Hashable, ...], src: int, p2p_channels: int) -> dict[int, int]:
    """The first p2p channel of position `src`'s transfer to each peer position, by the round that sends to it
    (`nodes[i]`: the node, or host, of position i)."""
    n_nodes = len(set(nodes))
    sched = group_size([nodes.count(n) for n in dict.fromkeys(nodes)])
    out: dict[int, int] = {}
    for k, peer in enumerate(send_rounds(nodes, src)):
        if peer not in out:
            out[peer] = channel_base(k, n_nodes, sched, p2p_channels)
    return out


def transfer_channel_ids(nodes: tuple[Hashable, ...], src: int, dst: int, parts: int, p2p_channels: int) -> list[int]:
    """The p2p channels the `parts` parts of a transfer from position `src` to `dst` run on (`nodes[i]`: the
    node, or host, of position i)."""
    base = round_bases(nodes, src, p2p_channels)[dst]
    return [(base + part) & (p2p_channels - 1) for part in range(parts)]
