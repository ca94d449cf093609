"""Data moving up (reduce) and/or down (broadcast) a tree; chains and stars are trees too.

A tree is a parent array over group positions (the root's parent is None). Every tree edge
carries the whole `size` bytes in each phase it takes part in.
"""

from __future__ import annotations

import bisect
import collections
import functools
import itertools
import math
from collections.abc import Callable, Iterator, Sequence
from typing import ParamSpec

from phantora.collectives.back_pressure import Credits, written
from phantora.collectives.dag import DagBuilder, split
from phantora.collectives.layout import children_of, topo_order
from phantora.collectives.nccl.part_loops import part_chunks

P = ParamSpec("P")


def tree_height(parent: list[int | None]) -> int:
    """Edges on the longest root-to-leaf path."""
    depth = [0] * len(parent)
    for v in topo_order(parent):
        p = parent[v]
        if p is not None:
            depth[v] = depth[p] + 1
    return max(depth)


def sweep_pieces(size: int, chunk: int, sweep: int) -> list[int]:
    """`size` bytes as NCCL's LL / LL128 tree kernel forwards them: chunks of `chunk` bytes (the last one what is
    left), each cut into sweeps of `sweep` bytes (the chunk's last sweep what is left of it). runTreeSplit
    (all_reduce.h) makes one primitive call per chunk, and each call's warps start their sweeps afresh
    (prims_ll.h, prims_ll128.h `GenericOp`, NCCL v2.30.7-1). One piece of 0 bytes when `size` is 0."""
    sweep = max(1, sweep)
    pieces: list[int] = []
    for left in part_chunks(size, max(1, chunk)):
        pieces += [sweep] * (left // sweep) + ([left % sweep] if left % sweep else [])
    return pieces or [0]


def net_lines(b: DagBuilder) -> bool:
    """Whether a step that crosses hosts lands line by line, in order, as one queue pair writes it: always but where
    NCCL_IB_SPLIT_DATA_ON_QPS spreads every message over several queue pairs side by side (`DagBuilder.split_qps`),
    whose lines then land in as many places at once (not modelled: such a step crosses whole)."""
    return b.qps == 1 or not b.split_qps


def tree_steps(
    b: DagBuilder,
    parent: list[int | None],
    size: int,
    channel: int,
    *,
    up: bool,
    down: bool,
    chunked: bool,
    chunk_bytes: int,
    step_delay_ns: int,
    name: str,
    sweeps: tuple[int, int] | None = None,
    window: int = 1,
    shared_sender: bool = False,
    pieces: list[int] | None = None,
    ready: Sequence[Sequence[tuple[int, ...]]] | None = None,
    landed: list[list[tuple[int, ...]]] | None = None,
    credits: Credits | None = None,
) -> Iterator[int]:
    """Add the flows of a reduce up the tree (`up`) and/or a broadcast down it (`down`).

    Coarse: one flow per edge and phase, all at once (the steady state of a pipeline), delayed by
    the step latency times the number of hops data crosses one after another. Chunked: the data
    is cut into k near-equal chunks of at most `chunk_bytes`. Going up, chunk c leaves a node once
    chunk c has arrived from all its children; going down, once chunk c has arrived from its
    parent (at the root: from all its children, when there is an up phase). On each edge chunk c
    also waits for chunk c - 1 to arrive: a flow model shares a link fairly between the flows on
    it, so without this one-at-a-time rule all chunks would cross each hop together and the
    pipeline would become store-and-forward. `sweeps`: (reduce, broadcast) bytes per sweep of a tree whose two
    halves forward LL lines in sweeps of their own size: each chunk of `chunk_bytes` crosses a hop sweep by sweep
    (`sweep_pieces`) in place of near-equal chunks; the root sends a broadcast piece once the reduce's pieces up to
    its last byte have arrived; across hosts the receiver's sweeps each wait for the sender's whole chunk
    (`need`). `window` w > 1 (NCCL_STEPS, a connection's buffer slots; needs the builder's communicator): on each
    edge chunk c waits for chunk c - w to be consumed (its slot is free, `Credits`) instead
    of chunk c - 1 to arrive, and the edge's chunks go on the wire one at a time in order (`Flow.queue`), so up to
    w are in flight (prims_simple.h `waitPeer`, NCCL v2.30.7-1); a forwarding node consumes a chunk once it has
    written it on (`back_pressure.written`: inside a host at its forward's arrival, across hosts once its staging
    slot is free). With `sweeps` the slot is still a chunk's: the
    chunk's sweeps all wait for that one slot (a primitive call waits once, prims_ll.h / prims_ll128.h
    `waitSend`) and follow each other on the wire, and the receiver frees it once its call has forwarded the
    chunk's last sweep (`postRecv`). `pieces` (chunked, without `sweeps`): the chunks' bytes in place
    of near-equal chunks (under the NCCL model from 2.22, `nccl.part_loops.part_chunks`: whole chunks, the last
    what is left); they must sum to `size`.
    `shared_sender` (needs the builder's communicator): everything a node sends on the channel, up and down, goes
    on the wire one message at a time in the order it is ready (`DagBuilder.sender_queue`): the two halves of one
    channel's kernel share its rate, so a half sending alone (the pipeline's fill) has all of it (the caps:
    `nccl/shape.py`).
    `ready` (chunked, up and down, one piece a chunk): `ready[v][c]`, what node v's own input of chunk c waits for
    besides its children (NVLS-Tree: its host's NVLS reduce of the chunk), before v sends chunk c up (the root:
    down). `landed` (filled in, one list a node): per chunk, the flows after which the whole tree's chunk is at
    the node (its parent's chunk down; at the root, its children's chunks up and its own `ready`).
    """
    order = topo_order(parent)
    kids = children_of(parent)
    if not chunked:
        hops = tree_height(parent) * (int(up) + int(down))
        delay = step_delay_ns * hops
        if up:
            for v in reversed(order):
                p = parent[v]
                if p is not None:
                    b.add(v, p, size, f"{name}/ch{channel}/up", channel, (), delay)
        if down:
            for v in order:
                for w in kids[v]:
                    b.add(v, w, size, f"{name}/ch{channel}/down", channel, (), delay)
        return
    if sweeps:
        sizes, down_sizes = (sweep_pieces(size, chunk_bytes, s) for s in sweeps)
    elif pieces:
        if sum(pieces) != size:
            raise ValueError(f"tree_flows: pieces {pieces} do not sum to the channel's {size} B")
        sizes = down_sizes = list(pieces)
    else:
        sizes = down_sizes = split(size, max(1, math.ceil(size / chunk_bytes)))
    k, kd = len(sizes), len(down_sizes)
    ends = list(itertools.accumulate(sizes))
    # Under `sweeps` a hop across hosts sends whole steps: NCCL's proxy posts a step once all its lines are written
    # (net.cc sendProxyProgress checks every LL / LL128 line's flag), one RDMA write, but the GPU behind it reads
    # the step's lines as the NIC lands them (its kernel polls each line's flag), so the step crosses as the
    # receiver's sweeps, one after another on the connection, each of them waiting for the sender's whole step
    # (`need`). Pieces per edge (up: the edge v -> parent[v]; down: parent[w] -> w).
    whole = part_chunks(size, max(1, chunk_bytes)) if sweeps else []
    # Whether a piece ends its chunk, one primitive call: NCCL's slot and its credit go a chunk at a time (a
    # sweep's lines go on behind the chunk's first, prims_ll.h / prims_ll128.h `waitSend`, `postRecv`).
    chunk_ends = list(itertools.accumulate(whole))
    bounds = set(chunk_ends) if sweeps else None
    lines = bool(sweeps) and net_lines(b)

    def cut(v: int, w: int, ref: list[int]) -> list[int]:
        """The pieces of edge v -> w: `ref`, or whole chunks across hosts where the step cannot land line by line
        (`net_lines`)."""
        return whole if sweeps and not lines and b.network(v, w) else ref

    def need(v: int, w: int, e: int) -> int:
        """The input byte a piece of edge v -> w ending at byte e waits for: across hosts under `sweeps` the end of
        its chunk (the proxy sends a whole step), else e."""
        if not sweeps or not b.network(v, w):
            return e
        return chunk_ends[bisect.bisect_left(chunk_ends, e)]

    up_sizes = [cut(v, p, sizes) if p is not None else [] for v, p in enumerate(parent)]
    dn_sizes = [cut(p, w, down_sizes) if p is not None else [] for w, p in enumerate(parent)]
    up_ends = [list(itertools.accumulate(x)) for x in up_sizes]
    dn_ends = [list(itertools.accumulate(x)) for x in dn_sizes]
    up_at = [{e: i for i, e in enumerate(x)} for x in up_ends]  # an up edge's piece ending at each byte
    dn_at = [{e: i for i, e in enumerate(x)} for x in dn_ends]

    window = window if b.comm else 1
    shared = shared_sender and bool(b.comm)
    ordered = window > 1 or shared

    def queue(v: int) -> int:
        """The queue of node v's sends: its connection's (0) or, shared, its channel's kernel's."""
        return b.sender_queue(v, channel) if shared else 0

    def slot(edge: list[int], c: int) -> tuple[int, ...]:
        """The chunk whose arrival frees chunk c's slot on an edge (`edge[c]`: chunk c's flow on it)."""
        return (edge[c - window],) if c >= window else ()

    def tag(phase: str, c: int) -> str:
        return f"{name}/ch{channel}/{phase}/chunk{c}" if max(k, kd) > 1 else f"{name}/ch{channel}/{phase}"

    def closes(e: int) -> bool:
        """Whether a piece ending at byte e ends its chunk."""
        return bounds is None or e in bounds

    if credits is None:  # window > 1: a slot frees as the receiver consumes its chunk (back_pressure.py)
        credits = Credits(b, window, f"{name}/ch{channel}", channel)
    up_in: list[list[int]] = [[] for _ in parent]  # up_in[v][c]: piece c arriving at parent[v] from v
    down_in: list[list[int]] = [[] for _ in parent]  # down_in[w][c]: piece c arriving at w from its parent

    taken: dict[tuple[str, int, int], tuple[tuple[int, ...], tuple[int, ...]]] = {}  # a connection's chunk: its slot

    def send(
        v: int, w: int, size: int, phase: str, have: tuple[int, ...], edge: list[int], first: bool, last: bool
    ) -> tuple[tuple[int, ...], int]:
        """Add the edge's next piece of `phase` from v to w once `have` are in and its slot on the edge is free;
        append it to `edge`; return what its kernel waited for to write it (`Credits.slots`) and the piece's flow.
        `first` / `last`: whether the piece starts / ends its chunk; with a window the slot is a chunk's: every
        piece of the chunk waits for it (the kernel's one wait a call), and the consumption of its last piece frees
        it (one credit a chunk)."""
        c = len(edge)
        conn = (phase, v, w)
        kernel: tuple[int, ...] = ()
        if window <= 1:
            own = slot(edge, c)
        elif first:
            own, kernel = taken[conn] = credits.slots(conn, v, w)
        else:
            own, kernel = taken[conn]
        part = not first and lines and b.network(v, w)  # a further sweep of the step's one write
        flow = b.add(
            v, w, size, tag(phase, c), channel, have + own, step_delay_ns, ordered=ordered, queue=queue(v), part=part
        )
        edge.append(flow)
        if window > 1 and last:
            credits.sent(conn, flow)
        return kernel, flow

    def own(v: int, c: int) -> tuple[int, ...]:
        """What node v's own input of chunk c waits for (`ready`)."""
        return tuple(ready[v][c]) if ready is not None else ()

    def up_to(v: int, e: int) -> int:
        """v's up piece holding byte e - 1 (added, after the edge's pieces before it, if not yet)."""
        i = bisect.bisect_left(up_ends[v], e)
        while len(up_in[v]) <= i:
            send_up(v, len(up_in[v]))
        return up_in[v][i]

    def down_to(w: int, e: int) -> int:
        """w's down piece holding byte e - 1 (added, after the edge's pieces before it, if not yet)."""
        i = bisect.bisect_left(dn_ends[w], e)
        while len(down_in[w]) <= i:
            send_down(w, len(down_in[w]))
        return down_in[w][i]

    def send_up(v: int, i: int) -> None:
        """Piece i up v's edge once its children's pieces up to its last byte are in; a node consumes its
        children's chunk as it writes the chunk's last piece on."""
        p = parent[v]
        assert p is not None
        e, piece = up_ends[v][i], up_sizes[v][i]
        have = tuple(up_to(w, need(v, p, e)) for w in kids[v]) + own(v, i)
        kernel, flow = send(v, p, piece, "up", have, up_in[v], closes(e - piece) or i == 0, closes(e))
        if window > 1 and closes(e):
            for w in kids[v]:
                written(credits, up_to(w, e), have, kernel, flow, b.network(v, p))

    def landing(v: int, e: int) -> tuple[int, ...]:
        """What node v's down pieces up to byte e wait for: its own down piece holding byte e - 1; at the root, with
        an up phase, its children's up pieces and its own input (`ready`)."""
        if parent[v] is not None:
            return (down_to(v, e),)
        if not up:
            return ()
        return tuple(up_to(x, e) for x in kids[v]) + own(v, bisect.bisect_left(ends, e))

    def send_down(w: int, i: int) -> None:
        """Piece i down w's edge once its parent has the piece's bytes; the parent consumes the chunk it got (at
        the root: its children's up chunks) as it writes the chunk's last piece on."""
        v = parent[w]
        assert v is not None
        e, piece = dn_ends[w][i], dn_sizes[w][i]
        have = landing(v, need(v, w, e))
        kernel, flow = send(v, w, piece, "down", have, down_in[w], closes(e - piece) or i == 0, closes(e))
        if window <= 1 or not closes(e):
            return  # a chunk is consumed as its last piece is written on
        net = b.network(v, w)
        if parent[v] is not None:
            written(credits, down_to(v, e), have, kernel, flow, net)
        elif up:
            for x in kids[v]:
                written(credits, up_to(x, e), have, kernel, flow, net)

    def up_tick(e: int) -> None:
        """Every up piece ending at byte e, children first."""
        for v in reversed(order):
            i = up_at[v].get(e)
            if i is not None:
                up_to(v, e)

    def down_tick(e: int) -> None:
        """Every down piece ending at byte e, parents first (and, `landed`, what each node then has)."""
        for v in order:
            if landed is not None:
                landed[v].append(landing(v, e))
            for w in kids[v]:
                if e in dn_at[w]:
                    down_to(w, e)

    # Byte by byte of the pieces' ends, so a chunk's consumer is there when the chunk `window` later is sent.
    up_ticks = sorted({e for x in up_ends for e in x} or set(ends)) if up else []
    down_ticks = sorted({e for x in dn_ends for e in x} or set(itertools.accumulate(down_sizes))) if down else []
    d = 0
    for e in up_ticks:
        yield e
        up_tick(e)
        while d < len(down_ticks) and down_ticks[d] <= e:
            down_tick(down_ticks[d])
            d += 1
    for e in down_ticks[d:]:
        down_tick(e)


def _run_through(steps: Callable[P, Iterator[int]]) -> Callable[P, None]:
    """`steps` run to its end, for callers that want only the flows it adds."""

    @functools.wraps(steps)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        collections.deque(steps(*args, **kwargs), maxlen=0)

    return run


tree_flows = _run_through(tree_steps)  # add a tree's flows: `tree_steps`, its steps' ends not wanted
