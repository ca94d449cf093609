"""The transfers of one NCCL group: a communicator's grouped send/recvs joined by the ranks' group launches.

nccl-tests' sendrecv_perf issues every rank's send and receive in one group (ncclGroupStart/End), all in flight at
once, and phantora rates such a group's pairs together where they share a PCIe host's links (`Collective.inflight`,
nccl/pci_p2p.py). A torch program's `batch_isend_irecv` (or isend/irecv in a coalescing block) is the same: at
ncclGroupEnd each rank launches one kernel for all its sends and receives of the group (enqueue.cc), and a pair's
transfer runs once both peers' kernels run (sendrecv.h: the sender waits for the receiver's buffer). So a group is
the pairs joined through the ranks' launches (rank r's launch holds its send to r + 1 and its receive from r - 1:
the ring's pairs are one group), whatever time each starts at. The coordinator matches and launches the pairs one
by one; here each learns the pairs of its group known then, launched or still held, with their starts and sizes
(`CallSpec.launch`: one `LaunchGroup` made once for each state of the group, which all the pairs launched in that
state share), so that it is rated in the group's schedule (`p2p_group.rate_group`, `pci_p2p.group_ends`). A pair
of the group that a rank has not issued yet, or that waits for an earlier call on its stream, is not known to those
before it. Several sends to one peer in one group (`_op_key`: by tag and seq, the order the rank issued them) are
that pair's operations in turn: its first in the group's pairs, the others as `LaunchGroup.later`, each rated as
which one it is (`launch_op`).
"""

from __future__ import annotations

import heapq
from bisect import insort
from dataclasses import dataclass, field
from itertools import groupby

from bridge.matching import Call, Rendezvous
from phantora.collectives.launch_group import At, LaunchGroup

Pair = tuple[int, int]
OpKey = tuple[int, int, int]  # (tag, seq, pg): a pair's operations in the order its ranks issue them
LaunchKey = tuple[int, int, int]  # (rank, launch id, 0) or, for a call without one, (rank, -1, issue time)


def grouped_comm(rv: Rendezvous) -> tuple[int, ...]:
    """The communicator both ends of a send/recv rendezvous named (`Call.comm`); () when they differ or name none."""
    comms = {c.comm for c in rv.calls.values()}
    return comms.pop() if len(comms) == 1 else ()


@dataclass
class _Group:
    """The launches joined by their pairs, and their pairs held or launched so far: (start, bytes) by operation by
    (src, dst), and the same pairs kept sorted as they join (`order`), so that no launch sorts the group again;
    `shared`, the group as it is now, handed to every pair launched until it changes."""

    keys: set[LaunchKey] = field(default_factory=set)
    pairs: dict[Pair, dict[OpKey, tuple[int, int]]] = field(default_factory=dict)
    order: list[Pair] = field(default_factory=list)
    shared: LaunchGroup | None = None


class P2pBatches:
    """The ranks' group launches of grouped send/recvs, joined into NCCL groups by the pairs between them."""

    def __init__(self) -> None:
        self._key: dict[tuple[int, int], LaunchKey] = {}  # (rank, handle) -> its launch
        self._parent: dict[LaunchKey, LaunchKey] = {}
        self._groups: dict[LaunchKey, _Group] = {}  # root -> its group
        self._issued: dict[LaunchKey, int] = {}  # calls a launch holds
        self._done: dict[LaunchKey, int] = {}  # of them launched
        self._open: dict[int, LaunchKey] = {}  # each rank's latest launch (later calls may still join it)
        self._handles: dict[LaunchKey, list[tuple[int, int]]] = {}  # a launch's (rank, handle)s

    def issued(self, call: Call, launch: int | None) -> None:
        """Rank `call.rank` issued a send/recv in its group launch `launch` (None: the calls it issues at the same
        time on the same communicator are its launch). Only grouped ones (`Call.comm`) count."""
        if not call.comm:
            return
        key = (call.rank, launch, 0) if launch is not None else (call.rank, -1, call.t)
        self._key[(call.rank, call.handle)] = key
        self._handles.setdefault(key, []).append((call.rank, call.handle))
        if key not in self._parent:
            self._parent[key] = key
            self._groups[key] = _Group({key})
        self._issued[key] = self._issued.get(key, 0) + 1
        before = self._open.get(call.rank)
        self._open[call.rank] = key
        if before is not None and before != key:
            self._prune(before)

    def held(self, rv: Rendezvous) -> None:
        """The send/recv `rv` is matched and held for launch at its start: its group knows it from now on."""
        self._join(rv)

    def launch(self, rv: Rendezvous, t: int) -> LaunchGroup | None:
        """The pairs of the send/recv `rv`'s group known now, held or launched (its own among them, starting at `t`),
        sorted, with their starts and bytes: one object shared by every pair launched until the group changes; None
        for a lone send/recv or one alone in its group. Records `rv` as launched at `t`."""
        return self.launch_op(rv, t)[0]

    def launch_op(self, rv: Rendezvous, t: int) -> tuple[LaunchGroup | None, int]:
        """`launch`, and which of its pair's operations known in the group `rv` is (0: the first, or alone)."""
        root = self._join(rv, t)
        if root is None:
            return None, 0
        group = self._groups[root]
        if group.shared is None and (len(group.order) > 1 or any(len(group.pairs[p]) > 1 for p in group.order)):
            group.shared = _launch_group(group)
        ops = group.pairs[(rv.key[1], rv.key[2])]
        op = sorted(ops).index(_op_key(rv)) if len(ops) > 1 else 0
        keys = [self._key[(c.rank, c.handle)] for c in rv.calls.values()]
        for k in keys:
            self._done[k] = self._done.get(k, 0) + 1
        for k in keys:
            self._prune(k)
        return group.shared, op

    def inflight(self, rv: Rendezvous, t: int) -> tuple[tuple[Pair, ...], tuple[At, ...]]:
        """`launch`'s group as `rv`'s pair reads it: the pairs (sorted), and the (src, dst, start - t, bytes) of those
        that start at another time than `t` or move other bytes (`CallSpec.inflight`, `inflight_at`); ((), ())
        for a lone send/recv or one alone in its group."""
        g = self.launch(rv, t)
        return ((), ()) if g is None else g.answer((rv.key[1], rv.key[2]))

    def _join(self, rv: Rendezvous, t: int | None = None) -> LaunchKey | None:
        """Put `rv`'s pair in the group of its ranks' launches (joining them), starting at `t` (default: its calls'
        latest time); the group's root, or None for a send/recv outside any group."""
        keys = [self._key.get((c.rank, c.handle)) for c in rv.calls.values()]
        if rv.key[0] != "p2p" or not grouped_comm(rv) or len(keys) != 2 or None in keys:
            return None
        root = self._union(*[k for k in keys if k is not None])
        group = self._groups[root]
        start = max(c.t for c in rv.calls.values()) if t is None else t
        entry = (start, next(iter(rv.calls.values())).nbytes)
        pair = (rv.key[1], rv.key[2])
        ops = group.pairs.get(pair)
        if ops is None:
            insort(group.order, pair)
            ops = group.pairs[pair] = {}
        if ops.get(_op_key(rv)) != entry:
            ops[_op_key(rv)] = entry
            group.shared = None
        return root

    def _find(self, k: LaunchKey) -> LaunchKey:
        while self._parent[k] != k:
            self._parent[k] = self._parent[self._parent[k]]
            k = self._parent[k]
        return k

    def _union(self, *keys: LaunchKey) -> LaunchKey:
        roots = sorted({self._find(k) for k in keys})
        root = roots[0]
        for r in roots[1:]:
            self._parent[r] = root
            g = self._groups.pop(r)
            into = self._groups[root]
            into.keys |= g.keys
            for pair, ops in g.pairs.items():
                into.pairs.setdefault(pair, {}).update(ops)
            into.order = [p for p, _ in groupby(heapq.merge(into.order, g.order))]  # both sorted; a pair once
            into.shared = None
        return root

    def _prune(self, key: LaunchKey) -> None:
        """Forget `key`'s group once each of its launches is closed (its rank moved on to another launch) and
        every call of them launched: nothing can join it any more."""
        if key not in self._parent:
            return
        root = self._find(key)
        group = self._groups[root]
        if any(self._open.get(k[0]) == k or self._done.get(k, 0) < self._issued[k] for k in group.keys):
            return
        for k in group.keys:
            del self._parent[k], self._issued[k]
            self._done.pop(k, None)
            for rh in self._handles.pop(k, ()):
                del self._key[rh]
        del self._groups[root]


def _op_key(rv: Rendezvous) -> OpKey:
    """A send/recv's place among its pair's operations: its tag, seq and process group (`describe_key`)."""
    tag, seq, pg = (*rv.key[3:6], 0, 0, 0)[:3]
    return (tag, seq, pg)


def _launch_group(group: _Group) -> LaunchGroup:
    """`group`'s pairs as one `LaunchGroup`: each pair's first operation, its others as `later`."""
    starts: list[int] = []
    sizes: list[int] = []
    later: list[tuple[int, int, int, int, int]] = []
    for a, b in group.order:
        ops = [e for _, e in sorted(group.pairs[(a, b)].items())]
        starts.append(ops[0][0])
        sizes.append(ops[0][1])
        later.extend((a, b, k, s, n) for k, (s, n) in enumerate(ops[1:], 1))
    return LaunchGroup(tuple(group.order), tuple(starts), tuple(sizes), later=tuple(later))
