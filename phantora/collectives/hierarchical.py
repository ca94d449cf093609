"""Hierarchical all-reduce: reduce-scatter inside each host, all-reduce across hosts, all-gather inside each host."""

from __future__ import annotations

from typing import Any

from phantora.collectives.dag import DagBuilder, split
from phantora.collectives.ring import ring_flows


def hierarchical_all_reduce(
    b: DagBuilder,
    blocks: list[list[int]],
    nbytes: int,
    channels: int,
    *,
    chunked: bool,
    chunk_bytes: int,
    step_delay_ns: int,
) -> None:
    """Three ring phases per channel over H hosts of m ranks each (the caller checks the host structure).

    Channel c carries its share S_c of the buffer. (1) Each host runs a ring reduce-scatter of S_c
    over its m ranks (NVLink); local rank i ends with slice i. (2) The ranks with local index i on
    every host run a ring all-reduce of slice i across hosts (each over its own NIC). (3) Each host
    runs a ring all-gather of the m slices. A rank starts a phase once everything it receives at the
    last step of the previous phase has arrived.
    """
    m = len(blocks[0])
    opts: dict[str, Any] = {"chunked": chunked, "chunk_bytes": chunk_bytes, "step_delay_ns": step_delay_ns}
    for c, size in enumerate(split(nbytes, channels)):
        slices = split(size, m)
        done: dict[int, tuple[int, ...]] = {}  # group position -> flows it waits for before the next phase
        for h, block in enumerate(blocks):
            got = ring_flows(b, "reduce_scatter", block, slices, c, name=f"hier/rs/h{h}", **opts)
            for i, pos in enumerate(block):
                done[pos] = tuple(got[i])
        for i in range(m):
            order = [block[i] for block in blocks]
            start = [done[pos] for pos in order]
            got = ring_flows(
                b, "all_reduce", order, split(slices[i], len(blocks)), c, name=f"hier/ar/l{i}", start_deps=start, **opts
            )
            for j, pos in enumerate(order):
                done[pos] = tuple(got[j])
        for h, block in enumerate(blocks):
            start = [done[pos] for pos in block]
            ring_flows(b, "all_gather", block, slices, c, name=f"hier/ag/h{h}", start_deps=start, **opts)
