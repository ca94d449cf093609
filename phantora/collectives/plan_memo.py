"""`PlanMemo`: a live run's collectives decomposed once, each repeat copied to its flow ids, tag and message counters.

A training step issues the same collectives as the step before, and `decompose` is a pure function of the call, the
topology and the options except for three things a repeat changes: its flow ids (from `first_flow_id`; a DAG's deps
are ids of its own flows), its tag prefix, and the run's message counters (`MessageCounters`), which a
decomposition reads and moves only where a connection's messages take its queue pairs in turn
(NCCL_IB_QPS_PER_CONNECTION > 1 without NCCL_IB_SPLIT_DATA_ON_QPS): there message k goes on queue pair k mod qps.
So a repeat's DAG is the first one's with every id and dep moved by one offset and the tag prefix swapped, provided
each connection the first one posted to stands at the same count mod qps; the counters then move by what the first
one posted. Unlike `dag_memo.DagMemo` (replays, whose flows are gated on the call's start) the flows keep the deps
they were decomposed with, and a call that posts is copied too.

The key is everything else `decompose` reads: the `Collective` (kind, ranks, bytes, dtype, root, communicator, a
group's calls, a launch's pairs), the `AlgoOptions` (NCCL_* variables, granularity, algorithm overrides) and, where
the options carry no NCCL_* variables, this process's (`settings.nccl_env`); the topology is the memo's own.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from phantora.collectives.dag import FlowDag, MessageCounters
from phantora.collectives.decompose import decompose
from phantora.collectives.nccl import settings as nccl_settings
from phantora.collectives.nccl.settings import nccl_env
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.netsim.base import Flow, moved_flows
from phantora.topology.model import Topology

Conn = tuple[int, int, int, int]  # a `MessageCounters` key: (communicator, src, dst, channel)
MAX_HELD_FLOWS = 1_000_000  # flows the memo keeps at most over all its calls (the oldest calls dropped first)


class Posting(dict[Conn, int]):
    """`MessageCounters` that note each connection's count before a decomposition first posts to it (`before`)."""

    def __init__(self, counts: MessageCounters) -> None:
        super().__init__(counts)
        self.before: dict[Conn, int] = {}

    def __setitem__(self, key: Conn, value: int) -> None:
        if key not in self.before:
            self.before[key] = dict.get(self, key, 0)
        dict.__setitem__(self, key, value)


@dataclass(frozen=True)
class _Made:
    """A call's first decomposition: its first id, flows and their tags past the prefix, and what it posted: each
    connection's count before it mod `qps` (`at`) and the messages it posted there (`posts`)."""

    first: int
    span: int  # ids it took (`FlowDag.next_id` - first)
    flows: list[Flow]
    tails: list[str]
    rank_last: dict[int, list[int]]
    choice: dict[str, Any] | None
    qps: int
    at: tuple[tuple[Conn, int], ...]
    posts: tuple[tuple[Conn, int], ...]

    def fits(self, sent: MessageCounters) -> bool:
        """Whether a decomposition on `sent` posts each message to the queue pair this one did."""
        q = self.qps
        return all(sent.get(k, 0) % q == r for k, r in self.at)


class PlanMemo:
    """`decompose` on one topology, a repeat of a call served as a copy of its first decomposition."""

    def __init__(self, topo: Topology, max_flows: int = MAX_HELD_FLOWS) -> None:
        self.topo = topo
        self.max_flows = max_flows
        self._made: OrderedDict[Hashable, list[_Made]] = OrderedDict()
        self._held = 0  # flows in `_made`
        self.copies = 0  # calls served as a copy
        self.misses = 0  # calls decomposed

    def decompose(self, coll: Collective, opts: AlgoOptions, first: int, tag: str, sent: Posting) -> FlowDag:
        """`decompose(coll, topo, opts, first_flow_id=first, tag=tag, sent=sent)`, the same DAG and the same moves
        of `sent`."""
        key = (coll, opts, nccl_env() if opts.nccl_env is None else None)
        prefix = f"{tag}/" if tag else ""
        made_list = self._made.get(key)
        for made in made_list or ():
            if made.fits(sent):
                self.copies += 1
                self._made.move_to_end(key)
                for k, n in made.posts:
                    sent[k] = sent.get(k, 0) + n
                return _moved(made, first, prefix)
        self.misses += 1
        sent.before = {}
        dag = decompose(coll, self.topo, opts, first_flow_id=first, tag=tag, sent=sent)
        self._keep(key, dag, first, prefix, opts, sent)
        return dag

    def _keep(self, key: Hashable, dag: FlowDag, first: int, prefix: str, opts: AlgoOptions, sent: Posting) -> None:
        """Keep `dag` for `key`'s repeats, unless it is too big to hold, a tag lies outside the prefix or a dep outside
        its ids."""
        n, end = len(dag.flows), dag.next_id
        if n > self.max_flows:
            return
        cut = len(prefix)
        tags = [f.tag for f in dag.flows]
        if not all(t[:cut] == prefix for t in tags):
            return
        if not all(first <= d < end for f in dag.flows for d in f.deps):
            return
        posts = tuple((k, sent[k] - b) for k, b in sent.before.items())
        qps = nccl_settings(opts).qps_per_conn if posts else 1
        if posts and qps < 2:  # (only queue pairs in turn post)
            return
        at = tuple((k, b % qps) for k, b in sent.before.items())
        made = _Made(first, end - first, dag.flows, [t[cut:] for t in tags], dag.rank_last, dag.choice, qps, at, posts)
        self._made.setdefault(key, []).append(made)
        self._made.move_to_end(key)
        self._held += n
        while self._held > self.max_flows:
            _, dropped = self._made.popitem(last=False)
            self._held -= sum(len(m.flows) for m in dropped)


def _moved(made: _Made, first: int, prefix: str) -> FlowDag:
    """`made`'s DAG with its ids from `first` and its tags under `prefix`."""
    delta = first - made.first
    flows = moved_flows(made.flows, delta, prefix, made.tails, ())
    last = {r: [i + delta for i in ids] for r, ids in made.rank_last.items()}
    return FlowDag(flows, last, first + made.span, copy.deepcopy(made.choice))
