"""Which tree of NCCL's double binary tree, and which of the tree search's channels, each channel of a
communicator runs (connect.cc, v2.18.1-1 to v2.30.7-1: the same at every tag phantora models).

`ncclTopoPreset` builds a channel's chain inside the node from the tree graph's channel c (`treeIntra`), for the
search's `s` channels (`comm->nChannels` = min(tree, ring graph channels) then; the tree graph's minimum is the
ring graph's, so `s` is the ring graph's count). `ncclTopoPostset` then duplicates them: `connectTrees` gives
channel c tree 0 and its copy c + s tree 1, so tree 1 is the upper half of the 2s channels, not every other
channel. Later copies (`copyChannels(start, end)`: channel k copies k - start) repeat what they copy: the H100
doubling across nodes, and NCCL_MIN_NCHANNELS / NCCL_MIN_CTAS after NCCL_MAX_NCHANNELS / NCCL_MAX_CTAS cut the
channels (in the order `channels.comm_channels` applies them). A collective of k channels runs channels 0..k-1,
so a tree all-reduce on at most s channels runs tree 0 alone. Rings are duplicated and copied the same way
(connect.cc duplicates ringPrev / ringNext with the trees, and `copyChannels` copies both).

Before all that, the search's own duplication (search.cc `ncclTopoDupChannels`, v2.18.3-1 to v2.30.7-1) made
search channel g + f a copy of channel g of the f it found (`channels.found_channels`), so each channel's chain
inside a node, and the NIC it crosses the node by, is that of one of the f found channels (`chain_of`). Rail
hosts of one NIC per GPU find f a multiple of the GPUs per node (f = NICs x channels per NIC), and found channel
g's chain starts at GPU g mod m (trees: the host's GPUs rotated by g, `layout.tree_parents`; rings on NVSwitch hosts
NCCL's search's order from that GPU, `nvswitch_rings.py`, else rotated by g, `layout.ring_order`): so on the
default counts (2s, the H100 doubling, NCCL_MIN_CTAS from there) chain_of(c) = c mod GPUs, as before; it differs
where NCCL_MAX_NCHANNELS cuts the channels at a count that is not a multiple of the GPUs per node and a minimum
copies them again (NCCL_MAX_NCHANNELS=12 NCCL_MIN_NCHANNELS=24 on 8 GPUs: channel 12 runs chain 0, not 4).
"""

from __future__ import annotations

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.channels import found_channels, ring_graph
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.settings import NcclSettings


def origins(p: Platform, st: NcclSettings) -> tuple[int, ...]:
    """For each of the communicator's channels, the channel of the duplicated 2s it is (a copy of): c for
    c < 2s, c - start for a channel `copyChannels` added."""
    ring = ring_graph(p)
    s = max(1, ring.nchannels)
    ids = list(range(min(T.MAX_CHANNELS, 2 * s)))
    if p.compcap >= 90 and p.nnodes > 1 and ring.bw_intra > 45.0 and len(ids) < 16:
        ids += ids  # copyChannels(n, 2n)
    ids = ids[: max(1, st.max_channels)]
    start = len(ids)
    while len(ids) < max(st.min_channels, 1):
        ids.append(ids[len(ids) - start])
    return tuple(ids)


def search_channels(p: Platform) -> int:
    """s: the tree search's channels, each the origin of tree 0's channel c and tree 1's c + s."""
    return max(1, ring_graph(p).nchannels)


def chain_of(p: Platform, st: NcclSettings, channel: int) -> int:
    """The found search channel (before `ncclTopoDupChannels`) whose chain the communicator's `channel` runs, as a
    ring and as a tree (channels past the communicator's count wrap around it)."""
    ids = origins(p, st)
    g = ids[channel % len(ids)] % search_channels(p)
    f = found_channels(p)
    return g - f if g >= f else g


def tree_of(p: Platform, st: NcclSettings, channel: int) -> tuple[int, int]:
    """(tree 0 or 1, the found search channel whose chain it runs) of the communicator's `channel`."""
    ids = origins(p, st)
    return int(ids[channel % len(ids)] >= search_channels(p)), chain_of(p, st, channel)


def tree_counts(p: Platform, st: NcclSettings, channels: int) -> tuple[int, int]:
    """How many of channels 0..`channels`-1 run tree 0 and tree 1."""
    return tree_bytes(p, st, [1] * channels)


def tree_bytes(p: Platform, st: NcclSettings, shares: list[int]) -> tuple[int, int]:
    """Bytes on tree 0 and on tree 1 of a collective whose channel c carries `shares[c]`."""
    out = [0, 0]
    for c, size in enumerate(shares):
        out[tree_of(p, st, c)[0]] += size
    return out[0], out[1]
