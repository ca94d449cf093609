"""Traffic classes and DLCP loss for collectives (pure): which class a collective's flows get, which collectives may
lose bytes, and which tensor bytes each rank must zero when flows of a ring all-reduce lost some.

Classes: 1 is served first under strict scheduling, 7 last; 3 is the default of every flow.
- ``layer``: earlier layers first, as layer-wise scheduling (ByteScheduler, P3) does. A backward pass issues the
  gradient collectives of the last layer first, so within a step the i-th of a rank's N collectives (N counted in
  the step before; the first step has no count and gets the default class) stands for layer L = N-1-i and gets
  class 1 + 7 L // N: the last issued (the first layer) class 1, the first issued (the last layer) class 7.
- ``tensor-size``: smaller collectives first (class 1 up to 64 KiB, one class more per 4x, 7 above 64 MiB).

Lost bytes of a ring all-reduce (coarse or chunked, one flow per ring edge or per step and chunk): a flow's bytes
are the slices it sends, in step order (`ring.ring_schedule`); slice j of channel c is the contiguous tensor range
after the earlier channels' shares and the earlier slices (`dag.split`). A range lost in the reduce-scatter phase
loses the reduced value, so every rank zeroes it; a range lost in the all-gather phase is zeroed at the rank that
received it and at every rank it forwards that slice to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from phantora.collectives.dag import split
from phantora.collectives.layout import host_blocks, ring_order
from phantora.collectives.options import default_options
from phantora.collectives.ring import ring_schedule
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.topology.model import Topology

DEFAULT_CLASS = 3
SMALL_BYTES = 64 * 1024  # tensor-size: class 1 up to this; dlcp=grads: smaller all-reduces stay lossless
Range = tuple[int, int]  # (offset, bytes)


def class_by_layer(index: int, count: int) -> int:
    """Class of the `index`-th collective of a step whose step before issued `count`: the last one issued is
    the first layer (class 1), the first issued class 7; past the count, or without one, the default class."""
    if count <= 0 or index >= count:
        return DEFAULT_CLASS
    layer = count - 1 - index  # 0 = the first layer
    return 1 + 7 * layer // count if count > 1 else 1


def class_by_size(nbytes: int) -> int:
    """Class 1 up to 64 KiB, one more per 4x (2 up to 256 KiB, 3 up to 1 MiB ... 6 up to 64 MiB), 7 above."""
    cls, limit = 1, SMALL_BYTES
    while nbytes > limit and cls < 7:
        cls, limit = cls + 1, limit * 4
    return cls


def loss_tolerant_by_policy(policy: str, kind: str, dtype: str, nbytes: int) -> bool:
    """`dlcp=grads`: all-reduces of floating-point tensors of at least 64 KiB (data-parallel gradient buckets;
    scalars such as a logged loss stay exact)."""
    return policy == "grads" and kind == "all_reduce" and dtype in ("fp32", "fp16", "bf16") and nbytes >= SMALL_BYTES


def supports_loss(coll: Collective, topo: Topology, opts: AlgoOptions) -> bool:
    """Can lost bytes of this collective be mapped to tensor bytes (a ring all-reduce of 2+ ranks)?"""
    if coll.kind != "all_reduce" or coll.size < 2 or coll.nbytes == 0:
        return False
    return default_options(coll, topo, opts).algorithm == "ring"


def ring_lost_ranges(
    coll: Collective, topo: Topology, opts: AlgoOptions, first_id: int, lost: Mapping[int, Sequence[Range]]
) -> dict[int, list[Range]]:
    """Global rank -> merged tensor byte ranges it must zero, for a ring all-reduce decomposed (by `decompose`)
    with flow ids from `first_id`, whose flows lost `lost` (flow id -> (offset, bytes) ranges of the flow)."""
    opts = default_options(coll, topo, opts)
    nodes = [topo.node_of_rank(r) for r in coll.ranks]
    blocks = host_blocks(topo, nodes)
    n = coll.size
    schedule = ring_schedule("all_reduce", n)
    rs_steps = n - 1
    out: dict[int, list[Range]] = {r: [] for r in coll.ranks}
    fid = first_id
    base = 0
    for c, share in enumerate(split(coll.nbytes, opts.channels)):
        order = ring_order(blocks, c)
        slices = split(share, n)
        starts = [base + sum(slices[:j]) for j in range(n)]
        base += share
        if opts.granularity != "chunked":
            for i in range(n):  # one flow per ring edge, the slices it sends in step order
                pieces = [(s, schedule[s][i], 0, slices[schedule[s][i]]) for s in range(len(schedule))]
                _map(out, lost.get(fid, ()), pieces, starts, order, coll.ranks, i, rs_steps)
                fid += 1
            continue
        k = max(1, math.ceil(max(slices) / opts.chunk_bytes))
        chunks = [split(size, k) for size in slices]
        for s, step in enumerate(schedule):
            for i in range(n):
                for ch in range(k):
                    j = step[i]
                    piece = [(s, j, sum(chunks[j][:ch]), chunks[j][ch])]
                    _map(out, lost.get(fid, ()), piece, starts, order, coll.ranks, i, rs_steps)
                    fid += 1
    return {r: merge(v) for r, v in out.items() if v}


def _map(
    out: dict[int, list[Range]],
    ranges: Sequence[Range],
    pieces: Sequence[tuple[int, int, int, int]],
    starts: Sequence[int],
    order: Sequence[int],
    ranks: Sequence[int],
    sender: int,
    rs_steps: int,
) -> None:
    """Lost `ranges` of one flow, whose bytes are `pieces` (step, slice, offset in slice, bytes) in order, sent by
    ring position `sender`: add the tensor ranges to the ranks that must zero them."""
    if not ranges:
        return
    n = len(order)
    at = 0
    for step, j, within, size in pieces:
        for off, length in ranges:
            lo, hi = max(off, at), min(off + length, at + size)
            if lo >= hi:
                continue
            tensor = (starts[j] + within + lo - at, hi - lo)
            if step < rs_steps:
                targets = range(n)  # the reduced value is lost
            else:  # the receiver and every later receiver of this slice in the all-gather
                last = 2 * rs_steps - 1
                targets = range(1, last - step + 2)
                targets = [(sender + d) % n for d in targets]  # type: ignore[assignment]
            for pos in targets:
                out[ranks[order[pos]]].append(tensor)
        at += size


def merge(ranges: Sequence[Range]) -> list[Range]:
    """Sorted, overlapping or touching ranges joined."""
    merged: list[list[int]] = []
    for off, length in sorted(ranges):
        if merged and off <= merged[-1][0] + merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], off + length - merged[-1][0])
        else:
            merged.append([off, length])
    return [(a, b) for a, b in merged]
