"""`FlowDag`, the result of decomposing a collective, and `DagBuilder`, which the algorithms use to make one."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from phantora.errors import InputError
from phantora.netsim.base import Flow

MAX_FLOWS = 1_000_000  # per collective: beyond this a DAG costs GBs; coarse granularity is the answer


@dataclass
class FlowDag:
    """Point-to-point flows of one collective.

    `flows` have ids ``first_flow_id .. next_id - 1`` and depend only on flows of this DAG.
    `rank_last[r]` lists the flows whose completion means global rank r is done; an empty list
    means the rank is done as soon as the collective starts (n == 1, nbytes == 0, or a rank that
    takes no part in the traffic).
    """

    flows: list[Flow]
    rank_last: dict[int, list[int]]
    next_id: int
    choice: dict[str, Any] | None = None  # what NCCL's model chose (algorithm, protocol, channels, times); see nccl/


def ecmp_key(src: int, dst: int, channel: int) -> int:
    """ECMP hash key of one connection: one per (channel, src node, dst node), like one NCCL queue pair.

    The key does not depend on the collective, so repeated collectives reuse their paths, as NCCL's
    persistent connections do; different channels get different keys and so spread over ECMP paths.
    """
    return (channel << 48) | (src << 24) | dst


def communicator_id(family: str, ranks: Sequence[int]) -> int:
    """A stable 63-bit id of one NCCL connection set: the algorithm family (ring, tree, p2p, ...) of one group.

    NCCL connects each communicator once per family (the ring's and the tree's peers have their own connections,
    p2p has its own) and keeps those queue pairs for the communicator's life. Not Python's `hash`: the id must be
    the same in every process and run.
    """
    text = family + ":" + ",".join(map(str, ranks))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def connection_id(comm: int, src: int, dst: int, channel: int) -> int:
    """The queue pair of one channel from endpoint `src` to endpoint `dst` in communicator `comm` (never 0)."""
    text = f"{comm}:{channel}:{src}:{dst}"
    return (int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1) | 1


def split(total: int, parts: int) -> list[int]:
    """`total` split into `parts` near-equal integers (the first ``total % parts`` get one more)."""
    q, r = divmod(total, parts)
    return [q + 1 if i < r else q for i in range(parts)]


@dataclass
class DagBuilder:
    """Allocates flow ids, maps group positions to endpoint nodes, and collects flows."""

    nodes: list[int]  # endpoint node of each group position
    ranks: tuple[int, ...]  # global rank of each group position
    first_id: int
    prefix: str  # tag prefix, "" or "coll7/"
    comm: int = 0  # `communicator_id` of the collective's connections; 0 = each flow a queue pair of its own
    flows: list[Flow] = field(default_factory=list)
    _conns: dict[tuple[int, int, int], int] = field(default_factory=dict)

    def add(
        self,
        src: int,
        dst: int,
        size: int,
        tag: str,
        channel: int,
        deps: tuple[int, ...] = (),
        delay_ns: int = 0,
    ) -> int:
        """Add a flow from group position `src` to position `dst`; return its id."""
        if len(self.flows) >= MAX_FLOWS:
            raise InputError(
                f"this collective needs more than {MAX_FLOWS:,} flows ({len(self.ranks)} ranks); use the coarse "
                "granularity, fewer channels or bigger chunks",
                field="granularity",
            )
        fid = self.first_id + len(self.flows)
        s, d = self.nodes[src], self.nodes[dst]
        conn = 0
        if self.comm:
            conn = self._conns.get((s, d, channel), 0)
            if not conn:
                conn = self._conns[s, d, channel] = connection_id(self.comm, s, d, channel)
        key = ecmp_key(s, d, channel)
        self.flows.append(Flow(fid, s, d, size, deps, delay_ns, self.prefix + tag, key=key, conn=conn))
        return fid

    def finish(self) -> FlowDag:
        """The DAG with `rank_last` computed.

        A rank's last flows are the flows it sends or receives that no other flow of the same rank
        depends on directly. Every other flow of the rank is an ancestor of one of them, so the rank
        is done exactly when all of them are.
        """
        by_node = {node: pos for pos, node in enumerate(self.nodes)}
        base = self.first_id
        covered: set[tuple[int, int]] = set()  # (position, flow id) made redundant by a later flow
        for f in self.flows:
            if not f.deps:
                continue
            ends = (by_node[f.src], by_node[f.dst])
            for d in f.deps:
                g = self.flows[d - base]
                for pos in ends:
                    if by_node[g.src] == pos or by_node[g.dst] == pos:
                        covered.add((pos, d))
        last: dict[int, list[int]] = {r: [] for r in self.ranks}
        for f in self.flows:
            for pos in dict.fromkeys((by_node[f.src], by_node[f.dst])):
                if (pos, f.id) not in covered:
                    last[self.ranks[pos]].append(f.id)
        return FlowDag(self.flows, last, base + len(self.flows))
