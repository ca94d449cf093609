"""Route (a)'s driver carries its gating flows' chain bounds in arrays across rounds (issue 38, item 2:
`phantora.netsim.gate_bounds`), where it walked them in heaps each round: each bound must be the chain's closed form
(step sums, the workers' floors, raised bounds, the end before the first unfinished flow), equal to `Chain.value`,
and each round's worker limits must be the least exact pulled bound + lookahead over every gating flow, as a walk of
all of them gives, with every completion one engine's."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from bridge.workers import spawn_workers
from phantora.netsim.base import INF_NS
from phantora.netsim.chain_bounds import Chain
from phantora.netsim.decompose import DRIVER
from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator
from phantora.netsim.gate_bounds import GateBounds
from phantora.netsim.packet_config import PacketConfig
from phantora.netsim.sorted_unique import sorted_unique
from tests.test_decompose import SETTINGS, one_engine_ends, rail_dag, tiny

L = 1000  # the NIC latency: a fabric flow's gate lets its worker run to the bound + L - 1


def three_chains() -> tuple[dict[int, tuple[Chain, int]], dict[int, int], dict[int, int], dict[int, set[Any]]]:
    """Chain A: flows 1, 2 on worker 0 (steps 10, 20), 3, 4 on worker 1 (30, 40), static bound 0; flow 2 gates a
    fabric flow of worker 1, flow 4 an NVLink flow of worker 0. Chain B: flow 10 (worker 1, step 5) waits on flow 4
    and gates a marker (every worker). Chain C: flow 20 (worker 0, step 7) waits on flow 77, in no gating flow's
    chain, and gates an NVLink flow of worker 1."""
    a = Chain(1, 10, 0, 0, ())
    chain_of = {1: (a, 0)}
    for fid, step, w in ((2, 20, 0), (3, 30, 1), (4, 40, 1)):
        chain_of[fid] = (a, a.add(fid, step, w))
    chain_of[10] = (Chain(10, 5, 100, 1, (4,)), 0)  # (its static bound: flow 4's, 100)
    chain_of[20] = (Chain(20, 7, 50, 0, (77,)), 0)
    owner = {1: 0, 2: 0, 3: 1, 4: 1, 10: 1, 20: 0}
    lbs = {1: 10, 2: 30, 3: 60, 4: 100, 10: 105, 20: 57, 77: 50}
    targets = {2: {(1, False)}, 4: {(0, True)}, 10: {(DRIVER, True)}, 20: {(1, True)}}
    return chain_of, owner, lbs, targets


def test_gate_bounds_are_the_chains_closed_forms_as_flows_end_and_bounds_rise() -> None:
    chain_of, owner, lbs, targets = three_chains()
    ends: dict[int, int] = {}
    gb = GateBounds([2, 4, 10, 20], targets, chain_of, owner, lbs, ends, 2, L)

    def check(floors: list[int], want: dict[int, int]) -> None:
        value, exact = gb.bounds(floors)
        got = dict(zip(gb.gating, value.tolist(), strict=True))
        assert got == want
        for f in set(got) & {2, 4}:  # (chains without head deps: the same as the chain's own walk)
            ch, pos = chain_of[f]
            assert ch.value(pos, lbs, ends, floors) == got[f]
        assert dict(zip(gb.gating, exact.tolist(), strict=True)) == {f: f != 20 for f in want}  # (77: not followed)

    # worker 0's floor at flow 1 (its first flow): 500 - 10 + the step sums after it; worker 1's from flow 3 on;
    # flow 10 after flow 4's bound + its step; flow 20 from worker 0's floor
    check([500, 200], {2: 500 - 10 + 30, 4: 500 - 10 + 100, 10: 590 + 5, 20: 500})
    hz = [INF_NS, INF_NS]
    assert gb.limits([500, 200], hz) == [(500, 20)]  # (20's chain bound, below worker 1's limit: to be pulled)
    assert hz == [590, 595]  # flows 4 and 10 (no lookahead) into worker 0, 2 (L - 1) and 10 into worker 1
    ends[1] = 700  # flow 1 done at 700: the chain's bound from there is its end less its step sum (690)
    del lbs[1]
    gb.ended([1, 99], [700, 5])  # (99: no chain's)
    check([800, 900], {2: 800 - 30 + 30, 4: 900 - 60 + 100, 10: 945, 20: 800})
    lbs[3] = 1500  # flow 3's bound rises (a worker's completion bound): flow 4 after it, not flow 2 before it
    chain_of[3][0].raised.append(2)
    gb.rose([3], [1500])
    check([800, 900], {2: 800, 4: 1500 - 60 + 100, 10: 1545, 20: 800})
    ends[2] = 820
    del lbs[2]
    gb.ended([2], [820])  # flow 2 done: no longer a gating flow; flow 4's bound is 790 + 100 at least
    check([100, 100], {4: 1540, 10: 1545, 20: 100})
    hz = [INF_NS, INF_NS]
    assert gb.limits([100, 100], hz) == [(100, 20)] and hz == [1540, 1545]
    ends[4] = 1600  # flow 4 done: flow 10 from its end
    del lbs[4]
    gb.ended([4], [1600])
    check([100, 100], {10: 1605, 20: 100})


@pytest.mark.slow  # two worker processes loading ns-3 (about 4 CPU s)
def test_each_rounds_limits_are_the_least_pulled_bound_of_every_gating_flow() -> None:
    topo = tiny()
    flows = rail_dag(topo, stages=4)
    limits: list[tuple[list[int], list[int]]] = []

    class Checked(HybridDecomposedSimulator):
        def _horizon(self, until: int) -> int:
            got = super()._horizon(until)
            wtime, n = self._wtime, len(self._out)
            floors = [
                max(wtime, now) + 1 if not out.empty() or nxt is None else max(wtime + 1, now + 1, nxt)
                for out, nxt, now in zip(self._out, self._next, self._wnow, strict=True)
            ]
            want = [until] * n  # (no watched flows: a drain)
            for f, gated in self._targets.items():  # type: ignore[union-attr]
                if f not in self._ext:
                    continue
                t = self._pulled(f, floors, {}, {}, INF_NS)  # exact: pulled along its chain and its deps
                for w, zero in gated:
                    for v in range(n) if w == DRIVER else (w,):
                        want[v] = min(want[v], t + (0 if zero else self.latency - 1))
            assert self._hz is not None
            limits.append((list(self._hz), want))
            return got

    sim = Checked(topo, PacketConfig(**SETTINGS, workers=2), spawn_workers)  # type: ignore[arg-type]
    try:
        sim.submit(flows, 0)
        done = sorted((c.flow_id, c.start_ns, c.end_ns) for c in sim.drain())
    finally:
        sim.close()
    assert done == one_engine_ends(topo, flows)
    assert sum(min(want) < INF_NS for _, want in limits) >= 4  # (not vacuous: rounds that gating flows limit)
    assert all(got == want for got, want in limits)


def _random_chains(rng: random.Random, ids: list[int]) -> tuple[list[int], dict[int, tuple[Chain, int]], list[int]]:
    """Chains of 1-6 flows over `ids` (in order), each chain's last flow gating worker 0: (gating, chain_of, the flows
    in the arrays' flat order: chains end to end in the order of the gating flows)."""
    chain_of: dict[int, tuple[Chain, int]] = {}
    gating: list[int] = []
    k = 0
    while k < len(ids):
        size = min(rng.randint(1, 6), len(ids) - k)
        ch = Chain(ids[k], 10, 0, k % 2, ())
        chain_of[ids[k]] = (ch, 0)
        for fid in ids[k + 1 : k + size]:
            chain_of[fid] = (ch, ch.add(fid, 10, k % 2))
        gating.append(ids[k + size - 1])
        k += size
    flat = [f for g in gating for f in chain_of[g][0].nodes]
    return gating, chain_of, flat


@pytest.mark.parametrize("spread", [1, 3, 1000])  # ids close together (found by a table) and far apart (by a search)
def test_each_flow_is_found_at_its_flat_position_and_others_nowhere(spread: int) -> None:
    rng = random.Random(spread)
    ids = sorted(rng.sample(range(5, 5 + 400 * spread), 400))
    rng.shuffle(ids)  # (the arrays' order is the chains', not the ids')
    gating, chain_of, flat = _random_chains(rng, ids)
    owner = {f: ids.index(chain_of[f][0].nodes[0]) % 2 for f in flat}  # (each chain's head's worker, as made)
    gb = GateBounds(gating, {f: {(0, False)} for f in gating}, chain_of, owner, {f: 0 for f in flat}, {}, 2, L)
    assert (gb._table is not None) == (spread < 1000)
    where = {f: k for k, f in enumerate(flat)}  # (the definition: each flow's position in the chains end to end)
    asked = rng.sample(range(0, 6 + 400 * spread + 10), 300) + [0, 4, 5 + 400 * spread + 5] + ids[:50]
    idx, hit = gb._where(asked)
    want = [(where[f], k) for k, f in enumerate(asked) if f in where]
    assert list(zip(idx.tolist(), hit.tolist(), strict=True)) == want
    assert len(want) >= 50  # (not vacuous)


def test_unique_is_numpys() -> None:
    rng = np.random.default_rng(7)
    for n in (0, 1, 2, 5, 300, 3000):
        x = rng.integers(-50, 2000, n, dtype=np.int64)
        got = sorted_unique(x)
        assert got.dtype == np.int64 and got.tolist() == np.unique(x).tolist()
