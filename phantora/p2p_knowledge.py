"""Which pairs of an NCCL group of transfers the bridge's coordinator knows when it rates each pair, and its answer.

A rank sends a batch_isend_irecv, a coalescing block of sends and receives, an uneven all-to-all's transfers as one
NCCL group launch on a communicator; a group is the launches joined through their pairs (a ring's are one group), and
the coordinator rates each pair, at its start (the later of its two ends' issues), with the pairs of its group it
knows then (`bridge/p2p_batch.py`, `Collective.inflight_at`). In exact mode it launches a pair starting at s before
any rank that a completion at s wakes has run on, once every rank waits: it knows a transfer whose ends' ranks joined
their last completions before s (they ran on to issue it), or at s when the pair's own ranks did too. In window mode
it launches in rounds: once every rank blocks, all it holds, before the network moves; a rank released at the
network's ns R issues in that round, so a pair knows every pair whose later end's rank was released at or before its
own's (`Transfer.release`, the recording's `launch_release_ns`). `LaunchGroups` sweeps that knowledge in time order
and gives each pair the coordinator's answer: for a recorded graph (`phantora.egraph.p2p_launches`) and for the
in-process workload replay (`phantora.replay_groups`). A pair's several transfers in one group are its operations
in turn, by tag and seq, as the bridge orders them (`Grouped.op`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from phantora.collectives.launch_group import LaunchGroup

Pair = tuple[int, int]
PairKey = tuple[int, ...]  # (src, dst, tag, seq), and pg where not 0 (P2P.pg): a transfer, as the replay matches it
OpKey = tuple[int, int, int]  # (tag, seq, pg): a pair's operations in turn (bridge/p2p_batch.py `_op_key`)
LaunchKey = tuple[int, int]  # (rank, P2P.launch)
At = tuple[int, int, int, int]  # (src, dst, start offset ns, bytes)


@dataclass(frozen=True)
class Grouped:
    """A transfer of an NCCL group as the live coordinator rated it: the communicator, the group's pairs it knew
    (sorted) and the (src, dst, start offset, bytes) of those starting at another time or moving other bytes."""

    comm: tuple[int, ...]
    inflight: tuple[Pair, ...]
    inflight_at: tuple[At, ...]
    # the same pairs with their starts and bytes as one object, shared by every pair rated with the group so known
    # (`Collective.launch`: its rating is made once for them); None alone
    launch: LaunchGroup | None = field(default=None, compare=False)
    op: int = 0  # which of its pair's operations in `launch` it is (`Collective.launch_op`)


@dataclass(frozen=True)
class Transfer:
    """A transfer of a group launch: its two ends' launches, when it starts and when the coordinator knows it."""

    key: PairKey
    ends: tuple[LaunchKey, LaunchKey]
    comm: tuple[int, ...]
    start: int  # the later issue of its two ends
    known: int  # the later of its two ranks' last joins before issuing it
    nbytes: int
    # window mode: the later of the ns its two ranks were released at before issuing it (the round it is launched in)
    release: int | None = None


@dataclass
class _Group:
    pairs: dict[Pair, dict[OpKey, tuple[int, int]]] = field(default_factory=dict)  # (start, bytes) by op by pair
    answers: dict[tuple[int, int], tuple[tuple[Pair, ...], tuple[At, ...]]] = field(default_factory=dict)
    order: tuple[Pair, ...] | None = None  # `pairs` sorted, once a version
    shared: LaunchGroup | None = None  # `pairs` as one LaunchGroup, once a version


class LaunchGroups:
    """Transfers of group launches, each with the coordinator's answer (`of`): by window mode's rounds where every
    transfer has its `release`, else by exact mode's rule."""

    def __init__(self, transfers: list[Transfer]) -> None:
        self._parent: dict[LaunchKey, LaunchKey] = {}
        self._groups: dict[LaunchKey, _Group] = {}
        self._of: dict[PairKey, Grouped] = {}
        if transfers and all(t.release is not None for t in transfers):
            sweep = by_known = sorted(transfers, key=_release)
            knows = _same_round_or_before
        else:
            by_known = sorted(transfers, key=lambda x: x.known)
            sweep = sorted(transfers, key=lambda x: (x.start, x.known == x.start))
            knows = _joined_before
        i = 0
        for p in sweep:
            while i < len(by_known) and knows(by_known[i], p):
                self._add(by_known[i])
                i += 1
            group = self._groups[self._find(p.ends[0])]
            pair = (p.key[0], p.key[1])
            ops = group.pairs[pair]
            t, n = ops[min(ops)]
            answer = group.answers.get((t, n))
            if answer is None:
                if group.order is None:
                    group.order = tuple(sorted(group.pairs))
                firsts = {q: o[min(o)] for q, o in group.pairs.items()}
                answer = group.answers[(t, n)] = _answer(t, n, group.order, firsts)
            if group.shared is None and (len(group.pairs) > 1 or len(ops) > 1):
                group.shared = _launch_group(group.order or tuple(sorted(group.pairs)), group.pairs)
            op = sorted(ops).index(_op_key(p.key)) if len(ops) > 1 else 0
            self._of[p.key] = Grouped(p.comm, *answer, group.shared, op)

    def _find(self, k: LaunchKey) -> LaunchKey:
        self._parent.setdefault(k, k)
        while self._parent[k] != k:
            self._parent[k] = self._parent[self._parent[k]]
            k = self._parent[k]
        return k

    def _add(self, x: Transfer) -> None:
        """The coordinator knows `x` from now on: its ends' launches join one group, which holds it."""
        a, b = self._find(x.ends[0]), self._find(x.ends[1])
        ga, gb = self._groups.pop(a, _Group()), self._groups.pop(b, _Group()) if b != a else _Group()
        if len(gb.pairs) > len(ga.pairs):
            a, b, ga, gb = b, a, gb, ga
        self._parent[b] = a
        for pair, ops in gb.pairs.items():
            ga.pairs.setdefault(pair, {}).update(ops)
        ga.pairs.setdefault((x.key[0], x.key[1]), {})[_op_key(x.key)] = (x.start, x.nbytes)
        ga.answers.clear()
        ga.order = None
        ga.shared = None
        self._groups[a] = ga

    def of(self, key: PairKey) -> Grouped | None:
        """Transfer `key`'s rating in its group; None for a lone send/recv (or one whose ends name other
        communicators)."""
        return self._of.get(key)


def _joined_before(x: Transfer, p: Transfer) -> bool:
    """Exact mode: the coordinator knows `x` when it launches `p`: x's ranks ran on to issue it before p's start, or
    at it when p's own ranks did too."""
    return x.known < p.start or (x.known == p.start and p.known == p.start)


def _release(x: Transfer) -> int:
    assert x.release is not None
    return x.release


def _same_round_or_before(x: Transfer, p: Transfer) -> bool:
    """Window mode: the coordinator holds `x` when it launches `p`'s round: x's later end issued in that round or an
    earlier one."""
    return _release(x) <= _release(p)


def _answer(
    t: int, nbytes: int, order: tuple[Pair, ...], pairs: dict[Pair, tuple[int, int]]
) -> tuple[tuple[Pair, ...], tuple[At, ...]]:
    """The pairs a transfer starting at `t` with `nbytes` sees in its group (`order`: sorted), and the (src, dst,
    start - t, bytes) of those starting at another time or moving other bytes; ((), ()) alone
    (`P2pBatches.inflight`)."""
    if len(order) < 2:
        return (), ()
    return order, tuple((a, b, s - t, m) for a, b in order for s, m in [pairs[(a, b)]] if (s, m) != (t, nbytes))


def _op_key(key: PairKey) -> OpKey:
    """A transfer's place among its pair's operations: its tag, seq and process group."""
    return (key[2], key[3], key[4] if len(key) > 4 else 0)


def _launch_group(order: tuple[Pair, ...], pairs: dict[Pair, dict[OpKey, tuple[int, int]]]) -> LaunchGroup:
    """The pairs' operations as one `LaunchGroup`: each pair's first, its others as `later` (bridge/p2p_batch.py)."""
    starts: list[int] = []
    sizes: list[int] = []
    later: list[tuple[int, int, int, int, int]] = []
    for a, b in order:
        ops = [e for _, e in sorted(pairs[(a, b)].items())]
        starts.append(ops[0][0])
        sizes.append(ops[0][1])
        later.extend((a, b, k, s, n) for k, (s, n) in enumerate(ops[1:], 1))
    return LaunchGroup(order, tuple(starts), tuple(sizes), later=tuple(later))
