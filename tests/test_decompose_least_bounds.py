"""The plain decomposition driver's horizon read by `phantora.netsim.least_bounds` (a flow's bound raised one step
from its deps before it is pulled) equals the full scan it replaced: on random DAGs (tests/random_dags.py) against
the exact least bound of each set (every flow's bound by the pushed walk), and through ns-3 on two workers, every
round's horizon and least reacting end, the rounds and the completions (and one engine's completions)."""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from typing import Any

import pytest

from phantora.netsim import decompose, least_bounds
from phantora.netsim.base import INF_NS
from phantora.netsim.decompose import DecomposedSimulator
from phantora.netsim.least_bounds import least_ends
from phantora.netsim.pulled_bounds import pull
from phantora.topology.generators import rail_optimized
from tests.random_dags import gpus_by_host, rail_batches, random_dag, tiny_rails
from tests.test_decompose_pulled_bounds import Books, _run


def full_scan(
    ids: Collection[int], floor: int, react: Callable[[int], bool] | None, ext: Collection[int], *books: Any
) -> tuple[int, int]:
    """The horizon's scan before `least_bounds` (at 8ee72274): every flow read, pulled if its C is below the least."""
    lbs, ends, up, step, memo, wide = books
    m = mr = INF_NS
    for f in ids:
        c = lbs[f]
        if c >= mr and (c >= m or f not in ext):
            continue
        if react is None or react(f):
            v = c if f not in up else pull(f, lbs, ends, up, step, memo, wide, mr)
            if v < mr:
                mr = v
                if v < m:
                    m = v
                if mr <= floor:
                    break
        elif c < m and f in ext:
            v = c if f not in up else pull(f, lbs, ends, up, step, memo, wide, m)
            if v < m:
                m = v
    return m, mr


def _copy(books: Books) -> tuple[Any, ...]:
    return dict(books.c), books.ends, dict(books.up), books.step, dict(books.memo), dict(books.wide)


@pytest.mark.parametrize("seed", range(6))
def test_least_ends_equal_the_exact_least_bounds_and_the_full_scan(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    hosts = gpus_by_host(rail_optimized(4, 4, 1))
    books = Books()
    now = 0
    reads = checked = stepped = 0
    pulls = [0]

    def counted(*args: Any) -> int:
        pulls[0] += 1
        return pull(*args)

    monkeypatch.setattr(least_bounds, "pull", counted)
    for batch in range(4):
        new = random_dag(rng, hosts, 1000 * batch, 150, list(books.c), markers=0.1, wide=0.1)
        for flow in new:
            books.book(flow, now, rng.randint(0, 5_000))
        for _ in range(300):
            live = list(books.c)
            if not live:
                break
            if rng.random() < 0.6:
                f = rng.choice(live)
                books.bound(f, books.push._lb[f] + rng.randint(-500, 3_000))
            else:  # (a flow whose deps have all ended)
                f = rng.choice([g for g in live if all(d in books.ends for d in books.up.get(g, ()))])
                books.end(f, books.push._lb[f] + rng.randint(0, 2_000))
                now = max(now, books.ends[f])
            live = list(books.c)
            if not live:
                break
            ids = set(rng.sample(live, rng.randint(1, len(live))))  # (one worker's flows)
            ext = set(rng.sample(live, len(live) // 5))
            reacting = set(rng.sample(live, len(live) // 3))
            react = None if rng.random() < 0.2 else reacting.__contains__
            exact = books.push._lb  # (every unfinished flow's L, pushed down the DAG)
            least_r = min((exact[f] for f in ids if react is None or react(f)), default=INF_NS)
            least = min(least_r, min((exact[f] for f in ids if f in ext), default=INF_NS))
            floor = rng.choice([0, now, least - 1, least, least_r, INF_NS - 1]) if least < INF_NS else now
            scan_m, scan_mr = full_scan(ids, floor, react, ext, *_copy(books))
            before = dict(books.c)
            pulls[0] = 0
            m, mr, n = least_ends(
                ids, floor, react, ext, books.c, books.ends, books.up, books.step, books.memo, books.wide
            )
            stepped += pulls[0] == 0 and books.c != before  # (C raised one step from the deps, nothing pulled)
            assert (max(m, floor), max(mr, floor)) == (max(least, floor), max(least_r, floor)), (seed, batch)
            assert (max(m, floor), max(mr, floor)) == (max(scan_m, floor), max(scan_mr, floor))
            assert all(books.c[f] <= exact[f] for f in books.c)  # (what it wrote back is a lower bound)
            reads += n
            checked += 1
        for g in books.c:  # (and the bounds pulled from what it wrote back are still the walk's)
            assert books.pulled(g) == books.push._lb[g]
    assert checked > 500 and reads > 1000 and stepped > 0, (checked, reads, stepped)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_every_rounds_horizon_equals_the_full_scans_and_one_engine(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    topo = tiny_rails()
    first, second = rail_batches(random.Random(200 + seed), 80)
    read = [0]

    def scanned(self: DecomposedSimulator, ids: set[int], floor: int, start: Any = None) -> tuple[int, int]:
        # (read from nothing, whatever the least so far `start`: the horizon takes the same min of it)
        books = (self._lb, self._ends, self._up, self._step, self._memo, self._memo_wide)
        return full_scan(ids, floor, self.reacts, self._ext, *books)

    def counted(*args: Any) -> tuple[int, int, int]:
        got = least_ends(*args)
        read[0] += got[2]
        return got

    with monkeypatch.context() as patched:
        patched.setattr(DecomposedSimulator, "_least_ends", scanned)
        scanned_flows, scanned_rounds = _run(topo, 2, True, first, second)
    monkeypatch.setattr(decompose, "least_ends", counted)
    quick, quick_rounds = _run(topo, 2, True, first, second)
    one, _ = _run(tiny_rails(), 0, True, first, second)
    assert read[0] > 0  # (the new reading ran)
    assert len(quick_rounds) > 3
    assert quick_rounds == scanned_rounds
    assert quick == scanned_flows == one
    assert len(one) == len(first) + len(second)


def test_a_start_with_s_past_sr_passes_over_a_reacting_flow_below_s() -> None:
    # `least_ends` from `start` = (s, sr) needs s <= sr (`_horizon` asserts e <= r): a flow the caller reacts to
    # counts in both leasts, and one whose bound is at sr or later is passed over, so with s > sr one of bound
    # between them no longer lowers m. One reacting flow, no deps, bound 50 ns (its exact L), read from floor 0.
    def read(start: tuple[int, int]) -> tuple[int, int, int]:
        lbs = {7: 50}
        return least_ends([7], 0, {7}.__contains__, (), lbs, {}, {}, {}, {}, {}, start=start)

    assert read((INF_NS, INF_NS)) == (50, 50, 1)
    assert read((100, 100)) == (50, 50, 1)  # (s <= sr: (min(s, m), min(sr, mr)) of the exact (50, 50))
    assert read((10, 60)) == (10, 50, 1)  # (min(10, 50), min(60, 50))
    # s = 100 > sr = 10: the flow is passed over unread; m comes back 100, not min(100, 50) = 50. A horizon
    # from it (e = max(m, floor), + L - 1) would let the workers run past 50 ns, the reacting flow's end.
    assert read((100, 10)) == (100, 10, 0)
