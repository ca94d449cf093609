"""PAT (Parallel Aggregated Trees): NCCL's all-gather and reduce-scatter for one GPU per node.

A Bruck-style schedule of ceil(log2 n) rounds: in round k, position r sends to r + 2^k (all-gather) the blocks it
has gathered so far (2^k of them, fewer in the last round), so n - 1 blocks reach every position in log2 n rounds
instead of the ring's n - 1 steps. Reduce-scatter runs the same rounds with partial sums, towards r - 2^k.
Each rank sends (n - 1)/n S in all, as in a ring; a round waits for the sender's previous send and receive.
"""

from __future__ import annotations

from phantora.collectives.dag import DagBuilder, split


def pat_flows(b: DagBuilder, kind: str, n: int, nbytes: int, name: str = "pat") -> None:
    """The rounds of a PAT all-gather (kind "all_gather") or reduce-scatter over n positions."""
    block = split(nbytes, n)[0]
    sign = 1 if kind == "all_gather" else -1
    last_send: list[int | None] = [None] * n
    last_recv: list[int | None] = [None] * n
    rounds = []
    dist = 1
    while dist < n:
        rounds.append((dist, min(dist, n - dist)))  # all-gather: gathered blocks double each round
        dist *= 2
    if kind == "reduce_scatter":
        rounds.reverse()  # partial sums of many blocks first, one block last
    for k, (dist, count) in enumerate(rounds):
        sends = []
        for r in range(n):
            deps = tuple(x for x in (last_send[r], last_recv[r]) if x is not None)
            dst = (r + sign * dist) % n
            sends.append((dst, b.add(r, dst, block * count, f"{name}/round{k}", 0, deps)))
        for r, (dst, fid) in enumerate(sends):
            last_send[r] = fid
            last_recv[dst] = fid
