"""The plain decomposition driver's horizon with each flow's reach (`phantora.netsim.reach_steps`): R against its
definition (the least step sum over every path of dependents down to the first counted flow, paths enumerated), a
chain worked by hand, and the horizon read with R equal to the exact least bound of each set on random DAGs
(tests/random_dags.py) booked, held back and woken, raised and ended in random order, while the flows counted only
shrink (as a caller's reactions and the driver's waits do between placements), against every unfinished flow's bound
by the pushed walk; and through ns-3 on two workers, every round's horizon and least reacting end, the rounds and the
completions equal with R and without it (and one engine's completions)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from phantora.netsim import decompose
from phantora.netsim.base import INF_NS, Flow
from phantora.netsim.blockers import Blockers
from phantora.netsim.least_bounds import least_ends
from phantora.netsim.reach_steps import least_reach
from phantora.topology.generators import rail_optimized
from tests.random_dags import gpus_by_host, rail_batches, random_dag, tiny_rails
from tests.test_decompose_blockers import RandomBooks
from tests.test_decompose_pulled_bounds import _run


def test_a_chain_worked_by_hand() -> None:
    # 1 -> 2 -> 3 -> 4, and 2 -> 5 (counted) -> 6 (counted); steps 10, 20, 30, 40, 7, 1000
    flows = [Flow(1, 0, 1, 1), Flow(2, 0, 1, 1, (1,)), Flow(3, 0, 1, 1, (2,)), Flow(4, 0, 1, 1, (3,))]
    flows += [Flow(5, 0, 1, 1, (2,)), Flow(6, 0, 1, 1, (5,))]
    up = {f.id: f.deps for f in flows if f.deps}
    step = {1: 10, 2: 20, 3: 30, 4: 40, 5: 7, 6: 1000}
    got = least_reach(flows, up, step, {4, 5, 6}.__contains__)
    # 3: its dependent 4 counted (40); 2: via 5 (7) rather than 3 (30 + 40); 1: 20 + 7; 5: 6 counted (1000)
    assert got.steps == {3: 40, 2: 7, 1: 27, 5: 1000}
    assert got.counted == {4, 5, 6}
    # nothing counted: no reach at all
    assert least_reach(flows, up, step, lambda f: False).steps == {}


def _by_paths(fid: int, kids: dict[int, list[int]], step: dict[int, int], counted: set[int]) -> int | None:
    """The least step sum over every path of dependents from `fid` to the first counted flow on it (enumerated)."""
    best: int | None = None
    todo = [(g, step[g]) for g in kids.get(fid, ())]
    while todo:
        g, s = todo.pop()
        if g in counted:
            best = s if best is None else min(best, s)
            continue
        todo += [(h, s + step[h]) for h in kids.get(g, ())]
    return best


@pytest.mark.parametrize("seed", range(6))
def test_reach_is_the_least_step_sum_down_to_a_counted_flow(seed: int) -> None:
    rng = random.Random(seed)
    hosts = gpus_by_host(rail_optimized(4, 4, 1))
    flows = random_dag(rng, hosts, 0, 60, [], markers=0.1, wide=0.05)
    up = {f.id: f.deps for f in flows if f.deps}
    step = {f.id: rng.randint(0, 5_000) for f in flows}
    counted = {f.id for f in flows if rng.random() < 0.2}
    kids: dict[int, list[int]] = {}
    for f in flows:
        for d in dict.fromkeys(f.deps):
            kids.setdefault(d, []).append(f.id)
    got = least_reach(flows, up, step, counted.__contains__)
    want = {f.id: r for f in flows if (r := _by_paths(f.id, kids, step, counted)) is not None}
    assert got.steps == want and got.counted == counted
    assert len(want) > 5  # (not vacuous)


@dataclass
class HorizonCase:
    """One worker's horizon read to check: its unfinished flows' exact least bounds (the pushed walk), over the
    flows waited for outside (`ext`) and reacting, and the books, their blockers and the reach the read may use."""

    run: RandomBooks
    batch: int
    worker: int
    ext: set[int]
    reacting: set[int]
    reach: Any
    least: int
    least_r: int

    def read(self, floor: int, *extra: Any) -> tuple[int, int, int]:
        """`least_ends` of this worker from `floor` (with `extra`: the reach, and a least so far)."""
        books, blockers = self.run.books, self.run.blockers
        books_args = (books.c, books.ends, books.up, books.step, books.memo, books.wide)
        return least_ends(
            blockers.free[self.worker], floor, self.reacting.__contains__, self.ext, *books_args, blockers.below, *extra
        )


def horizon_cases(rng: random.Random, batches: int, moves: int, drop: bool) -> Iterator[HorizonCase]:
    """Two workers' random books of rail flows, booked in `batches` batches of 150 flows, each followed by `moves`
    moves; after each move, a case per worker with unfinished flows. The flows waited for outside and the reacting
    ones are chosen per batch, then only fewer (`drop`: a wait or a reaction dropped now and then)."""
    hosts = gpus_by_host(rail_optimized(4, 4, 1))
    run = RandomBooks(rng, Blockers(2))
    books = run.books
    for batch in range(batches):
        run.book(random_dag(rng, hosts, 1000 * batch, 150, list(books.c), markers=0.0, wide=0.05))
        pool = list(books.c)
        ext = set(rng.sample(pool, len(pool) // 10))
        reacting = set(rng.sample(pool, len(pool) // rng.choice([20, 8, 3])))
        order = [Flow(f, 0, 0, 0, books.up.get(f, ())) for f in books.c]  # (booked in topological order)
        reach = least_reach(order, books.up, books.step, (ext | reacting).__contains__)
        for _ in range(moves):
            run.move()
            for s in (ext, reacting) if drop else ():
                if s and rng.random() < 0.2:
                    s.discard(rng.choice(sorted(s)))
            for w in (0, 1):
                ids = run.unfinished[w]
                if not ids:
                    continue
                exact = books.push._lb  # (every unfinished flow's L, pushed down the DAG)
                least_r = min((exact[f] for f in ids if f in reacting), default=INF_NS)
                least = min(least_r, min((exact[f] for f in ids if f in ext), default=INF_NS))
                yield HorizonCase(run, batch, w, ext, reacting, reach, least, least_r)
        if drop:  # (and the bounds pulled from what the reads wrote back are still the walk's)
            assert all(books.pulled(g) == books.push._lb[g] for g in books.c)


@pytest.mark.parametrize("seed", range(8))
def test_the_horizon_read_with_reach_gives_the_exact_least_bounds(seed: int) -> None:
    rng = random.Random(seed)
    checked = reads_with = reads_without = 0
    for case in horizon_cases(rng, 4, 300, drop=True):
        least, least_r, now = case.least, case.least_r, case.run.now
        floor = rng.choice([0, now, least - 1, least, least_r, INF_NS - 1]) if least < INF_NS else now
        m, mr, n = case.read(floor, case.reach)  # (first: the plain read after it finds the bounds it wrote back)
        plain = case.read(floor)
        assert (max(m, floor), max(mr, floor)) == (max(least, floor), max(least_r, floor)), (seed, case.batch)
        assert (max(plain[0], floor), max(plain[1], floor)) == (max(m, floor), max(mr, floor))
        books = case.run.books
        assert all(books.c[f] <= books.push._lb[f] for f in books.c)  # (what it wrote back is a lower bound)
        checked += 1
        reads_with += n
        reads_without += plain[2]
    # (not vacuous: many horizons read, and reach passed over flows the plain read went through)
    assert checked > 1000 and reads_with < reads_without, (checked, reads_with, reads_without)


@pytest.mark.parametrize("seed", range(4))
def test_the_horizon_read_from_the_least_so_far_gives_the_same_terms(seed: int) -> None:
    # `_horizon` reads each worker from (e, r), the least so far of the other terms: what it takes of the read,
    # min(e, max(m, floor)) and min(r, max(mr, floor)), must be that of the exact least bounds, by the pushed walk
    rng = random.Random(50 + seed)
    checked = reads_from = reads_plain = 0
    for case in horizon_cases(rng, 3, 200, drop=False):
        least, least_r, now = case.least, case.least_r, case.run.now
        floor = rng.choice([0, now, least - 1, least, least_r]) if least < INF_NS else now
        marks = [0, floor, least - 1, least, least + 1, least_r - 1, least_r, least_r + 1, INF_NS]
        e = rng.choice([x for x in marks if 0 <= x <= INF_NS])
        r = rng.choice([x for x in marks if e <= x <= INF_NS])
        m, mr, n = case.read(floor, case.reach, (e, r))
        assert m <= mr and m <= e and mr <= r
        assert (min(e, max(m, floor)), min(r, max(mr, floor))) == (
            min(e, max(least, floor)),
            min(r, max(least_r, floor)),
        ), (seed, case.batch, e, r, floor)
        plain = case.read(floor, case.reach)
        assert (max(plain[0], floor), max(plain[1], floor)) == (max(least, floor), max(least_r, floor))
        checked += 1
        reads_from += n
        reads_plain += plain[2]
    # (not vacuous: many reads, and a least so far below the worker's own spares reads)
    assert checked > 500 and reads_from < reads_plain, (checked, reads_from, reads_plain)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_every_rounds_horizon_with_reach_equals_without_and_one_engine(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    topo = tiny_rails()
    first, second = rail_batches(random.Random(300 + seed), 80)
    used = [0]

    def counted(*args: Any) -> tuple[int, int, int]:
        used[0] += len(args) > 11 and args[11] is not None  # (read with a reach)
        return least_ends(*args)

    monkeypatch.setattr(decompose, "least_ends", counted)
    reached, reached_rounds = _run(topo, 2, True, first, second)
    assert used[0] > 0  # (the first batch's rounds read with its reach: the engine's caller gives its epoch)
    with monkeypatch.context() as patched:
        patched.setattr(decompose.DecomposedSimulator, "_reached", lambda self, order, fresh: None)
        plain, plain_rounds = _run(topo, 2, True, first, second)
    one, _ = _run(tiny_rails(), 0, True, first, second)
    assert len(reached_rounds) > 3
    assert reached_rounds == plain_rounds
    assert reached == plain == one
    assert len(one) == len(first) + len(second)
