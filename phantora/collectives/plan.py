"""The collective -> flow step of a live run, behind one call: `CollectivePlanner.plan`.

The coordinator (bridge/) matches the calls of a collective's ranks and hands the matched call here; it gets back
the flows to submit, which flows each live rank waits for, and what was decided on the way:
- rank deduplication: one call stands for every shift of its group (`mirrors.Mirrors`), each shift's flows included;
- the traffic class and the DLCP loss policy (`traffic.py`): which flows may lose bytes, or why the collective was
  kept lossless;
- NCCL's algorithm, protocol and channel choice (`nccl/`), recorded for the trace and results.json.

Pure apart from the flow-id counter, the message counters and the memo of decompositions (`plan_memo.PlanMemo`:
a repeated call's flows copied from its first, as decomposing it again gives them): no clock, no I/O, no engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

from phantora.collectives.back_pressure import is_credit
from phantora.collectives.dag import MessageCounters
from phantora.collectives.decompose import decompose
from phantora.collectives.flow_tags import collective_tag, transfer_tag
from phantora.collectives.launch_group import LaunchGroup
from phantora.collectives.mirrors import Mirrors
from phantora.collectives.plan_memo import PlanMemo, Posting
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.collectives.traffic import LOSSY_KINDS, Range, lossless_reason, lost_ranges
from phantora.netsim.base import Flow
from phantora.topology.model import Topology


@dataclass(frozen=True)
class CallSpec:
    """A matched collective, as every rank issued it. `root` is a group-local index; `algo` the per-call fields
    (algorithm overrides, ``traffic_class``, ``loss_tolerance``)."""

    kind: str
    group: tuple[int, ...]
    nbytes: int
    dtype: str
    root: int | None = None
    name: str = ""
    algo: Mapping[str, Any] = field(default_factory=dict)
    comm: tuple[int, ...] = ()  # a grouped send/recv's communicator (global ranks in group order); () otherwise
    # a grouped send/recv: the (src, dst) of every transfer of its launch on `comm`, its own among them, all in flight
    # at once (bridge/p2p_batch.py; live ranks' pairs under deduplication); () when it is alone
    inflight: tuple[tuple[int, int], ...] = ()
    # (src, dst, start offset ns, bytes) of the `inflight` pairs that start at another time or move other bytes
    inflight_at: tuple[tuple[int, int, int, int], ...] = ()
    redop: str = "sum"  # the reduction of an all-reduce, reduce-scatter or reduce (Collective.redop)
    # a grouped send/recv: its NCCL group as the launch knows it, one object shared by the launch's pairs
    # (bridge/p2p_batch.py), instead of `inflight` / `inflight_at`
    launch: LaunchGroup | None = None
    launch_op: int = 0  # which of its pair's operations in `launch` it is (Collective.launch_op)


@dataclass
class Plan:
    """The flows of one matched collective and what the coordinator needs to follow them."""

    flows: list[Flow]
    last: dict[int, set[int]]  # live rank -> the flows whose arrival means it is done (empty: done at the start)
    copies: int  # group shifts launched (rank deduplication), 1 without it
    traffic_class: int | None  # the class given to its flows (None: the flows' default)
    lossy: tuple[Collective, AlgoOptions] | None  # DLCP: how to map lost flow bytes to tensor bytes
    lossless_why: str | None  # asked to be loss-tolerant but kept lossless, and why
    choice: dict[str, Any] | None  # NCCL's algorithm, protocol and channels (and the model's time)


class CollectivePlanner:
    """Turns matched collectives into flows on one topology, with ids counted from `next_flow`. `memo`: repeated
    calls copied from their first decomposition (`plan_memo`; False: each decomposed anew, the same flows)."""

    def __init__(
        self, topology: Topology, algo: AlgoOptions, mirrors: Mirrors, next_flow: int = 0, memo: bool = True
    ) -> None:
        self.topology = topology
        self.algo = algo
        self.mirrors = mirrors
        self.next_flow = next_flow
        self.sent: MessageCounters = {}  # the run's network connections' message counters (one QP in turn each)
        self.memo = PlanMemo(topology) if memo else None

    def plan(self, call: CallSpec, tag: str) -> Plan:
        """The flows of `call` (all its group's shifts under deduplication), tagged `tag` (the call's name) and the
        ranks of each shift (`flow_tags`: `all_reduce#3@0-7`, `send#0@2>5`), so no two groups' flows share a tag.

        Raises PhantoraError (or NotPeriodicError) on a collective that cannot run; ids advance only on success.
        """
        copies = self.mirrors.copies(call.group) if self.mirrors.active else (call.group,)
        over = dict(call.algo)
        cls = over.pop("traffic_class", None)
        sizes = tuple(over.pop("group_sizes", ()) or ())  # a coalesced call's calls: one NCCL group (spec.py)
        types = tuple(over.pop("group_dtypes", ()) or ())  # their dtypes, where they differ
        # their kinds, reductions and roots (group-local), where they differ: a device block's one plan
        kinds, redops, roots = (tuple(over.pop(k, ()) or ()) for k in ("group_kinds", "group_redops", "group_roots"))
        tolerance = float(over.pop("loss_tolerance", 0.0) or 0.0)
        algo = dataclasses.replace(self.algo, **over) if over else self.algo
        lossy, lossless_why = self._loss_policy(call, algo, tolerance)
        flows: list[Flow] = []
        last: dict[int, set[int]] = {}
        next_id = self.next_flow
        sent = Posting(self.sent)  # kept only on success, as the ids
        memo = self.memo
        if memo is not None and memo.topo is not self.topology:  # another topology: other plans
            memo = self.memo = PlanMemo(self.topology)
        choice = None
        for copy in copies:
            comm = call.comm  # a grouped send/recv's; a shifted copy's is its mirrors' communicator
            if comm and self.mirrors.active:
                comm = self.mirrors.copy_comm(call.group, copy, comm)
            launch = self._launch(call, copy, comm)
            if launch is not None:
                coll = Collective(
                    call.kind, copy, call.nbytes, call.dtype, call.root, comm, redop=call.redop, launch=launch,
                    launch_op=call.launch_op,
                )  # fmt: skip
            else:
                inflight, inflight_at = self._inflight(call, copy, comm)
                coll = Collective(
                    call.kind, copy, call.nbytes, call.dtype, call.root, comm, inflight, inflight_at, redop=call.redop,
                    group_sizes=sizes, group_dtypes=types, group_kinds=kinds,
                    group_redops=redops, group_roots=roots,
                )  # fmt: skip
            ctag = self._tag(call, copy, tag)
            if memo is not None:
                dag = memo.decompose(coll, algo, next_id, ctag, sent)
            else:
                dag = decompose(coll, self.topology, algo, first_flow_id=next_id, tag=ctag, sent=sent)
            next_id = dag.next_id
            flows.extend(dag.flows)
            choice = choice or dag.choice
            for r in copy:
                last.setdefault(self.mirrors.live_of(r), set()).update(dag.rank_last.get(r, ()))
        self.next_flow, self.sent = next_id, sent
        if cls is not None or lossy is not None:
            budget = min(tolerance, 1.0) if lossy is not None else 0.0
            flows = [  # a clear-to-send carries no tensor bytes: it stays lossless (back_pressure.py)
                dataclasses.replace(
                    f,
                    priority=f.priority if cls is None else int(cls),
                    loss_budget=0 if is_credit(f) else int(f.size * budget),
                )
                for f in flows
            ]
        if lossy is not None:  # a rank learns its zeroed bytes when every flow is in: it waits for all of them
            everything = {f.id for f in flows}
            last = {r: set(everything) for r in last}
        return Plan(flows, last, len(copies), None if cls is None else int(cls), lossy, lossless_why, choice)

    def _tag(self, call: CallSpec, copy: tuple[int, ...], name: str) -> str:
        """The flows' tag of `call`'s shift `copy`: its name and ranks (a transfer's pair, and the ranks of the
        collective it belongs to carried to this shift)."""
        if call.kind != "send_recv":
            return collective_tag(name, copy)
        if not self.mirrors.active or copy == call.group:
            return transfer_tag(name, copy[0], copy[1])
        m = self.mirrors
        j = next(j for j in range(m.shifts) if m.shift_group(call.group, j) == copy)
        return transfer_tag(name, copy[0], copy[1], lambda g: m.shift_group(g, j))

    def _launch(self, call: CallSpec, copy: tuple[int, ...], comm: tuple[int, ...]) -> LaunchGroup | None:
        """The launch group of a grouped send/recv handed one (`CallSpec.launch`), its pairs on `comm` (under
        deduplication, every shift of them: `shifted`); None otherwise, or when `copy` is not among them."""
        if call.launch is None or not comm:
            return None
        g = call.launch
        own = (copy[0], copy[1])
        if self.mirrors.active:
            mine = g.ops((call.group[0], call.group[1]))
            m, live = self.mirrors, g
            g = g.cached(("shifted", m.world, m.live), lambda: shifted(live, m))
            if not mine or g.ops(own) != mine:  # a mirror's pair the group also holds as its own: `_inflight`
                return None
        g = g.within(comm)
        return g if own in g.index else None

    def _inflight(
        self, call: CallSpec, copy: tuple[int, ...], comm: tuple[int, ...]
    ) -> tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int, int, int], ...]]:
        """The transfers in flight with the shift `copy` of a grouped send/recv: its launch's pairs (and, under
        deduplication, every shift of them) on `comm`, and the starts and sizes of those that differ from its own
        (`CallSpec.inflight_at`, each shift as its pair); ((), ()) when it has none, or `copy` is not among them."""
        if call.launch is not None:  # under deduplication: the group as the call's own pair reads it, shifted below
            own = (call.group[0], call.group[1])
            if own not in call.launch.index:
                return (), ()
            pairs_of, starts_of = call.launch.answer(own)
            call = dataclasses.replace(call, launch=None, inflight=pairs_of, inflight_at=starts_of)
        if not call.inflight or not comm:
            return (), ()
        members = set(comm)
        if not self.mirrors.active and members.issuperset(chain.from_iterable(call.inflight)):
            # every pair on `comm` (a world-size group: n(n-1) pairs, read here once per pair): no Python loop
            ours, named = set(call.inflight), set(map(itemgetter(0, 1), call.inflight_at))
            if named <= ours and len(named) == len(call.inflight_at) and len(ours) == len(call.inflight):
                mine = tuple(sorted(call.inflight))  # given in order: one pass
                return (mine, tuple(sorted(call.inflight_at))) if tuple(copy) in ours else ((), ())
        at = {(a, b): (dt, n) for a, b, dt, n in call.inflight_at}
        pairs = {(a, b): at.get((a, b)) for a, b in call.inflight}
        if self.mirrors.active:
            m = self.mirrors
            pairs = {(m.shift(a, j), m.shift(b, j)): x for (a, b), x in pairs.items() for j in range(m.shifts)}
        mine = tuple(sorted(p for p in pairs if p[0] in members and p[1] in members))  # in order unless shifted
        ours = set(mine)
        if tuple(copy) not in ours:
            return (), ()
        return mine, tuple((a, b, *x) for (a, b), x in sorted(pairs.items()) if x is not None and (a, b) in ours)

    def _loss_policy(
        self, call: CallSpec, algo: AlgoOptions, tolerance: float
    ) -> tuple[tuple[Collective, AlgoOptions] | None, str | None]:
        """DLCP: (the collective and options to map lost bytes with, or None; why it was kept lossless, or None)."""
        if tolerance <= 0:
            return None, None
        if call.kind not in LOSSY_KINDS:
            return None, f"{call.kind} is never loss-tolerant"
        coll = Collective(call.kind, call.group, call.nbytes, call.dtype, call.root, redop=call.redop)
        why = "rank deduplication" if self.mirrors.active else lossless_reason(coll, self.topology, algo)
        return (coll, algo) if why is None else None, why

    def lost_ranges(
        self, lossy: tuple[Collective, AlgoOptions], first_flow: int, lost: Mapping[int, Sequence[Range]]
    ) -> dict[int, list[Range]]:
        """Global rank -> tensor byte ranges it must zero, given the lost ranges of a lossy plan's flows."""
        coll, algo = lossy
        return lost_ranges(coll, self.topology, algo, first_flow, lost)


def shifted(g: LaunchGroup, m: Mirrors) -> LaunchGroup:
    """Launch group `g` of the live ranks' pairs with every shift of them (`Mirrors.shift`): the mirrors issue the
    same operations at the same times, so a shifted pair keeps its pair's operations (starts, bytes, in turn)."""
    ops = {(m.shift(a, j), m.shift(b, j)): g.ops((a, b)) for a, b in g.pairs for j in range(m.shifts)}
    order = sorted(ops)
    return LaunchGroup(
        tuple(order),
        tuple(ops[p][0][0] for p in order),
        tuple(ops[p][0][1] for p in order),
        later=tuple((a, b, k, s, n) for a, b in order for k, (s, n) in enumerate(ops[(a, b)][1:], 1)),
    )
