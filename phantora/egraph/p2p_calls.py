"""The transfers of a recorded pairwise collective (uneven all-to-all, gather, scatter), found again in a graph.

A live rank sends such a call as one NCCL group of transfers on its group's communicator (nccl/p2p_group.py), and
the recording holds them as consecutive P2P nodes with the call's negative tag (`flow_tags.group_tag`, which names
the kind and group). Members issue a group's collectives in one order, so a rank's k-th run of such nodes with tag
T is that group's k-th call, and the call's sends across its members are its pairs, which a replay rates together
as the live coordinator does. Old recordings hold the same nodes: nothing new is stored.
"""

from __future__ import annotations

from collections import defaultdict

from phantora.collectives.flow_tags import pairwise_groups
from phantora.egraph.format import P2P, ExecGraph, Program

Call = tuple[int, int]  # (negative p2p tag, the call's index among the rank's calls with that tag)


def call_runs(prog: Program) -> dict[Call, list[int]]:
    """Each pairwise call of `prog` -> its P2P node indices: a run of consecutive P2P nodes with one negative tag, a
    new run where the tag changes, another node comes between, or a slot and direction repeat."""
    out: dict[Call, list[int]] = {}
    count: dict[int, int] = defaultdict(int)
    cur: Call | None = None
    seen: set[tuple[int, bool]] = set()
    last = -2
    for i, n in enumerate(prog.nodes):
        if not isinstance(n, P2P) or n.tag >= 0:
            continue
        side = (n.slot, n.is_send)
        if cur is None or last != i - 1 or cur[0] != n.tag or side in seen:
            cur, seen = (n.tag, count[n.tag]), set()
            count[n.tag] += 1
            out[cur] = []
        out[cur].append(i)
        seen.add(side)
        last = i
    return out


class CallGroups:
    """A graph's pairwise calls: which call a P2P node is, and each call's communicator and pairs' bytes."""

    def __init__(self, graph: ExecGraph) -> None:
        self.graph = graph
        self.groups = pairwise_groups([*graph.groups, tuple(range(graph.world))])
        self._runs: dict[int, dict[Call, list[int]]] = {}
        self._of: dict[int, dict[int, Call]] = {}
        self._pairs: dict[Call, tuple[tuple[int, ...], dict[tuple[int, int], int]] | None] = {}

    def _program(self, rank: int) -> int:
        prog = self.graph.ranks[rank].program
        if prog not in self._runs:
            runs = call_runs(self.graph.programs[prog])
            self._runs[prog] = runs
            self._of[prog] = {i: call for call, nodes in runs.items() for i in nodes}
        return prog

    def call_of(self, rank: int, node: int) -> Call | None:
        """The pairwise call P2P node `node` of `rank` belongs to (None: a user's send or receive)."""
        return self._of[self._program(rank)].get(node)

    def pairs(self, call: Call) -> tuple[tuple[int, ...], dict[tuple[int, int], int]] | None:
        """The call's communicator (its group's global ranks) and the bytes of each (src, dst) transfer its members
        sent; None when its group is not among the graph's."""
        if call not in self._pairs:
            self._pairs[call] = self._find(call)
        return self._pairs[call]

    def _find(self, call: Call) -> tuple[tuple[int, ...], dict[tuple[int, int], int]] | None:
        named = self.groups.get(call[0])
        if named is None:
            return None
        comm = named[1]
        out: dict[tuple[int, int], int] = {}
        for r in comm:
            prog = self._program(r)
            for i in self._runs[prog].get(call, ()):
                n = self.graph.programs[prog].nodes[i]
                assert isinstance(n, P2P)
                if n.is_send:
                    src, dst = self.graph.group_of(r, n.slot)
                    out[(src, dst)] = n.nbytes
        return comm, out
