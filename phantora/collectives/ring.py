"""Ring reduce-scatter, all-gather and all-reduce on one channel, coarse or chunked.

Slices are numbered by ring position. At step s of a reduce-scatter, position i sends slice
(i - s - 1) mod n to position i + 1, so after n - 1 steps position i holds slice i reduced. At
step s of an all-gather, position i sends slice (i - s) mod n, which it got (or owned) one step
earlier. An all-reduce is the reduce-scatter followed by the all-gather: 2(n - 1) steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from itertools import accumulate

from phantora.collectives.back_pressure import Credits, forwarded, ring_receives, written
from phantora.collectives.dag import DagBuilder, split

Cut = Callable[[list[int], int], list[list[int]]]  # (a channel's slices, chunk bytes) -> chunks[slice][pass]
Slicer = Callable[[int], list[int]]  # a Simple chunk's bytes -> its slices' bytes (`nccl.ring_slices`)
PHASES = {"reduce_scatter": ("rs",), "all_gather": ("ag",), "all_reduce": ("rs", "ag")}


def ring_schedule(kind: str, n: int) -> list[list[int]]:
    """`schedule[s][i]`: the slice ring position i sends at step s."""
    steps: list[list[int]] = []
    for phase in PHASES[kind]:
        shift = 1 if phase == "rs" else 0
        steps.extend([(i - s - shift) % n for i in range(n)] for s in range(n - 1))
    return steps


def coarse_bytes(kind: str, slices: list[int], total: int, i: int) -> int:
    """Bytes ring position i sends over all steps: every slice but one per phase (see ring_schedule).

    In a reduce-scatter it sends every slice but its own (i); in an all-gather every slice but
    the one it receives last, (i + 1) mod n.
    """
    n = len(slices)
    size = 0
    for phase in PHASES[kind]:
        size += total - (slices[i] if phase == "rs" else slices[(i + 1) % n])
    return size


def ring_flows(
    b: DagBuilder,
    kind: str,
    order: list[int],
    slices: list[int],
    channel: int,
    *,
    chunked: bool,
    chunk_bytes: int,
    step_delay_ns: int,
    name: str = "ring",
    start_deps: list[tuple[int, ...]] | None = None,
    in_turn: bool = False,
    window: int = 1,
    cut: Cut | None = None,
    slicer: Slicer | None = None,
) -> list[list[int]]:
    """Add one channel's ring flows; return, per ring position, the flows it receives at the last step.

    `order[i]` is the group position at ring position i and `slices[j]` the bytes of slice j.
    `start_deps[i]` are flows that ring position i must have received before its first send.
    Coarse: one flow per ring edge carrying everything the sender sends, delayed by the summed
    step latency. Chunked: each slice is cut into k near-equal chunks (k = ceil(max slice /
    chunk_bytes)) and the ring runs k passes, as NCCL's kernel does: pass c moves chunk c of every
    slice through all the steps. Chunk c at step s waits for chunk c of step s - 1 to arrive from
    the predecessor, plus the step delay. `in_turn` (the NCCL model, whose flows are capped at their
    connection's rate): a rank runs its passes one after another (a pass's first step waits for the
    sender's last message of the pass before), and, given the builder's communicator, a rank's messages to
    its successor go on the wire one at a time in order (`Flow.queue`), each once its input has arrived and
    the successor has consumed the message `window` before it and the credit is back (its buffer slots are free:
    NCCL_STEPS slots over the CHUNKSTEPS slots a Simple chunk takes, so 2; LL / LL128 chunks take 1, so 8;
    prims_simple.h `waitPeer`; the successor consumes a step as it sends it on, a one-slot LL / LL128 step or a Simple
    chunk's slice (`slicer`) inside a host once it has written it on (`back_pressure.written`), or at the last step
    as it arrives: `back_pressure.py`;
    the proxy posts a network connection's steps in order, net.cc `sendProxyProgress`; NCCL
    v2.30.7-1). So a
    connection moves its bytes at its own rate, as ns-3's NIC sends a connection's messages; without
    `in_turn` every pass runs at once, and the links alone set the pace. `cut` (chunked): how the slices are cut
    into the passes' chunks instead (under the NCCL model, `nccl.ring_loops.ring_chunks`: NCCL's own loops).
    `slicer` (in turn, a Simple chunk of several slices: `window` < NCCL_STEPS): a chunk moves as its slices
    (`nccl.ring_slices.slice_bytes`), each a message of its own with its own slots (NCCL_STEPS / SLICESTEPS in
    flight) and its own receive, sent on once it has arrived and consumed once it is written on
    (`back_pressure.written`), as prims_simple.h `genericOp` posts each slice's tail and head; the last flows a
    position receives are then each chunk's slices.
    """
    n = len(order)
    first = start_deps or [()] * n
    tag = f"{name}/ch{channel}"
    succ = order[1:] + order[:1]  # succ[i]: the group position after ring position i
    if not chunked:
        total = sum(slices)
        steps = (n - 1) * len(PHASES[kind])
        sizes = [coarse_bytes(kind, slices, total, i) for i in range(n)]
        ids = b.add_hops(order, succ, sizes, first, tag, channel, step_delay_ns * steps)
        return [[ids[i - 1]] for i in range(n)]  # position i receives from i - 1
    chunks = (cut or ring_chunks)(slices, chunk_bytes)
    k = len(chunks[0])
    last_step = len(ring_schedule(kind, n)) - 1
    ordered = in_turn and bool(b.comm)  # a connection's messages in order on the wire (needs its connections)
    # recv[i][c]: the flow bringing chunk c to ring position i at its last step; sent[i]: position i's sends so far.
    recv: list[list[int]] = [[0] * k for _ in range(n)]
    sent: list[list[int]] = [[] for _ in range(n)]
    # each position's connection to its successor (back_pressure.py)
    per_message = ring_receives(window)  # a message's slices: 2 for a Simple chunk, 1 for an LL / LL128 step
    if ordered and slicer is not None and per_message > 1:
        return _sliced(b, kind, order, chunks, channel, tag, first, step_delay_ns, window * per_message, slicer)
    credits = Credits(b, window, tag, channel, per_message)
    prev = [0] * n  # the flow bringing the pass's chunk to each position at the previous step
    for c, s, sends in ring_passes(kind, chunks):
        ctag = f"{tag}/step{s}/chunk{c}" if k > 1 else f"{tag}/step{s}"
        if not ordered:  # no credits to keep in turn: the step's n hops in one call
            ins = [(p,) for p in prev] if s else first
            if in_turn and not s:  # a rank runs its passes one after another
                ins = [(*dep, mine[-1]) if mine else dep for dep, mine in zip(ins, sent, strict=True)]
            ids = b.add_hops(order, succ, [size for _j, _offset, size in sends], ins, ctag, channel, step_delay_ns)
            if in_turn:
                for mine, fid in zip(sent, ids, strict=True):
                    mine.append(fid)
            prev = [ids[i - 1] for i in range(n)]
            if s == last_step:
                for i in range(n):
                    recv[i][c] = prev[i]
            continue
        now = [0] * n
        for i, (_j, _offset, size) in enumerate(sends):
            j = (i + 1) % n
            inputs = (prev[i],) if s else first[i]
            deps = inputs
            mine = sent[i]
            if in_turn and not s and mine:  # a rank runs its passes one after another
                deps = (*deps, mine[-1])
            kernel: tuple[int, ...] = ()
            if ordered:  # its slot is free once the successor has consumed the message `window` back
                slot, kernel = credits.slots(i, order[i], order[j])
                deps = (*deps, *slot)
            now[j] = b.add(order[i], order[j], size, ctag, channel, deps, step_delay_ns, ordered=ordered)
            mine.append(now[j])
            if ordered:
                credits.sent(i, now[j])
                if s and per_message > 1:  # a Simple chunk whole (no `slicer`): as it is sent on
                    forwarded(credits, prev[i], inputs, kernel)
                elif s:  # a one-slot step (LL, LL128) once it has written it on
                    written(credits, prev[i], inputs, kernel, now[j], b.network(order[i], order[j]))
        prev = now
        if s == last_step:
            for i in range(n):
                recv[i][c] = prev[i]
    return recv


def _sliced(
    b: DagBuilder,
    kind: str,
    order: list[int],
    chunks: list[list[int]],
    channel: int,
    tag: str,
    first: list[tuple[int, ...]],
    step_delay_ns: int,
    window: int,
    slicer: Slicer,
) -> list[list[int]]:
    """`ring_flows` in turn with a Simple chunk as its slices (`slicer`), `window` slices in flight a connection:
    slice q of a step goes once slice q of the step before has arrived (its first step: once the rank's last
    message of the pass before has), on the wire behind the connection's earlier slices, its slots free once the
    successor has written the slice `window` back on (`back_pressure.written`) or, at the last step, received it.
    The empty slices of a short chunk (NCCL's kernel waits for their slots and posts them) add no flow: their slots
    count as the chunk's last slice's. A chunk in one slice keeps its tag; a chunk's slices add `/slice{q}`."""
    n = len(order)
    k = len(chunks[0])
    last_step = len(ring_schedule(kind, n)) - 1
    recv: list[list[int]] = [[] for _ in range(n)]
    sent: list[list[int]] = [[] for _ in range(n)]
    credits = Credits(b, window, tag, channel)
    prev: list[list[int]] = [[] for _ in range(n)]  # the slices bringing the pass's chunk at the previous step
    for c, s, sends in ring_passes(kind, chunks):
        ctag = f"{tag}/step{s}/chunk{c}" if k > 1 else f"{tag}/step{s}"
        now: list[list[int]] = [[] for _ in range(n)]
        for i, (_j, _offset, size) in enumerate(sends):
            j = (i + 1) % n
            mine = sent[i]
            before = (mine[-1],) if not s and mine else ()  # a rank runs its passes one after another
            network = b.network(order[i], order[j])
            pieces = slicer(size)
            data = [p for p in pieces if p] or pieces[:1]  # an empty slice moves nothing but takes its slots
            for q, piece in enumerate(data):
                inputs = (prev[i][q],) if s else first[i]
                slot, kernel = credits.slots(i, order[i], order[j])
                qtag = f"{ctag}/slice{q}" if len(data) > 1 else ctag
                fid = b.add(order[i], order[j], piece, qtag, channel, (*inputs, *before, *slot), step_delay_ns,
                            ordered=True)  # fmt: skip
                now[j].append(fid)
                mine.append(fid)
                credits.sent(i, fid)
                if s:  # the slice it forwards is consumed once written on
                    written(credits, prev[i][q], inputs, kernel, fid, network)
            for _ in range(len(pieces) - len(data)):  # the empty slices' slots, freed with the chunk's last data
                credits.sent(i, now[j][-1])
        prev = now
        if s == last_step:
            for i in range(n):
                recv[i].extend(prev[i])
    return recv


def ring_chunks(slices: list[int], chunk_bytes: int) -> list[list[int]]:
    """Each slice cut into k near-equal chunks, k = ceil(max slice / chunk_bytes): NCCL's passes."""
    k = max(1, math.ceil(max(slices) / chunk_bytes))
    return [split(size, k) for size in slices]


def ring_passes(kind: str, chunks: list[list[int]]) -> Iterator[tuple[int, int, list[tuple[int, int, int]]]]:
    """A chunked ring's messages in NCCL's order (the order `ring_flows` adds them): pass c moves chunk c of every
    slice through all the steps. Per (pass, step): what each ring position sends, (slice, offset in it, bytes)."""
    schedule = ring_schedule(kind, len(chunks))
    starts = [[0, *accumulate(sizes)] for sizes in chunks]  # starts[j][c]: where chunk c of slice j begins
    for c in range(len(chunks[0])):
        for s, step in enumerate(schedule):
            yield c, s, [(j, starts[j][c], chunks[j][c]) for j in step]


def ring_collective(
    b: DagBuilder,
    kind: str,
    orders: list[list[int]],
    shares: list[int],
    *,
    chunked: bool,
    chunk_bytes: int,
    step_delay_ns: int,
    in_turn: bool = False,
    window: int = 1,
    cut: Cut | None = None,
    slicer: Slicer | None = None,
) -> None:
    """A ring collective over len(orders) channels; channel c uses ring `orders[c]` and carries `shares[c]` bytes
    (`channel_shares.channel_shares`; `in_turn`, `window`, `cut`, `slicer`: see `ring_flows`)."""
    for c, (order, size) in enumerate(zip(orders, shares, strict=True)):
        ring_flows(
            b,
            kind,
            order,
            split(size, len(order)),
            c,
            chunked=chunked,
            chunk_bytes=chunk_bytes,
            step_delay_ns=step_delay_ns,
            in_turn=in_turn,
            window=window,
            cut=cut,
            slicer=slicer,
        )
