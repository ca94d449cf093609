"""The NCCL groups of a recorded graph's transfers, joined by the ranks' group launches, as the live coordinator joins
them (bridge/p2p_batch.py).

A live rank sends a batch_isend_irecv, a coalescing block of sends and receives, or a pairwise collective's
transfers as one NCCL group launch on a communicator, and the recording keeps it (`P2P.launch`, `P2P.comm`) with, for
each end of such a transfer, its issue ns and the latest completion its rank had joined before issuing it
(`recorded.launch_issue_ns`), and from a window-mode run the network's ns its rank was last released at
(`recorded.launch_release_ns`: the coordinator's round): from them `phantora.p2p_knowledge` gives each pair the live
coordinator's answer. A graph without issue times (made by a tool, or scaled) starts its groups' pairs together, all
known.
"""

from __future__ import annotations

import dataclasses

from phantora.egraph.format import LAUNCH_ISSUE, LAUNCH_RELEASE, P2P, ExecGraph
from phantora.p2p_knowledge import Grouped, LaunchKey, PairKey, Transfer
from phantora.p2p_knowledge import LaunchGroups as _Sweep

__all__ = ["Grouped", "LaunchGroups"]


class LaunchGroups(_Sweep):
    """A graph's transfers of group launches, each with the live coordinator's answer (`of`). `held`: the transfers
    that waited on their NCCL stream after both ends issued them (an earlier call there still running), by how long:
    live, the coordinator parks such a pair until then (bridge/stream_order.py), so it starts then and the pairs
    launched before do not know it (`replay_graph` finds them in a first run's times)."""

    def __init__(self, graph: ExecGraph, held: dict[PairKey, int] | None = None) -> None:
        transfers = _transfers(graph)
        if held:
            transfers = [_held(t, held.get(t.key, 0)) for t in transfers]
        super().__init__(transfers)


def _held(t: Transfer, delay: int) -> Transfer:
    """`t` started `delay` ns after both ends issued it: known to the coordinator from then on (in window mode, to
    the rounds from the first the network reaches then)."""
    if delay <= 0:
        return t
    start = t.start + delay
    release = None if t.release is None else max(t.release, start)
    return dataclasses.replace(t, start=start, known=max(t.known, start), release=release)


def _transfers(graph: ExecGraph) -> list[Transfer]:
    """The graph's transfers whose two ends are P2P nodes of group launches on one communicator."""
    times = graph.recorded.get(LAUNCH_ISSUE)
    released = graph.recorded.get(LAUNCH_RELEASE) if times else None
    ends: dict[PairKey, list[tuple[LaunchKey, tuple[int, ...], int, int, int, int | None]]] = {}
    nodes: dict[int, list[int]] = {}
    for r, e in enumerate(graph.ranks):
        prog = graph.programs[e.program]
        if e.program not in nodes:
            nodes[e.program] = prog.launch_nodes()
        for k, i in enumerate(nodes[e.program]):
            n = prog.nodes[i]
            assert isinstance(n, P2P)
            src, dst = graph.group_of(r, n.slot)
            issued, joined = times[r][k] if times else (0, 0)
            release = released[r][k] if released else None
            side = ((r, n.launch), graph.group_of(r, n.comm), issued, joined, n.nbytes, release)
            ends.setdefault((src, dst, n.tag, n.seq) + ((n.pg,) if n.pg else ()), []).append(side)
    out = []
    for key, sides in ends.items():
        if len(sides) == 2 and sides[0][1] == sides[1][1]:  # both ends on one communicator (`grouped_comm`)
            (la, comm, ia, ja, nbytes, ra), (lb, _, ib, jb, _, rb) = sides
            release = None if ra is None or rb is None else max(ra, rb)
            out.append(Transfer(key, (la, lb), comm, max(ia, ib), max(ja, jb), nbytes, release))
    return out
