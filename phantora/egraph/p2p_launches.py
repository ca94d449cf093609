"""The NCCL groups of a recorded graph's transfers, joined by the ranks' group launches, as the live coordinator joins
them (bridge/p2p_batch.py).

A live rank sends a batch_isend_irecv, a coalescing block of sends and receives, or a pairwise collective's
transfers as one NCCL group launch on a communicator, and the recording keeps it (`P2P.launch`, `P2P.comm`) with the
issue time of each of its transfers' ends (`recorded.launch_issue_ns`). A group is the launches joined through their
pairs (a ring's are one group), and the live coordinator rates each pair with the group's others in flight, each
starting at the later of its two ends' issues (`Collective.inflight_at`). Here the same groups are found over the
whole graph, and each pair gets that answer from the recorded issue times; a graph without them (made by a tool, or
scaled) starts a group's pairs together.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phantora.egraph.format import LAUNCH_ISSUE, P2P, ExecGraph

Pair = tuple[int, int]
PairKey = tuple[int, int, int, int]  # (src, dst, tag, seq): a transfer, as the replay matches it
LaunchKey = tuple[int, int]  # (rank, P2P.launch)


@dataclass
class Group:
    """One NCCL group: its communicator, and each pair's start (ns, as recorded) and bytes."""

    comm: tuple[int, ...]
    pairs: dict[Pair, tuple[int, int]] = field(default_factory=dict)

    def inflight(self, pair: Pair) -> tuple[tuple[Pair, ...], tuple[tuple[int, int, int, int], ...]]:
        """The group's pairs (sorted) and the (src, dst, start offset, bytes) of those that start at another time
        or move other bytes than `pair`, as the live coordinator answers (`P2pBatches.inflight`); ((), ()) for a
        pair alone in its group."""
        if len(self.pairs) < 2:
            return (), ()
        t, n = self.pairs[pair]
        order = tuple(sorted(self.pairs))
        at = tuple((a, b, s - t, m) for a, b in order for s, m in [self.pairs[(a, b)]] if (s, m) != (t, n))
        return order, at


class LaunchGroups:
    """A graph's transfers of group launches: which group each is in."""

    def __init__(self, graph: ExecGraph) -> None:
        times = graph.recorded.get(LAUNCH_ISSUE)
        ends: dict[PairKey, list[tuple[LaunchKey, tuple[int, ...], int, int]]] = {}
        nodes: dict[int, list[int]] = {}
        for r, e in enumerate(graph.ranks):
            prog = graph.programs[e.program]
            if e.program not in nodes:
                nodes[e.program] = prog.launch_nodes()
            for k, i in enumerate(nodes[e.program]):
                n = prog.nodes[i]
                assert isinstance(n, P2P)
                src, dst = graph.group_of(r, n.slot)
                t = times[r][k] if times else 0
                ends.setdefault((src, dst, n.tag, n.seq), []).append(
                    ((r, n.launch), graph.group_of(r, n.comm), t, n.nbytes)
                )
        self._parent: dict[LaunchKey, LaunchKey] = {}
        joined: list[tuple[PairKey, LaunchKey, tuple[int, ...], int, int]] = []
        for key, sides in ends.items():
            if len(sides) == 2 and sides[0][1] == sides[1][1]:  # both ends on one communicator (`grouped_comm`)
                a, b = self._find(sides[0][0]), self._find(sides[1][0])
                self._parent[max(a, b)] = min(a, b)
                joined.append((key, sides[0][0], sides[0][1], max(sides[0][2], sides[1][2]), sides[0][3]))
        self._groups: dict[LaunchKey, Group] = {}
        self._of: dict[PairKey, Group] = {}
        for key, launch, comm, start, nbytes in joined:
            g = self._groups.setdefault(self._find(launch), Group(comm))
            g.pairs[(key[0], key[1])] = (start, nbytes)
            self._of[key] = g

    def _find(self, k: LaunchKey) -> LaunchKey:
        self._parent.setdefault(k, k)
        while self._parent[k] != k:
            self._parent[k] = self._parent[self._parent[k]]
            k = self._parent[k]
        return k

    def of(self, key: PairKey) -> Group | None:
        """The group of the transfer `key`; None for a lone send/recv (or one whose ends name other
        communicators)."""
        return self._of.get(key)
