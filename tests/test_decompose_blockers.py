"""The plain decomposition driver's horizon read through `phantora.netsim.blockers` (a worker's free flows, and the
flows under a blocker only where the flow above cannot bound them) equals the exact least bound of each set: on random
DAGs (tests/random_dags.py) of flows on two workers, booked, held back and woken (as outer gates defer and open
them), raised and ended in random order, against every unfinished flow's bound by the pushed walk. Through ns-3,
tests/test_decompose_least_bounds.py's slow test compares every round's horizon with the full scan's."""

from __future__ import annotations

import random
from typing import Any

import pytest

from phantora.netsim.base import INF_NS, Flow
from phantora.netsim.blockers import BLOCK_DEPS, Blockers
from phantora.netsim.least_bounds import least_ends
from phantora.topology.generators import rail_optimized
from tests.random_dags import gpus_by_host, random_dag
from tests.test_decompose_pulled_bounds import Books


class Below(dict[int, list[int]]):
    """`Blockers.below`, counting the lists the horizon went down."""

    read = 0

    def get(self, key: int, default: Any = None) -> Any:
        got = super().get(key, default)
        if got:
            Below.read += 1
        return got


class RandomBooks:
    """Two workers' flows booked in batches, held back and woken (as outer gates defer and open them), raised and
    ended in random order: the driver's books and blockers as its horizon reads them."""

    def __init__(self, rng: random.Random, blockers: Blockers) -> None:
        self.rng, self.blockers = rng, blockers
        self.books = Books()
        self.owner: dict[int, int] = {}
        self.unfinished: list[set[int]] = [set(), set()]
        self.held: set[int] = set()  # (booked, not read by the horizon yet: behind a closed outer gate, or waiting)
        self.now = 0

    def book(self, new: list[Flow]) -> None:
        """Book `new` (in topological order, as `_book`), each on a worker, some held back."""
        rng, books, held = self.rng, self.books, self.held
        for flow in new:
            books.book(flow, self.now, rng.randint(0, 5_000))
            w = self.owner[flow.id] = rng.randrange(2) if rng.random() < 0.3 else (flow.id // 7) % 2
            if rng.random() < 0.1 or any(d in held for d in flow.deps):
                held.add(flow.id)
                continue
            self.unfinished[w].add(flow.id)
            self.blockers.add(flow.id, w, flow.deps, self.unfinished[w])

    def move(self) -> None:
        """One random event: a held flow woken, a flow's bound raised, or a flow whose deps have all ended ended."""
        rng, books, held, owner, unfinished = self.rng, self.books, self.held, self.owner, self.unfinished
        live = [f for f in books.c if f not in held]
        kind = rng.random()
        if held and kind < 0.1:  # (a gate opens: a held flow whose held deps woke before it)
            f = rng.choice([g for g in held if not held.intersection(books.up.get(g, ()))])
            held.discard(f)
            unfinished[owner[f]].add(f)
            self.blockers.add(f, owner[f], books.up.get(f, ()), unfinished[owner[f]])
        elif live and kind < 0.6:
            f = rng.choice(live)
            books.bound(f, books.push._lb[f] + rng.randint(-500, 3_000))
        elif live:
            ready = [g for g in live if all(d in books.ends for d in books.up.get(g, ()))]
            f = rng.choice(ready)
            books.end(f, books.push._lb[f] + rng.randint(0, 2_000))
            self.now = max(self.now, books.ends[f])
            unfinished[owner[f]].discard(f)
            self.blockers.ended([f], owner[f], unfinished[owner[f]], books.up)


def _partition(blockers: Blockers, w: int, unfinished: set[int], books: Books) -> None:
    """Every unfinished flow of `w` is free or under exactly one unfinished dep of its own on `w`."""
    under = [g for d in unfinished for g in blockers.below.get(d, ())]
    assert len(under) == len(set(under))
    assert set(under).isdisjoint(blockers.free[w])
    assert set(under) | blockers.free[w] == unfinished
    for d in unfinished:
        for g in blockers.below.get(d, ()):
            assert d in books.up[g] and len(books.up[g]) <= BLOCK_DEPS


@pytest.mark.parametrize("seed", range(8))
def test_the_free_flows_and_the_lists_read_give_the_exact_least_bounds(seed: int) -> None:
    rng = random.Random(seed)
    hosts = gpus_by_host(rail_optimized(4, 4, 1))
    blockers = Blockers(2)
    blockers.below = Below()
    Below.read = 0
    run = RandomBooks(rng, blockers)
    books, unfinished, held = run.books, run.unfinished, run.held
    checked = skipped = 0
    for batch in range(4):
        run.book(random_dag(rng, hosts, 1000 * batch, 150, list(books.c), markers=0.0, wide=0.05))
        for _ in range(300):
            run.move()
            now = run.now
            for w in (0, 1):
                ids = unfinished[w]
                _partition(blockers, w, ids, books)
                if not ids:
                    continue
                pool = [f for f in books.c if f not in held]
                ext = set(rng.sample(pool, len(pool) // 5))
                reacting = set(rng.sample(pool, len(pool) * rng.choice([1, 2, 3]) // 4))
                react = None if rng.random() < 0.2 else reacting.__contains__
                exact = books.push._lb  # (every unfinished flow's L, pushed down the DAG)
                least_r = min((exact[f] for f in ids if react is None or react(f)), default=INF_NS)
                least = min(least_r, min((exact[f] for f in ids if f in ext), default=INF_NS))
                floor = rng.choice([0, now, least - 1, least, least_r, INF_NS - 1]) if least < INF_NS else now
                m, mr, _ = least_ends(
                    blockers.free[w],
                    floor,
                    react,
                    ext,
                    books.c,
                    books.ends,
                    books.up,
                    books.step,
                    books.memo,
                    books.wide,
                    blockers.below,
                )
                assert (max(m, floor), max(mr, floor)) == (max(least, floor), max(least_r, floor)), (seed, batch)
                assert all(books.c[f] <= exact[f] for f in books.c)  # (what it wrote back is a lower bound)
                checked += 1
                skipped += len(ids) - len(blockers.free[w])
        for g in books.c:  # (and the bounds pulled from what it wrote back are still the walk's)
            assert books.pulled(g) == books.push._lb[g]
    # (not vacuous: flows were under blockers, some lists were read, some flows were woken)
    assert checked > 1000 and skipped > 200 and Below.read > 100, (checked, skipped, Below.read)
