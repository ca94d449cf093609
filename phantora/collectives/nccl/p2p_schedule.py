"""Which p2p channels NCCL runs a transfer on: its per-rank round schedule and the channel base of each round.

NCCL orders a rank's peers in rounds (round k: a send to one peer, a receive from its mirror); a transfer's parts
then run on channels from a base. Read at every release tag v2.17.1-1 .. v2.30.7-1 (init.cc, channel.h, device.h,
paths.cc), the forms are, by the tags that hold them (`p2p_form`, the one switch):

- **paired** (v2.17.1-1 .. v2.21.5-1, init.cc "Setup p2p structures"): node deltas d, -d, n/2 - d, -(n/2 - d) for
  d = 0 .. nNodes/4, a repeat skipped (0, 8, 1, 15, 7, 9, 2, 14, ... for 16 nodes); inside each, local step s =
  0 .. steps-1 to local rank (local + s) % steps, a rank a node lacks skipped (steps: maxLocalRanks in v2.17.1-1,
  ALIGN_POWER(maxLocalRanks, 8) from v2.18.1-1; the order of the peers is the same). The base is the peer's, not
  the round's (channel.h `ncclChannelComputeBase`): its node delta + its local step / 8 across nodes, its step on
  one node (deltas and steps taken linearly, mod nNodes and maxLocalRanks); part c runs on
  (mirrorBits(base % nCh) + c) % nCh (`p2pChannels[]`, paths.cc).
- **quadratic** (v2.22.3-1 .. v2.28.3-1, `do { // Build p2p schedule`): node deltas (x*x + x)/2 mod pow2Up(nNodes),
  those >= nNodes skipped, and inside each the local deltas the same way mod pow2Up(nLocals); nodes of unequal
  ranks make it flat (one node of all ranks). Round k's base: (k / maxLocalRanks) * divUp(maxLocalRanks, 8) +
  (k % maxLocalRanks) / 8 across nodes, k on one node. v2.22.3-1 .. v2.27.7-1 run part c on (base +
  reverseBits(c)) & (nCh - 1) (device.h `ncclP2pChannelForPart`); v2.28.3-1 reverses the base instead and runs
  part c on (reverseBits(base) + c) & (nCh - 1).
- **grouped** (v2.28.7-1 on, `ncclP2pSchedule`): ranks cut into groups of NCCL_P2P_SCHEDULE_GROUP_SIZE (init.cc's
  `NCCL_PARAM(GroupSize, ...)`, default NCCL_MAX_DEV_WORK_P2P_PER_BATCH = 8; `group` here, settings.py reads it),
  cut to its gcd with each node's ranks that it does not divide or exceeds; group deltas in the quadratic order mod
  pow2Up(nGroups), and inside each the local deltas 0 .. groupSize-1 in turn. v2.28.7-1 cuts one node into groups
  too; from v2.28.9-1 one node is one group (maxLocalRanks: the variable is not read). Round k's base: (k /
  groupSize) * divUp(groupSize, 8) + (k % groupSize) / 8 across nodes, k on one node, bit-reversed; part c on
  (base + c) & (nCh - 1).

Bits are reversed over log2(nCh) bits; nCh is the communicator's p2p channels (a power of two).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.old_tuners import Version, release

P2P_PER_BATCH = 8  # NCCL_MAX_DEV_WORK_P2P_PER_BATCH (NCCL_MAX_WORK_ELEMENTS_P2P / 2 before 2.22), the group size
LATEST: Version = T.MODEL_NCCL_VERSION  # the NCCL the model restates: its minor's newest release


@dataclass(frozen=True)
class P2pForm:
    """One NCCL release's p2p round schedule and channel mapping (the module docstring's forms)."""

    order: str  # "paired", "quadratic" or "grouped"
    part_reversed: bool = False  # quadratic, v2.22.3-1 .. v2.27.7-1: a part's offset reversed, the base not
    node_group: bool = True  # grouped, v2.28.9-1 on: one node's ranks are one group on a one-node communicator


# (first tag, its form); each holds until the next entry's tag
FORMS: tuple[tuple[tuple[int, int, int], P2pForm], ...] = (
    ((2, 17, 1), P2pForm("paired")),
    ((2, 22, 3), P2pForm("quadratic", part_reversed=True)),
    ((2, 28, 3), P2pForm("quadratic")),
    ((2, 28, 7), P2pForm("grouped", node_group=False)),
    ((2, 28, 9), P2pForm("grouped")),
)


def p2p_form(v: Version) -> P2pForm:
    """The form of NCCL `v` ((major, minor) or a patch 0: that minor's newest release)."""
    r, form = release(v), FORMS[0][1]
    for tag, later in FORMS:
        if r >= tag:
            form = later
    return form


def pow2_up(n: int) -> int:
    """NCCL's pow2Up: the least power of two >= n (1 for n <= 1)."""
    return 1 << max(0, n - 1).bit_length()


def _reverse_bits(x: int, nbits: int) -> int:
    """NCCL's reverseBits / mirrorBits: the low `nbits` bits of x in reverse order."""
    return int(format(x % (1 << nbits), f"0{nbits}b")[::-1], 2) if nbits > 0 else 0


def _bits(p2p_channels: int) -> int:
    return max(0, (p2p_channels - 1).bit_length())


def group_size(local_ranks: Sequence[int], node_group: bool = True, group: int = P2P_PER_BATCH) -> int:
    """The grouped form's group size for nodes holding `local_ranks[i]` ranks each: `group`
    (NCCL_P2P_SCHEDULE_GROUP_SIZE, 8 by default), cut down to its gcd with each node's ranks it does not divide or
    exceeds, node by node as init.cc does; one node is one group where `node_group` (v2.28.9-1 on)."""
    if len(local_ranks) == 1 and node_group:
        return local_ranks[0]
    if group < 1:
        raise ValueError(f"a p2p schedule group of {group} ranks (NCCL divides by it)")
    g = group
    for n in local_ranks:
        if n % g != 0 or n < g:
            g = math.gcd(g, n)
    return g


def group_deltas(n_groups: int) -> list[int]:
    """The deltas in NCCL's quadratic order: (x*x + x)/2 mod pow2Up(n), those >= n skipped."""
    p2 = pow2_up(n_groups)
    out, delta = [], 0
    for x in range(1, p2 + 1):
        if delta < n_groups:
            out.append(delta)
        delta = (delta + x) & (p2 - 1)
    return out


def paired_deltas(n_nodes: int) -> list[int]:
    """The node deltas of the paired form (2.17 - 2.21): d, -d, n/2 - d, -(n/2 - d) for d = 0 .. n/4, each
    skipped as init.cc skips a repeat."""
    n, out = n_nodes, []
    for d in range(n // 4 + 1):
        deltas = (d, (n - d) % n, n // 2 - d, (n - (n // 2 - d)) % n)
        index = 0
        while index < 4:
            out.append(deltas[index])
            index += 1
            if index == 1 and deltas[1] == deltas[0]:
                index += 1
            if index == 2 and deltas[2] == deltas[0]:
                index += 1
            if index == 3 and deltas[3] == deltas[2]:
                index += 1
            if index == 3 and deltas[3] == deltas[1]:
                index += 1
    return out


def _members(nodes: tuple[Hashable, ...]) -> list[list[int]]:
    """Each node's positions (nodes in order of their first position), in local rank order."""
    hosts: dict[Hashable, list[int]] = {}
    for pos, node in enumerate(nodes):
        hosts.setdefault(node, []).append(pos)
    return list(hosts.values())


def _where(members: list[list[int]], me: int) -> tuple[int, int]:
    """(node index, local rank) of position `me`."""
    return next((i, m.index(me)) for i, m in enumerate(members) if me in m)


def _paired_rounds(members: list[list[int]], me: int) -> list[int]:
    """The paired form's send peers in order (a step to a rank its node lacks skipped)."""
    node, local = _where(members, me)
    steps = max(map(len, members))
    out: list[int] = []
    for delta in paired_deltas(len(members)):
        peers = members[(node + delta) % len(members)]
        out.extend(peers[i] for i in ((local + s) % steps for s in range(steps)) if i < len(peers))
    if sorted(out) != list(range(sum(map(len, members)))):
        raise ValueError(f"the paired p2p schedule of {len(members)} nodes misses a peer (NCCL asserts here too)")
    return out


def _quadratic_rounds(members: list[list[int]], me: int) -> list[int]:
    """The quadratic form's send peers by round: node deltas, then local deltas, both quadratic (flat over all
    positions when nodes hold unequal ranks)."""
    if len({len(m) for m in members}) > 1:
        members = [[pos for m in members for pos in m]]
        members[0].sort()
    node, local = _where(members, me)
    n_local = len(members[0])
    out: list[int] = []
    for nd in group_deltas(len(members)):
        peers = members[(node + nd) % len(members)]
        out.extend(peers[(local + ld) % n_local] for ld in group_deltas(n_local))
    return out


def _grouped_rounds(members: list[list[int]], me: int, node_group: bool, group: int) -> list[int]:
    """The grouped form's send peers by round: group deltas quadratic, local deltas in turn inside each group.
    Needs every node's ranks to be a multiple of the group size (NCCL fails otherwise; here the last group of a
    node is shorter)."""
    g = group_size([len(m) for m in members], node_group, group)
    groups = [m[i : i + g] for m in members for i in range(0, len(m), g)]
    mine = next(k for k, grp in enumerate(groups) if me in grp)
    local = groups[mine].index(me)
    out: list[int] = []
    for gd in group_deltas(len(groups)):
        peers = groups[(mine + gd) % len(groups)]
        out.extend(peers[(local + d) % g] for d in range(g))
    return out


@lru_cache(maxsize=4096)
def send_rounds(
    nodes: tuple[Hashable, ...], me: int, v: Version = LATEST, group: int = P2P_PER_BATCH
) -> tuple[int, ...]:
    """Position `me`'s send peer in each round (round 0: itself) under NCCL `v`'s form, for a communicator whose
    position i lives on node `nodes[i]`; a node's local ranks in order of position. `group`:
    NCCL_P2P_SCHEDULE_GROUP_SIZE (the grouped form's only)."""
    members = _members(nodes)
    form = p2p_form(v)
    if form.order == "paired":
        return tuple(_paired_rounds(members, me))
    if form.order == "quadratic":
        return tuple(_quadratic_rounds(members, me))
    return tuple(_grouped_rounds(members, me, form.node_group, group))


def channel_base(round_: int, n_nodes: int, sched_group: int, p2p_channels: int, reverse: bool = True) -> int:
    """The first p2p channel of round `round_` (channel.h `ncclP2pChannelBaseForRound`, 2.22+): one base per 8
    rounds of a delta of `sched_group` rounds across nodes, the round on one node; bit-reversed where `reverse`
    (v2.28.3-1 on), else as it is (mod the channels)."""
    if n_nodes > 1:
        base = (round_ // sched_group) * -(-sched_group // P2P_PER_BATCH) + (round_ % sched_group) // P2P_PER_BATCH
    else:
        base = round_
    return _reverse_bits(base, _bits(p2p_channels)) if reverse else base % p2p_channels


def peer_base(members: list[list[int]], src: int, dst: int, p2p_channels: int) -> int:
    """The first p2p channel of a transfer from `src` to `dst` in the paired form (channel.h
    `ncclChannelComputeBase`, then `p2pChannels[base % nCh]`): the linear node delta + local step / 8 across nodes,
    the step on one node, mirrored."""
    (sn, sl), (dn, dl) = _where(members, src), _where(members, dst)
    step = (dl - sl) % max(map(len, members))
    base = (dn - sn) % len(members) + step // P2P_PER_BATCH if len(members) > 1 else step
    return _reverse_bits(base, _bits(p2p_channels))


def _round_group(members: list[list[int]], form: P2pForm, group: int) -> int:
    """Rounds of one delta in `ncclP2pChannelBaseForRound`: maxLocalRanks (quadratic), the group size (grouped:
    comm->p2pSchedGroupSize, from `group`)."""
    if form.order == "quadratic":
        return max(map(len, members))
    return group_size([len(m) for m in members], form.node_group, group)


@lru_cache(maxsize=4096)
def round_bases(
    nodes: tuple[Hashable, ...], src: int, p2p_channels: int, v: Version = LATEST, group: int = P2P_PER_BATCH
) -> dict[int, int]:
    """The base channel of position `src`'s transfer to each peer position under NCCL `v` (`nodes[i]`: the node,
    or host, of position i): the round's (2.22+) or the peer's (before); `group` as `send_rounds`."""
    members = _members(nodes)
    form = p2p_form(v)
    if form.order == "paired":
        return {dst: peer_base(members, src, dst, p2p_channels) for dst in range(len(nodes))}
    per_delta = _round_group(members, form, group)
    out: dict[int, int] = {}
    for k, peer in enumerate(send_rounds(nodes, src, v, group)):
        if peer not in out:
            out[peer] = channel_base(k, len(members), per_delta, p2p_channels, reverse=not form.part_reversed)
    return out


def transfer_channel_ids(
    nodes: tuple[Hashable, ...],
    src: int,
    dst: int,
    parts: int,
    p2p_channels: int,
    v: Version = LATEST,
    group: int = P2P_PER_BATCH,
) -> list[int]:
    """The p2p channels the `parts` parts of a transfer from position `src` to `dst` run on under NCCL `v`
    (`nodes[i]`: the node, or host, of position i): part c on base + c, or base + reverseBits(c) (2.22 - 2.27);
    `group` as `send_rounds`."""
    base = round_bases(nodes, src, p2p_channels, v, group)[dst]
    if p2p_form(v).part_reversed:
        return [(base + _reverse_bits(c, _bits(p2p_channels))) & (p2p_channels - 1) for c in range(parts)]
    return [(base + c) & (p2p_channels - 1) for c in range(parts)]
