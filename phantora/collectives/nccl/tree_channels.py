"""Which tree of NCCL's double binary tree, and which of the tree search's channels, each channel of a
communicator runs (connect.cc, v2.18.1-1 to v2.30.7-1: the same at every tag phantora models).

`ncclTopoPreset` builds a channel's chain inside the node from the tree graph's channel c (`treeIntra`), for the
search's `s` channels (`comm->nChannels` = min(tree, ring graph channels) then; the tree graph's minimum is the
ring graph's, so `s` is the ring graph's count). `ncclTopoPostset` then duplicates them: `connectTrees` gives
channel c tree 0 and its copy c + s tree 1, so tree 1 is the upper half of the 2s channels, not every other
channel. Later copies (`copyChannels(start, end)`: channel k copies k - start) repeat what they copy: the H100
doubling across nodes, and NCCL_MIN_NCHANNELS / NCCL_MIN_CTAS after NCCL_MAX_NCHANNELS / NCCL_MAX_CTAS cut the
channels (in the order `channels.comm_channels` applies them). A collective of k channels runs channels 0..k-1,
so a tree all-reduce on at most s channels runs tree 0 alone. Not restated: the search's own duplication
(`ncclTopoDupChannels`: search channel g + s/2 a copy of g, the same chain), so a duplicated search channel's chain
is rotated by its own index here, not its original's.
"""

from __future__ import annotations

from phantora.collectives.nccl import tables as T
from phantora.collectives.nccl.channels import ring_graph
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


def tree_of(p: Platform, st: NcclSettings, channel: int) -> tuple[int, int]:
    """(tree 0 or 1, the search channel whose chain it runs) of the communicator's `channel` (channels past the
    communicator's count wrap around it)."""
    ids = origins(p, st)
    s = search_channels(p)
    o = ids[channel % len(ids)]
    return int(o >= s), o % s


def tree_bytes(p: Platform, st: NcclSettings, shares: list[int]) -> tuple[int, int]:
    """Bytes on tree 0 and on tree 1 of a collective whose channel c carries `shares[c]`."""
    out = [0, 0]
    for c, size in enumerate(shares):
        out[tree_of(p, st, c)[0]] += size
    return out[0], out[1]
