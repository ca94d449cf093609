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

import bisect
import itertools
from collections.abc import Callable, Iterator

from phantora.collectives.back_pressure import Credits
from phantora.collectives.dag import DagBuilder, split
from phantora.collectives.layout import children_of, dbt_parents
from phantora.collectives.nccl import tables as T
from phantora.collectives.tree import tree_flows, tree_steps


def nvls_link_bytes(kind: str, nbytes: int, m: int) -> int:
    """Bytes each GPU's NVLink carries each way in NVLS inside a node of m GPUs (the bounding direction for
    all-gather and reduce-scatter). All-reduce: a head GPU's, S (h+1)/h with h = min(m, NCCL_MAX_NVLS_ARITY) heads
    (NCCL's NVLS graph has at most 32: `nccl.channels.nvls_heads`); the other m - h GPUs carry S, overstated here."""
    if kind == "all_reduce":
        h = min(m, T.NVLS_MAX_ARITY)
        return -(-nbytes * (h + 1) // h)
    return -(-nbytes * (m - 1) // m)


def nvls_flows(
    b: DagBuilder,
    kind: str,
    blocks: list[list[int]],
    nbytes: int,
    name: str = "nvls",
    loops: int = 1,
    head_loops: list[list[list[int]]] | None = None,
) -> None:
    """NVLS inside each host block (all-reduce, all-gather or reduce-scatter): GPU i to GPU i+1 of its node.
    `loops` (the chunked granularity): NCCL's nLoops, each moving every operation's chunk, one after another, the
    bytes split evenly. `head_loops` (chunked, in place of `loops`): per channel, per head, the bytes of each of
    NCCL's loops (`nccl.nvls_loops`), each loop a flow a GPU (all-reduce: `head_link_bytes`; all-gather and
    reduce-scatter, one head a channel: m - 1 times the loop's bytes of a rank's block)."""
    for h, block in enumerate(blocks):
        m = len(block)
        if m < 2:
            continue
        if head_loops is not None:
            if kind == "all_reduce":
                links = head_link_bytes(head_loops, m)
            else:  # each loop's blocks: one GPU's up, the m - 1 others' down (`nvls_link_bytes`)
                links = [[(m - 1) * d for d in loop_bytes(head_loops, 1)] or [0]] * m
            for i, sizes in enumerate(links):
                b.add_chunks(block[i], block[(i + 1) % m], sizes, f"{name}/h{h}", 0)
            continue
        size = nvls_link_bytes(kind, nbytes, m)
        for i, pos in enumerate(block):
            b.add_chunks(pos, block[(i + 1) % m], split(size, loops), f"{name}/h{h}", 0)


def head_link_bytes(head_loops: list[list[list[int]]], m: int) -> list[list[int]]:
    """Per GPU i of a host of m, the bytes its NVLS all-reduce flow (GPU i to i+1) carries in each loop k: the
    loop's data L_k (the switch loads every GPU's copy of every chunk) and head i's chunks c_ik (it stores its
    reduced chunks once; GPUs past the heads none), so GPU i's uplink carries L_k + c_ik, as NCCL's, and the
    busiest downlink the busiest head's (a short last loop on fewer heads, each with a bigger chunk, takes longer)."""
    data = loop_bytes(head_loops, m)
    own = [[0] * len(data) for _ in range(m)]
    for per_head in head_loops:
        for i, pieces in enumerate(per_head[:m]):
            for k, size in enumerate(pieces):
                own[i][k] += size
    return [[d + c for d, c in zip(data, mine, strict=True)] or [0] for mine in own]


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
    back at the host (at the root: up from its children, `tree_flows` `landed`). The reduce warps store the sum
    straight into the tree connection's send slot (prims_simple.h: `waitPeer` on the send's NCCL_STEPS slots before
    the step's `directRecvDirectSend`), so the host's reduce of loop k also waits for a free slot on every tree
    connection its heads write loop k into (`_slot_gate`): the trees are built loop by loop beside it."""
    m = min(len(blk) for blk in blocks)
    n = sum(len(blk) for blk in blocks)
    data = loop_bytes(head_loops, m)
    count = len(data)
    trees = _Trees(b, head_loops, m, n, count, window, parent_of)
    shares: list[list[int]] = []  # per host, per loop: the multicast bytes a flow carries
    reduces: list[list[int]] = []  # per host: each loop's reduce bytes on a flow
    for block in blocks:
        reduce, multicast = loop_link_bytes(data, nbytes, len(block)) if len(block) >= 2 else ([], [])
        reduces.append(reduce)
        shares.append(multicast)
    reduced: list[list[int | None]] = [[None] * count for _ in blocks]  # per host, per loop: its reduce's join
    last: list[list[int | None]] = [[None] * len(block) for block in blocks]  # each GPU's reduce flow so far
    for k in range(count):
        for h, block in enumerate(blocks):
            if len(block) < 2:
                continue
            gate = _slot_gate(b, trees, block, h, k)
            tag = f"nvls_tree/intra/h{h}/reduce" + (f"/chunk{k}" if count > 1 else "")
            flows = []
            for i, pos in enumerate(block):
                before = last[h][i]
                deps = (*(() if before is None else (before,)), *gate)
                flows.append(b.add(pos, block[(i + 1) % len(block)], reduces[h][k], tag, 0, deps))
            last[h] = list(flows)
            reduced[h][k] = join = b.join(block[0], tuple(flows), f"nvls_tree/intra/h{h}/reduce/loop{k}/done")
            for pos in block:
                trees.ready[pos][k] = (join,)
        trees.advance(k)
    trees.finish()
    for h, block in enumerate(blocks):
        if len(block) < 2:
            continue
        after = [
            b.join(
                block[0],
                tuple(trees.back(block, k)) or tuple(x for x in (reduced[h][k],) if x is not None),
                f"nvls_tree/intra/h{h}/tree/loop{k}/back",
            )
            for k in range(count)
        ]
        for i, pos in enumerate(block):
            b.add_chunks(pos, block[(i + 1) % len(block)], shares[h], f"nvls_tree/intra/h{h}/multicast", 0,
                         ready=[(j,) for j in after])  # fmt: skip


def _slot_gate(b: DagBuilder, trees: _Trees, block: list[int], h: int, k: int) -> tuple[int, ...]:
    """What host `h`'s NVLS reduce of loop k waits for to have a free slot on every tree connection its heads write
    loop k into (up to the parent; at the root down to each child): the slot NCCL_STEPS loops back, free once that
    step's write is acknowledged (`Credits.staged`); one join for them all, () while none is due."""
    deps = tuple(dict.fromkeys(d for pos in block for d in trees.staged(pos, k)))
    if len(deps) <= 1:
        return deps
    return (b.join(block[0], deps, f"nvls_tree/intra/h{h}/reduce/loop{k}/slot"),)


class _Trees:
    """NVLS-Tree's trees between hosts, one a channel and head GPU index (`tree_steps`), built loop by loop."""

    def __init__(
        self,
        b: DagBuilder,
        head_loops: list[list[list[int]]],
        m: int,
        n: int,
        count: int,
        window: int,
        parent_of: Callable[[int, int], list[int | None]],
    ) -> None:
        self.ready: list[list[tuple[int, ...]]] = [[() for _ in range(count)] for _ in range(n)]  # per node, loop
        self._steps: list[tuple[Iterator[int], list[int], int | None]] = []
        self._landed: list[tuple[int, list[list[tuple[int, ...]]]]] = []  # (head index, per node per loop)
        self._sends: dict[int, list[tuple[Credits, tuple[str, int, int]]]] = {}  # a head -> its connections
        for c, heads in enumerate(head_loops):
            for i, pieces in enumerate(heads[:m]):
                if not pieces:
                    continue
                landed: list[list[tuple[int, ...]]] = [[] for _ in range(n)]
                name = f"nvls_tree/inter{i}/t{c % 2}"
                credits = Credits(b, window, f"{name}/ch{c}", c)
                parent = parent_of(i, c % 2)
                steps = tree_steps(b, parent, sum(pieces), c, up=True, down=True, chunked=True,
                                   chunk_bytes=max(1, *pieces), step_delay_ns=0, name=name, window=window,
                                   pieces=pieces, ready=self.ready, landed=landed, credits=credits)  # fmt: skip
                self._steps.append((steps, list(itertools.accumulate(pieces)), next(steps, None)))
                self._landed.append((i, landed))
                kids = children_of(parent)
                for v, p in enumerate(parent):
                    conns = [("up", v, p)] if p is not None else [("down", v, w) for w in kids[v]]
                    self._sends.setdefault(v, []).extend((credits, conn) for conn in conns)

    def staged(self, pos: int, k: int) -> tuple[int, ...]:
        """What GPU `pos`'s kernel waits for to write loop k into each tree connection it sends on."""
        return tuple(d for credits, conn in self._sends.get(pos, ()) for d in credits.staged(conn, conn[1], conn[2], k))

    def advance(self, k: int) -> None:
        """Add every tree's pieces of loops up to k."""
        for j, (steps, ends, at) in enumerate(self._steps):
            while at is not None and bisect.bisect_left(ends, at) <= k:
                at = next(steps, None)
            self._steps[j] = (steps, ends, at)

    def finish(self) -> None:
        """Add what is left of every tree."""
        for steps, _, at in self._steps:
            while at is not None:
                at = next(steps, None)

    def back(self, block: list[int], k: int) -> list[int]:
        """The flows after which every channel's and head's tree chunk of loop k is back at the host `block`."""
        out: list[int] = []
        for i, landed in self._landed:
            got = landed[block[i]]
            if k < len(got):
                out.extend(got[k])
        return out
