"""The decomposed driver hands a large batch to its workers before keeping its books on it (issue 38, item 2).

`DecomposedSimulator.submit` of `HAND_OVER_MIN` flows or more first fills the workers' outboxes (`_hand_over`), then
runs a round that takes every worker no further than it is while the driver keeps its books (`_placing`). No ns-3:
the fake pool of tests/test_decompose_joins.py, whose workers end each flow `END_NS` after it is posted, so every
completion has a closed form.
"""

from __future__ import annotations

from typing import Any

import pytest

from phantora.netsim.base import INF_NS, Flow
from phantora.netsim.decompose import DecomposedSimulator
from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator
from phantora.netsim.packet_config import PacketConfig
from tests.test_decompose import SETTINGS, gpu, tiny
from tests.test_decompose_joins import END_NS, _Pool


class _Recording(_Pool):
    """The fake pool, keeping each round's (worker, flows posted, until)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.log: list[tuple[int, list[int], int]] = []

    def round(self, posts: dict[int, Any]) -> Any:
        self.log += [(i, [f.id for f, _ in out.flows], until) for i, (_, out, until) in posts.items()]
        return super().round(posts)


def batches(topo: Any) -> tuple[list[Flow], list[Flow]]:
    """20 flows on rail 0 staggered by their delays, and a chain of 4 behind flow 3, across the rails in turn (the
    fake workers know no deps: every dep crosses workers); then 3 flows on rail 1 that each wait on all 20 (a wide
    list) and one on rail 1 behind the chain's last."""
    first = [Flow(i, gpu(topo, i % 3, 0), gpu(topo, (i + 1) % 3, 0), 4096, delay_ns=100 * i) for i in range(20)]
    for k in range(4):
        rail = 1 - k % 2
        first.append(Flow(50 + k, gpu(topo, k % 3, rail), gpu(topo, (k + 1) % 3, rail), 4096, (49 + k if k else 3,)))
    wide = tuple(range(20))
    second = [Flow(100 + k, gpu(topo, k, 1), gpu(topo, (k + 1) % 3, 1), 4096, wide, delay_ns=7 * k) for k in range(3)]
    second.append(Flow(200, gpu(topo, 0, 1), gpu(topo, 1, 1), 4096, (53,)))
    return first, second


@pytest.mark.parametrize("least", [1, 10**9])
def test_a_large_batch_is_handed_over_first_with_the_same_closed_form_ends(
    monkeypatch: pytest.MonkeyPatch, least: int
) -> None:
    monkeypatch.setattr("phantora.netsim.decompose.HAND_OVER_MIN", least)
    topo = tiny()
    first, second = batches(topo)
    pool: Any = _Recording
    sim = DecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), pool)  # type: ignore[arg-type]
    mid = 100 * 10 + END_NS  # flows 0..10 are done, the rest not (nor the chain: 3 ends at 5,300)
    sim.submit(first, 0)
    done = {c.flow_id: c for c in sim.advance(mid)}
    log = sim._pool.log  # type: ignore[attr-defined]
    handed = len(log)
    sim.submit(second, mid)
    done |= {c.flow_id: c for c in sim.drain()}
    if least == 1:  # each submit was a round of its own: every flow to its worker, none run past where it was
        assert sorted(f for _, fs, until in log[:2] for f in fs if until == 0) == sorted(f.id for f in first)
        now = {i: until for i, _, until in log[:handed]}  # (the fake workers' now(): their last round's until)
        # the second batch is all on rail 1's worker: its round of its own posts that worker alone, run no further
        assert log[handed] == (1, [f.id for f in second], now[1])
    else:
        assert all(until > 0 for _, _, until in log[:2])
    assert {f.id: done[f.id].end_ns for f in first[:20]} == {i: 100 * i + END_NS for i in range(20)}
    chain = 3 * 100 + END_NS + 4 * END_NS  # flow 3's end, then four flows of END_NS each
    assert done[53].end_ns == chain
    last = 100 * 19 + END_NS  # the latest end of the wide list
    assert {k: done[100 + k].end_ns for k in range(3)} == {k: last + 7 * k + END_NS for k in range(3)}
    assert done[200].end_ns == chain + END_NS
    assert sim._rel.held() == 0 and sim.in_flight() == 0


def test_a_pull_below_its_need_is_the_whole_pull_and_never_above_it() -> None:
    """`HybridDecomposedSimulator._pulled` with a `need`: its value equals the whole pull (need unbounded) whenever
    either is below the need, is never above the whole pull (a lower bound), and reaches the need otherwise. The
    whole pull of a chain on one worker whose floor is past every static bound is that floor + the steps after its
    first flow (the floor applies to each flow; each flow ends no earlier than its dep's + its own step)."""
    topo = tiny()
    # rail 0: two chains of 6 flows, one from flow 0, one from flow 10, and a flow behind both chains' ends
    flows = [Flow(i, gpu(topo, i % 3, 0), gpu(topo, (i + 1) % 3, 0), 4096 << (i % 3), (i - 1,) if i % 10 else ())
             for i in (*range(6), *range(10, 16))]  # fmt: skip
    flows.append(Flow(20, gpu(topo, 0, 0), gpu(topo, 1, 0), 4096, (15, 5), delay_ns=300))  # (the shorter first)
    pool: Any = _Pool
    sim = HybridDecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), pool)  # type: ignore[arg-type]
    sim.submit(flows, 0)
    w = sim._owner[0]
    assert all(sim._owner[f.id] == w for f in flows)
    floor = 1 + max(sim._lb[f.id] for f in flows)  # past every static bound: the chains start from it
    floors = [floor, floor]
    step = {f.id: sim._step[f.id] for f in flows}
    static = dict(sim._lb)

    def pull(fid: int, need: int) -> int:
        sim._lb.clear()
        sim._lb.update(static)  # (pulls write their values back into the bounds)
        return sim._pulled(fid, floors, {}, {}, need)

    chain = floor + sum(step[i] for i in range(1, 6))
    other = floor + sum(step[i] for i in range(11, 16))
    whole = max(chain, other) + step[20]
    assert other < chain  # (so a need the shorter chain already reaches stops the walk below the whole pull)
    assert pull(5, INF_NS) == chain and pull(15, INF_NS) == other and pull(20, INF_NS) == whole
    stopped = 0
    for need in sorted({0, floor, chain, other, whole, whole + 1, other + step[20], (floor + whole) // 2}):
        got = pull(20, need)
        assert got <= whole
        if min(got, whole) < need:
            assert got == whole
        else:
            assert got >= need
        stopped += got < whole
    assert stopped  # (some walk ended at the shorter chain: the test is not vacuous)


def test_a_pull_through_hundreds_of_wide_joins_needs_no_recursion() -> None:
    """A DAG of 700 layers of 16 flows, each flow waiting on all 16 of the layer before (a wide list each: a
    collective after a collective, 700 deep, all unfinished at the first submit). A wide list's latest is pulled on
    the walk's own stack, so the pull is its closed form, not a RecursionError past ~450 layers (9cfb24e pulled each
    list's deps by calling itself). Every flow on one worker with the same step, the floor past every static bound:
    the last flow's pull is that floor + 699 steps."""
    topo = tiny()
    layers, width = 700, 16
    flows: list[Flow] = []
    prev: tuple[int, ...] = ()
    for k in range(layers):
        ids = tuple(range(k * width, (k + 1) * width))
        flows += [Flow(i, gpu(topo, i % 3, 0), gpu(topo, (i + 1) % 3, 0), 4096, prev) for i in ids]
        prev = ids
    pool: Any = _Pool
    sim = HybridDecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), pool)  # type: ignore[arg-type]
    sim.submit(flows, 0)
    steps = {sim._step[f.id] for f in flows}
    assert len(steps) == 1 and len({sim._owner[f.id] for f in flows}) == 1
    floor = 1 + max(sim._lb[f.id] for f in flows)
    last = flows[-1].id
    assert sim._pulled(last, [floor, floor], {}, {}, INF_NS) == floor + (layers - 1) * steps.pop()
