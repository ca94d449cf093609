"""`DagMemo`: a planner's collectives decomposed once per call, then copied to each repeat's flow ids and tag.

A training step issues the same collectives again and again (an FSDP step: each layer's all-gathers and
reduce-scatters over the same group and bytes). `decompose` is a pure function of the call, the topology and the
options, except for three things a repeat changes: its flow ids (from `first_flow_id`; a DAG's deps are ids of its
own flows), its tag prefix and the run's message counters (`MessageCounters`, which a repeat reads and moves only
when a connection's messages take its queue pairs in turn). So a repeat's DAG is the first one's with every id and
dep moved by the same offset and the tag prefix swapped, unless the first one posted to the counters: such a call
is decomposed every time.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from phantora.collectives.dag import FlowDag
from phantora.collectives.decompose import decompose
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.netsim.base import Flow, moved_flows
from phantora.topology.model import Topology


class _Counters(dict[tuple[int, int, int, int], int]):
    """`MessageCounters` that notes whether a decomposition posted a message to them."""

    posted = False

    def __setitem__(self, key: tuple[int, int, int, int], value: int) -> None:
        self.posted = True
        super().__setitem__(key, value)


@dataclass(frozen=True)
class _Made:
    """A call's first decomposition: its first id, its flows (deps as decomposed) and their tags past the prefix."""

    first: int
    flows: list[Flow]
    tails: list[str]
    rank_last: dict[int, list[int]]
    choice: dict[str, Any] | None


class DagMemo:
    """`decompose` for one planner on one topology, its message counters kept across calls (`sent`): each call's
    flows with those that depend on nothing gated on the call's start, `gated`."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.sent = _Counters()
        self._made: dict[tuple[Collective, AlgoOptions], _Made] = {}
        self.copies = 0  # calls served as a copy of an earlier one's DAG

    def gated(self, coll: Collective, opts: AlgoOptions, first: int, tag: str, gate: tuple[int, ...]) -> FlowDag:
        """The DAG `decompose(coll, topo, opts, first_flow_id=first, tag=tag, sent=self.sent)` gives, with `gate`
        as the deps of each flow that has none."""
        prefix = f"{tag}/" if tag else ""
        made = self._made.get((coll, opts))
        if made is not None:
            self.copies += 1
            return _moved(made, first, prefix, gate)
        self.sent.posted = False
        dag = decompose(coll, self.topo, opts, first_flow_id=first, tag=tag, sent=self.sent)
        cut = len(prefix)
        tags = [f.tag for f in dag.flows]
        if not self.sent.posted and all(t[:cut] == prefix for t in tags):
            self._made[coll, opts] = _Made(first, dag.flows, [t[cut:] for t in tags], dag.rank_last, dag.choice)
        flows = [f if f.deps else f.with_deps(gate) for f in dag.flows]
        return FlowDag(flows, dag.rank_last, dag.next_id, dag.choice)


def _moved(made: _Made, first: int, prefix: str, gate: tuple[int, ...]) -> FlowDag:
    """`made`'s DAG with its ids from `first`, its tags under `prefix`, gated on `gate`."""
    delta = first - made.first
    flows = moved_flows(made.flows, delta, prefix, made.tails, gate)
    last = {r: [i + delta for i in ids] for r, ids in made.rank_last.items()}
    return FlowDag(flows, last, first + len(flows), copy.deepcopy(made.choice))
