"""`Chain.value` (issue 38, item 2): a flow's bound from its chain of single deps in closed form, without a walk.

A chain of flows 0..5, each waiting on the one before, steps 10, 20, ... 60 (sums 10, 30, 60, 100, 150, 210),
placed with the head's bound 110 (so every flow's static bound is 100 + its step sum), on workers 0 and 1 in turn.
"""

from __future__ import annotations

from phantora.netsim.chain_bounds import Chain

STEPS = [10, 20, 30, 40, 50, 60]
SUMS = [10, 30, 60, 100, 150, 210]


def chain() -> tuple[Chain, dict[int, int]]:
    ch = Chain(0, STEPS[0], 100, 0, ())
    for i in range(1, 6):
        assert ch.add(i, STEPS[i], i % 2) == i
    return ch, {i: 100 + SUMS[i] for i in range(6)}


def test_a_placed_chain_is_its_static_bounds() -> None:
    ch, lbs = chain()
    assert [ch.value(i, lbs, {}, [0, 0]) for i in range(6)] == [100 + s for s in SUMS]


def test_a_floor_applies_from_each_workers_first_unfinished_flow() -> None:
    ch, lbs = chain()
    # worker 1's floor 1,000 applies from flow 1 on: flow 5 ends no earlier than 1,000 + the steps of flows 2..5
    assert ch.value(5, lbs, {}, [0, 1000]) == 1000 + SUMS[5] - SUMS[1]
    assert ch.value(0, lbs, {}, [0, 1000]) == 110  # (flow 0 is worker 0's, before any flow of worker 1)
    # worker 0's floor applies at flow 0 itself
    assert ch.value(3, lbs, {}, [2000, 1000]) == 2000 + SUMS[3] - SUMS[0]


def test_a_rise_counts_from_its_flow_on_and_a_done_flow_by_its_end() -> None:
    ch, lbs = chain()
    lbs[2] = 5000  # a worker's completion bound of flow 2
    ch.raised.append(2)
    assert ch.value(1, lbs, {}, [0, 0]) == 100 + SUMS[1]  # (before the rise: untouched)
    assert ch.value(4, lbs, {}, [0, 0]) == 5000 + SUMS[4] - SUMS[2]
    # flows 0..2 end; 2 at 7,000: flow 3 ends no earlier than 7,000 + its step, whatever its own bound says
    ends = {0: 200, 1: 400, 2: 7000}
    for i in range(3):
        del lbs[i]
    assert ch.value(5, lbs, ends, [0, 0]) == 7000 + SUMS[5] - SUMS[2]
    assert ch.raised == []  # (the rise of a done flow is dropped)
    # a floor past that end still binds, from the first unfinished flow of its worker on (flow 3: worker 1)
    assert ch.value(5, lbs, ends, [0, 9000]) == 9000 + SUMS[5] - SUMS[3]
