"""P2pBatches keeps each NCCL group's pairs sorted as they join (and as groups merge) instead of sorting the group at
each launch: on random sequences of issues, holds, launches and closed launches, every group's kept order is the
full sort of its pairs, and every launch's group (`P2pBatches.launch`), read by its pair, is the answer a full sort
gives."""

from __future__ import annotations

import random
from typing import Any

import bridge.p2p_batch as pb
from bridge.matching import Call, Rendezvous

COMM = tuple(range(6))


def _full_sort_answer(t: int, nbytes: int, pairs: dict[pb.Pair, tuple[int, int]]) -> Any:
    """The answer by sorting the whole group (what P2pBatches did at every launch before)."""
    if len(pairs) < 2:
        return (), ()
    at = tuple((a, b, s - t, n) for (a, b), (s, n) in sorted(pairs.items()) if (s, n) != (t, nbytes))
    return tuple(sorted(pairs)), at


def _expected(b: pb.P2pBatches, rv: Rendezvous, start: int) -> dict[pb.Pair, tuple[int, int]]:
    """The pairs `rv`'s group holds once it is launched at `start`: its ends' groups joined, with its own entry;
    each pair's entry its first operation's (by handle: several to one pair are its operations in turn)."""
    ops: dict[pb.Pair, dict[Any, tuple[int, int]]] = {}
    roots = {b._find(b._key[(c.rank, c.handle)]) for c in rv.calls.values()}
    for root in sorted(roots):
        for pair, got in b._groups[root].pairs.items():
            ops.setdefault(pair, {}).update(got)
    ops.setdefault((rv.key[1], rv.key[2]), {})[(rv.key[3], 0, 0)] = (start, next(iter(rv.calls.values())).nbytes)
    return {pair: got[min(got)] for pair, got in ops.items()}


def _run(seed: int) -> tuple[int, int]:
    """One random sequence; (launches answered, merges of groups that shared a pair)."""
    rng = random.Random(seed)
    seen = 0
    b = pb.P2pBatches()
    launch = dict.fromkeys(COMM, 0)
    handle = 0
    matched: list[Rendezvous] = []
    held: list[Rendezvous] = []
    shared_merges = 0
    for _ in range(400):
        op = rng.random()
        if op < 0.4:  # a matched send/recv: each side issued in its rank's current launch
            s, d = rng.sample(COMM, 2)
            nbytes = rng.choice((1 << 20, 1 << 22))
            t = rng.randrange(0, 5000, 100)
            cs = Call(s, handle, "send", nbytes, "fp32", None, t, comm=COMM)
            cr = Call(d, handle + 1, "recv", nbytes, "fp32", None, t + rng.randrange(0, 300, 100), comm=COMM)
            handle += 2
            b.issued(cs, launch[s])
            b.issued(cr, launch[d])
            matched.append(Rendezvous(("p2p", s, d, handle), (s, d), {s: cs, d: cr}))
        elif op < 0.6 and matched:  # held for launch: its group learns it (groups may merge here)
            rv = matched.pop(rng.randrange(len(matched)))
            before = {id(g): set(g.pairs) for g in b._groups.values()}
            b.held(rv)
            held.append(rv)
            shared_merges += _merged_sharing(before, b)
        elif op < 0.9 and held:  # launched at its start or later
            rv = held.pop(rng.randrange(len(held)))
            start = max(c.t for c in rv.calls.values()) + rng.choice((0, 0, 200))
            before = {id(g): set(g.pairs) for g in b._groups.values()}
            pairs = _expected(b, rv, start)
            launched = b.launch(rv, start)
            shared_merges += _merged_sharing(before, b)
            got = ((), ()) if launched is None else launched.answer((rv.key[1], rv.key[2]))
            own = pairs[(rv.key[1], rv.key[2])]
            several = launched is not None and bool(launched.later)  # a pair's operations in turn: a group
            assert got == (_full_sort_answer(*own, pairs) if len(pairs) > 1 or not several else (tuple(pairs), ()))
            if launched is not None:
                seen += 1
        else:  # a rank closes its launch: its next calls go to a new one
            r = rng.choice(COMM)
            launch[r] += 1
        for g in b._groups.values():
            assert g.order == sorted(g.pairs)
    return seen, shared_merges


def _merged_sharing(before: dict[int, set[pb.Pair]], b: pb.P2pBatches) -> int:
    """1 if a group now holds two former groups that shared a pair."""
    for g in b._groups.values():
        parts = [p for gid, p in before.items() if p and p <= set(g.pairs)]
        if any(x & y for i, x in enumerate(parts) for y in parts[i + 1 :]):
            return 1
    return 0


def test_kept_order_is_the_full_sort() -> None:
    answered = shared = 0
    for seed in range(20):
        a, s = _run(seed)
        answered += a
        shared += s
    assert answered > 500  # the sequences reach many launches with groups of two pairs or more
    assert shared > 0  # and merge groups that hold the same pair (the merge keeps it once)
