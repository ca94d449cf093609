"""PAT (Parallel Aggregated Trees): NCCL's all-gather and reduce-scatter for one GPU per node.

A Bruck-style schedule of ceil(log2 n) rounds: in round k, position r sends to r + 2^k (all-gather) the blocks it
has gathered so far (2^k of them, fewer in the last round), so n - 1 blocks reach every position in log2 n rounds
instead of the ring's n - 1 steps. Reduce-scatter runs the same rounds with partial sums, towards r - 2^k.
Each rank sends (n - 1)/n S in all, as in a ring.

Coarse: a round is one flow a rank, once the sender's previous send and receive have arrived. Chunked (`chunk`):
a round's send is NCCL's steps of `chunk` bytes on its connection, up to `window` (NCCL_STEPS) in flight, each
once the data it carries is there (`DagBuilder.add_chunks`'s `ready`), and a rank's steps go on the wire one at a
time in the order they become ready (`DagBuilder.sender_queue`): NCCL's PAT kernel (all_gather.h,
reduce_scatter.h, v2.30.7-1) has one thread compute the ops of every round in turn (`PatAGAlgorithm::getNextOp`)
and its workers copy them in that order, each op into a slot of its peer's connection. The data a step carries:
all-gather sends its own block, then what each round before brought, in that order (its send buffer grows by
each round's receipt); reduce-scatter forwards, reduced, the first bytes the round before brought.
"""

from __future__ import annotations

from phantora.collectives.dag import DagBuilder, chunks_of, split

Held = list[tuple[int, int, int]]  # (first byte, end byte, flow id): what a position received, where in its buffer


def _rounds(kind: str, n: int) -> list[tuple[int, int]]:
    """(distance, blocks sent) of each round, in the order they run."""
    rounds = []
    dist = 1
    while dist < n:
        rounds.append((dist, min(dist, n - dist)))  # all-gather: gathered blocks double each round
        dist *= 2
    if kind == "reduce_scatter":
        rounds.reverse()  # partial sums of many blocks first, one block last
    return rounds


def pat_flows(
    b: DagBuilder, kind: str, n: int, nbytes: int, name: str = "pat", chunk: int = 0, window: int = 1
) -> None:
    """The rounds of a PAT all-gather (kind "all_gather") or reduce-scatter over n positions; `chunk` > 0: in
    NCCL's steps of `chunk` bytes, `window` in flight per connection (see the module)."""
    block = split(nbytes, n)[0]
    sign = 1 if kind == "all_gather" else -1
    if chunk > 0:
        _chunked(b, kind, n, block, sign, name, chunk, window)
        return
    last_send: list[int | None] = [None] * n
    last_recv: list[int | None] = [None] * n
    for k, (dist, count) in enumerate(_rounds(kind, n)):
        sends = []
        for r in range(n):
            deps = tuple(x for x in (last_send[r], last_recv[r]) if x is not None)
            dst = (r + sign * dist) % n
            sends.append((dst, b.add(r, dst, block * count, f"{name}/round{k}", 0, deps)))
        for r, (dst, fid) in enumerate(sends):
            last_send[r] = fid
            last_recv[dst] = fid


def _needs(held: Held, lo: int, hi: int) -> tuple[int, ...]:
    """The received steps that bring any of bytes [lo, hi) of a position's buffer."""
    return tuple(fid for a, z, fid in held if a < hi and z > lo)


def _chunked(b: DagBuilder, kind: str, n: int, block: int, sign: int, name: str, chunk: int, window: int) -> None:
    """PAT's rounds in steps: see the module."""
    gather = kind == "all_gather"
    held: list[Held] = [[] for _ in range(n)]  # all-gather: the buffer past the own block; else the last receipt
    queues = [b.sender_queue(r) for r in range(n)]
    for k, (dist, count) in enumerate(_rounds(kind, n)):
        size = block * count
        base = block if gather else 0  # all-gather's buffer starts with the position's own block, ready at once
        got: list[Held] = [[] for _ in range(n)]
        for r in range(n):
            dst = (r + sign * dist) % n
            sizes = chunks_of(size, chunk)
            ready, at = [], 0
            for s in sizes:
                ready.append(_needs(held[r], max(at, base) - base, at + s - base) if at + s > base else ())
                at += s
            ids = b.add_chunks(r, dst, sizes, f"{name}/round{k}", 0, window=window, ready=ready, queue=queues[r])
            at = (block * dist - base) if gather else 0  # where the receipt lands in dst's buffer
            for s, fid in zip(sizes, ids, strict=True):
                got[dst].append((at, at + s, fid))
                at += s
        for r in range(n):
            held[r] = held[r] + got[r] if gather else got[r]
