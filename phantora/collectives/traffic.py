"""Traffic classes and DLCP loss for collectives (pure): which class a collective's flows get, which collectives may
lose bytes, and which tensor bytes each rank must zero when flows of a ring all-reduce or reduce-scatter lost some.

Classes: 1 is served first under strict scheduling, 7 last; 3 is the default of every flow.
- ``layer``: earlier layers first, as layer-wise scheduling (ByteScheduler, P3) does. A backward pass issues the
  gradient collectives of the last layer first, so within a step the i-th of a rank's N collectives (N counted in
  the step before; the first step has no count and gets the default class) stands for layer L = N-1-i and gets
  class 1 + 7 L // N: the last issued (the first layer) class 1, the first issued (the last layer) class 7.
- ``tensor-size``: smaller collectives first (class 1 up to 64 KiB, one class more per 4x, 7 above 64 MiB).

Lost bytes of a ring all-reduce (coarse or chunked, one flow per ring edge or per step and chunk): a flow's bytes
are the slices it sends, in step order (`ring.ring_schedule`); slice j of channel c is the contiguous tensor range
after the earlier channels' shares (`channel_shares`: NCCL 2.22+'s parts) and the earlier slices (`dag.split`). A
range lost in the reduce-scatter phase loses the reduced value, so every rank zeroes it; a range lost in the
all-gather phase is zeroed at the rank that received it and at every rank it forwards that slice to. A ring
reduce-scatter's slice j is (part of) the output shard of ring position j: a range lost at any step is zeroed
there (`reduce_scatter_lost_ranges`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from phantora.collectives.channel_shares import channel_shares, ring_cut
from phantora.collectives.dag import split
from phantora.collectives.decompose import channel_rings
from phantora.collectives.layout import host_blocks
from phantora.collectives.nccl import settings as nccl_settings
from phantora.collectives.nccl.platform import nccl_view
from phantora.collectives.options import default_options
from phantora.collectives.ring import ring_chunks, ring_passes, ring_schedule
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.topology.model import Topology

DEFAULT_CLASS = 3
SMALL_BYTES = 64 * 1024  # tensor-size: class 1 up to this; dlcp=grads: smaller all-reduces stay lossless
Range = tuple[int, int]  # (offset, bytes)
RingFlow = tuple[int, int, list[int], int, list[tuple[int, int, int, int]], list[int]]


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


LOSSY_KINDS = ("all_reduce", "reduce_scatter")  # the gradient collectives of DDP and of FSDP / ZeRO
Piece = tuple[int, int, int, int]  # (step, slice, offset in the slice, bytes) of a ring flow, in the order sent


def loss_tolerant_by_policy(policy: str, kind: str, dtype: str, nbytes: int) -> bool:
    """`dlcp=grads`: all-reduces and reduce-scatters of floating-point tensors of at least 64 KiB (the gradient
    buckets of DDP, the gradient shards of FSDP / ZeRO; scalars such as a logged loss stay exact). All-gathers
    (FSDP's parameters) stay lossless: a zeroed parameter would corrupt the forward pass, not one SGD step."""
    return policy == "grads" and kind in LOSSY_KINDS and dtype in ("fp32", "fp16", "bf16") and nbytes >= SMALL_BYTES


def lossless_reason(coll: Collective, topo: Topology, opts: AlgoOptions) -> str | None:
    """Why a loss-tolerant `coll` must stay lossless (its lost bytes cannot be mapped to tensor bytes), or None
    if they can: ring all-reduces, and ring reduce-scatters whose channel shares split evenly over the ranks."""
    if coll.kind not in LOSSY_KINDS:
        return f"{coll.kind} is never loss-tolerant"
    if coll.size < 2 or coll.nbytes == 0:
        return "no network traffic"
    resolved = default_options(coll, topo, opts)
    if resolved.algorithm != "ring":
        return f"the {resolved.algorithm} algorithm is not mapped to tensor bytes (ring only)"
    if coll.kind == "reduce_scatter":
        n = coll.size
        if any(share % n for share in channel_shares(coll, topo, resolved)):
            return f"{coll.nbytes} bytes do not split evenly over {resolved.channels} channels x {n} ranks"
    return None


def supports_loss(coll: Collective, topo: Topology, opts: AlgoOptions) -> bool:
    """Can lost bytes of this collective be mapped to tensor bytes (see `lossless_reason`)?"""
    return lossless_reason(coll, topo, opts) is None


def lost_ranges(
    coll: Collective, topo: Topology, opts: AlgoOptions, first_id: int, lost: Mapping[int, Sequence[Range]]
) -> dict[int, list[Range]]:
    """Global rank -> merged byte ranges of its result to zero, for a collective `supports_loss` accepts.

    Under NCCL's LL and LL128 protocols a flow's bytes are lines of data and flags: a lost stretch of the wire
    loses the data of every line it touches (8 of LL's 16 bytes, 120 of LL128's 128)."""
    line = LINES.get(default_options(coll, topo, opts).protocol)
    if line is not None:
        lost = {fid: payload_ranges(ranges, *line) for fid, ranges in lost.items()}
    if coll.kind == "reduce_scatter":
        return reduce_scatter_lost_ranges(coll, topo, opts, first_id, lost)
    return ring_lost_ranges(coll, topo, opts, first_id, lost)


LINES = {"LL": (16, 8), "LL128": (128, 120)}  # protocol -> (line bytes on the wire, data bytes in it)


def payload_ranges(ranges: Sequence[Range], line: int, data: int) -> list[Range]:
    """Wire ranges of a flow -> the data ranges of the lines they touch."""
    out = []
    for off, length in ranges:
        first, last = off // line, (off + length - 1) // line
        out.append((first * data, (last - first + 1) * data))
    return merge(out)


def _ring_flows(coll: Collective, topo: Topology, opts: AlgoOptions, first_id: int) -> Iterator[RingFlow]:
    """Each flow of a ring `coll` decomposed (by `decompose`) with ids from `first_id`, in id order: (id, channel,
    channel ring order, sender ring position, its pieces in the order sent, the channel's slice sizes)."""
    opts = default_options(coll, topo, opts)
    nodes = [topo.node_of_rank(r) for r in coll.ranks]
    view = nccl_view(topo, coll.comm or coll.ranks, nccl_settings(opts)) if opts.model == "nccl" else topo
    blocks = host_blocks(view, nodes)  # NCCL's nodes, as decompose builds on them
    n = coll.size
    schedule = ring_schedule(coll.kind, n)
    fid = first_id
    shares = channel_shares(coll, topo, opts)
    rings = channel_rings(coll, view, opts, nodes, blocks, len(shares))
    for c, (share, order) in enumerate(zip(shares, rings, strict=True)):
        slices = split(share, n)
        if opts.granularity != "chunked":  # one flow per ring edge, the slices it sends in step order
            for i in range(n):
                pieces = [(s, schedule[s][i], 0, slices[schedule[s][i]]) for s in range(len(schedule))]
                yield fid, c, order, i, pieces, slices
                fid += 1
            continue
        chunks = (ring_cut(coll, topo, opts) or ring_chunks)(slices, opts.chunk_bytes)
        slices = [sum(pieces) for pieces in chunks]  # NCCL's loops may fill the slices unevenly (`ring_cut`)
        for _pass, s, sends in ring_passes(coll.kind, chunks):
            for i, (j, within, size) in enumerate(sends):
                yield fid, c, order, i, [(s, j, within, size)], slices
                fid += 1


def _overlaps(ranges: Sequence[Range], pieces: Sequence[Piece]) -> Iterator[tuple[int, int, int, int]]:
    """The parts of a flow's lost `ranges` inside each of its `pieces`: (step, slice, offset in slice, bytes)."""
    at = 0
    for step, j, within, size in pieces:
        for off, length in ranges:
            lo, hi = max(off, at), min(off + length, at + size)
            if lo < hi:
                yield step, j, within + lo - at, hi - lo
        at += size


def ring_lost_ranges(
    coll: Collective, topo: Topology, opts: AlgoOptions, first_id: int, lost: Mapping[int, Sequence[Range]]
) -> dict[int, list[Range]]:
    """Global rank -> merged tensor byte ranges it must zero, for a ring all-reduce decomposed (by `decompose`)
    with flow ids from `first_id`, whose flows lost `lost` (flow id -> (offset, bytes) ranges of the flow)."""
    n = coll.size
    rs_steps = n - 1
    out: dict[int, list[Range]] = {r: [] for r in coll.ranks}
    base = {0: 0}  # channel -> tensor offset of its share
    for fid, c, order, sender, pieces, slices in _ring_flows(coll, topo, opts, first_id):
        base.setdefault(c + 1, base[c] + sum(slices))
        ranges = lost.get(fid, ())
        if not ranges:
            continue
        for step, j, within, length in _overlaps(ranges, pieces):
            tensor = (base[c] + sum(slices[:j]) + within, length)
            if step < rs_steps:
                targets: Sequence[int] = range(n)  # the reduced value is lost
            else:  # the receiver and every later receiver of this slice in the all-gather
                last = 2 * rs_steps - 1
                targets = [(sender + d) % n for d in range(1, last - step + 2)]
            for pos in targets:
                out[coll.ranks[order[pos]]].append(tensor)
    return {r: merge(v) for r, v in out.items() if v}


def reduce_scatter_lost_ranges(
    coll: Collective, topo: Topology, opts: AlgoOptions, first_id: int, lost: Mapping[int, Sequence[Range]]
) -> dict[int, list[Range]]:
    """Global rank -> merged byte ranges of its output shard to zero, for a ring reduce-scatter (`supports_loss`)
    with flow ids from `first_id`, whose flows lost `lost`.

    Group member g's output is input bytes [g S, (g+1) S) reduced, S = nbytes / n. Channel c carries the part
    [sum of earlier shares / n, + share_c / n) of every member's output; its slice j is that part of the output
    of the member at ring position j, the only rank that receives slice j reduced. A byte of slice j lost at
    any step loses the reduced value: that rank gets zeros there (not the partial sum of the ranks after the
    loss; see docs/collectives.md)."""
    out: dict[int, list[Range]] = {r: [] for r in coll.ranks}
    base = {0: 0}  # channel -> offset of its part within every output shard
    for fid, c, order, _sender, pieces, slices in _ring_flows(coll, topo, opts, first_id):
        base.setdefault(c + 1, base[c] + slices[0])  # equal slices: supports_loss checked share % n == 0
        ranges = lost.get(fid, ())
        for _step, j, within, length in _overlaps(ranges, pieces) if ranges else ():
            out[coll.ranks[order[j]]].append((base[c] + within, length))
    return {r: merge(v) for r, v in out.items() if v}


def merge(ranges: Sequence[Range]) -> list[Range]:
    """Sorted, overlapping or touching ranges joined."""
    merged: list[list[int]] = []
    for off, length in sorted(ranges):
        if merged and off <= merged[-1][0] + merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], off + length - merged[-1][0])
        else:
            merged.append([off, length])
    return [(a, b) for a, b in merged]
