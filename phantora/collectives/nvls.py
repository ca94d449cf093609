"""NVLink SHARP (NVLS): the NVSwitch reduces and multicasts, so each GPU's NVLink carries NVLS's bytes, not a ring's.

All-reduce inside a node of m GPUs: each GPU owns slice S/m. Reduce-scatter by multimem load-reduce: the switch
reads every GPU's copy of each slice (each GPU sends S up) and returns the reduced slice to its owner (S/m down);
all-gather by multimem store: each owner writes its slice once (S/m up) and the switch multicasts it to every GPU
(S down). Per GPU: S (m+1)/m up and S (m+1)/m down, against a ring's 2 (m-1)/m S each way.

Flows join endpoints, and the switch's reduction and multicast happen inside the path. On an NVSwitch a flow from
GPU a to GPU b loads only a's uplink and b's downlink, so NVLS is written as m flows per node, GPU i to GPU i+1
(mod m), each of S (m+1)/m bytes: every GPU's uplink and downlink then carry exactly the NVLS bytes, with m flows
instead of m (m-1). All-gather and reduce-scatter (S/m up, S down; S up, S/m down) use (m-1)/m S per flow: the
direction that bounds them (down for all-gather, up for reduce-scatter) carries its (m-1)/m S; the other is
overstated, which costs nothing on an NVSwitch where each GPU has its own link each way.

NVLS-Tree (several nodes): NVLS all-reduce inside each node on the data, and between nodes, for each local index
i, a double binary tree all-reduce of slice i (S/m) over the NICs of the nodes' GPU i.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from phantora.collectives.dag import DagBuilder, split
from phantora.collectives.layout import dbt_parents
from phantora.collectives.nccl import tables as T
from phantora.collectives.tree import tree_flows


def nvls_link_bytes(kind: str, nbytes: int, m: int) -> int:
    """Bytes each GPU's NVLink carries each way in NVLS inside a node of m GPUs (the bounding direction for
    all-gather and reduce-scatter). All-reduce: a head GPU's, S (h+1)/h with h = min(m, NCCL_MAX_NVLS_ARITY) heads
    (NCCL's NVLS graph has at most 32: `nccl.channels.nvls_heads`); the other m - h GPUs carry S, overstated here."""
    if kind == "all_reduce":
        h = min(m, T.NVLS_MAX_ARITY)
        return -(-nbytes * (h + 1) // h)
    return -(-nbytes * (m - 1) // m)


def nvls_flows(
    b: DagBuilder, kind: str, blocks: list[list[int]], nbytes: int, name: str = "nvls", loops: int = 1
) -> None:
    """NVLS inside each host block (all-reduce, all-gather or reduce-scatter): GPU i to GPU i+1 of its node.
    `loops` (the chunked granularity): NCCL's nLoops, each moving every operation's chunk, one after another."""
    for h, block in enumerate(blocks):
        m = len(block)
        if m < 2:
            continue
        size = nvls_link_bytes(kind, nbytes, m)
        for i, pos in enumerate(block):
            b.add_chunks(pos, block[(i + 1) % m], split(size, loops), f"{name}/h{h}", 0)


def nvls_loops(nbytes: int, channels: int, heads: int, chunk: int) -> int:
    """NCCL's nLoops of NVLS and NVLS-Tree (`calcCollChunking`): a loop moves a chunk per channel and head."""
    return max(1, -(-nbytes // max(1, channels * heads * chunk)))


def nvls_tree_flows(
    b: DagBuilder,
    blocks: list[list[int]],
    nbytes: int,
    channels: int,
    loops: int = 1,
    window: int = 1,
    head_loops: list[list[list[int]]] | None = None,
) -> None:
    """NVLS-Tree all-reduce: NVLS in every node, and per local index a double binary tree across the nodes.
    `head_loops` (chunked): per channel c, per head GPU h, the bytes of each of its loops (`nccl.nvls_tree_loops.
    head_loops`): the hosts' GPU h runs tree c % 2 of the double binary tree on channel c, a flow a loop on each edge
    up and down, its own connection's `window` chunks in flight (`tree_flows`; NCCL_STEPS under NCCL's model, each
    across hosts gated by its receiver's clear-to-send), as NCCL's kernel moves them (`nvls_tree_loops`), each loop
    after its host's NVLS reduce of it and before its host's NVLS multicast of it (`_chunked`). None (coarse): NVLS
    in every node (`loops`: NCCL's nLoops, each a chunk on every NVLS flow, in turn) and, per local index and tree,
    one flow an edge and phase of half the index's slice, on channel 2i + t, all side by side (the order of the
    stages is the pipeline's fill, `nccl.pipeline`)."""
    m = min(len(blk) for blk in blocks)
    hosts = len(blocks)
    n = sum(len(blk) for blk in blocks)

    def parent_of(i: int, t: int) -> list[int | None]:
        """Tree t of the hosts' GPU i (the others outside it)."""
        parent: list[int | None] = [None] * n
        for h, pu in enumerate(dbt_parents(hosts, t)):
            parent[blocks[h][i]] = None if pu is None else blocks[pu][i]
        return parent

    if head_loops is not None:
        _chunked(b, blocks, nbytes, head_loops, window, parent_of)
        return
    nvls_flows(b, "all_reduce", blocks, nbytes, name="nvls_tree/intra", loops=loops)
    for i, part in enumerate(split(nbytes, m)):
        for t, half in enumerate(split(part, 2)):
            channel = (2 * i + t) % max(1, channels)
            tree_flows(b, parent_of(i, t), half, channel, up=True, down=True, chunked=loops > 1,
                       chunk_bytes=max(1, -(-half // loops)), step_delay_ns=0,
                       name=f"nvls_tree/inter{i}/t{t}", window=window)  # fmt: skip


def loop_bytes(head_loops: list[list[list[int]]], heads: int) -> list[int]:
    """Per loop k, the bytes a host's NVLS reduces in it: the chunks of loop k of every channel's first `heads`
    head GPUs."""
    out: list[int] = []
    for per_head in head_loops:
        for pieces in per_head[:heads]:
            out.extend([0] * (len(pieces) - len(out)))
            for k, size in enumerate(pieces):
                out[k] += size
    return out


def loop_link_bytes(loops: list[int], nbytes: int, m: int) -> tuple[list[int], list[int]]:
    """Per loop, the bytes on each NVLS flow of a host of m GPUs (GPU i to i+1) for the reduce (the loop's data:
    every GPU's NVLink up carries its copy of every chunk) and for the multicast (the rest of the loop's share of
    `nvls_link_bytes`: a head stores its reduced chunks once), so that a flow carries the coarse flow's bytes in
    all."""
    total = sum(loops)
    extra = nvls_link_bytes("all_reduce", nbytes, m) - nbytes
    reduce = list(loops)
    if reduce:
        reduce[-1] += nbytes - total  # (the loops hold the bytes; any rounding goes to the last)
    ends = list(itertools.accumulate(reduce))
    cut = [0] + [end * extra // max(1, nbytes) for end in ends]
    return reduce, [cut[k + 1] - cut[k] for k in range(len(reduce))]


def _chunked(
    b: DagBuilder,
    blocks: list[list[int]],
    nbytes: int,
    head_loops: list[list[list[int]]],
    window: int,
    parent_of: Callable[[int, int], list[int | None]],
) -> None:
    """Chunked NVLS-Tree in the order of NCCL's kernel (src/device/all_reduce.h, NCCL_ALGO_NVLS_TREE, v2.18.5-1 to
    v2.30.7-1): a head's reduce warps load-reduce loop k's chunk through the switch and send it up the tree in one
    primitive call (at the root: reduce and send it down), and its broadcast warps take the tree's chunk back and
    store it as a multicast in one call. So per host and loop k: the NVLS reduce flows of the loop (one chain a
    GPU, loop after loop), then the tree's loop-k chunks from that host (they wait for the host's reduce of loop
    k, `tree_flows` `ready`), then the NVLS multicast flows of the loop once every channel's and head's chunk k is
    back at the host (at the root: up from its children, `tree_flows` `landed`)."""
    m = min(len(blk) for blk in blocks)
    n = sum(len(blk) for blk in blocks)
    data = loop_bytes(head_loops, m)
    count = len(data)
    reduced: list[list[int | None]] = []  # per host, per loop: the join of its NVLS reduce flows
    shares: list[list[int]] = []  # per host, per loop: the multicast bytes a flow carries
    for h, block in enumerate(blocks):
        if len(block) < 2:
            reduced.append([None] * count)
            shares.append([])
            continue
        reduce, multicast = loop_link_bytes(data, nbytes, len(block))
        shares.append(multicast)
        chains = [
            b.add_chunks(
                pos, block[(i + 1) % len(block)], reduce, f"nvls_tree/intra/h{h}/reduce", 0, ready=[()] * count
            )
            for i, pos in enumerate(block)
        ]
        reduced.append(
            [
                b.join(block[0], tuple(c[k] for c in chains), f"nvls_tree/intra/h{h}/reduce/loop{k}/done")
                for k in range(count)
            ]
        )
    host_of = {pos: h for h, block in enumerate(blocks) for pos in block}
    ready = [[() if (j := reduced[host_of[v]][k]) is None else (j,) for k in range(count)] for v in range(n)]
    back: list[list[list[int]]] = [[[] for _ in range(count)] for _ in blocks]  # per host, loop: tree chunks in
    for c, heads in enumerate(head_loops):
        for i, pieces in enumerate(heads[:m]):
            if not pieces:
                continue
            landed: list[list[tuple[int, ...]]] = [[] for _ in range(n)]
            tree_flows(b, parent_of(i, c % 2), sum(pieces), c, up=True, down=True, chunked=True,
                       chunk_bytes=max(1, *pieces), step_delay_ns=0, name=f"nvls_tree/inter{i}/t{c % 2}",
                       window=window, pieces=pieces, ready=ready, landed=landed)  # fmt: skip
            for h, block in enumerate(blocks):
                for k, deps in enumerate(landed[block[i]]):
                    back[h][k].extend(deps)
    for h, block in enumerate(blocks):
        if len(block) < 2:
            continue
        after = [
            b.join(
                block[0],
                tuple(back[h][k]) or tuple(x for x in (reduced[h][k],) if x is not None),
                f"nvls_tree/intra/h{h}/tree/loop{k}/back",
            )
            for k in range(count)
        ]
        for i, pos in enumerate(block):
            b.add_chunks(pos, block[(i + 1) % len(block)], shares[h], f"nvls_tree/intra/h{h}/multicast", 0,
                         ready=[(j,) for j in after])  # fmt: skip
