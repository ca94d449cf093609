"""`rank_last`: each rank's last flows of a DAG, against its definition on random DAGs and against hand-worked ones."""

from __future__ import annotations

import random

import pytest

from phantora.collectives.rank_last import rank_last
from phantora.netsim.base import Flow


def _by_definition(flows: list[Flow], nodes: list[int], ranks: list[int], members: int) -> dict[int, list[int]]:
    """Rank -> the flows with its position at an end on which no flow with that position at an end depends, in flow
    order, the source's position before the destination's (written out from the definition, one flow at a time)."""
    pos_of = {node: p for p, node in enumerate(nodes)}
    ends = {f.id: (pos_of[f.src], pos_of[f.dst]) for f in flows}
    last: dict[int, list[int]] = {r: [] for r in ranks[:members]}
    for f in flows:
        for p in dict.fromkeys(ends[f.id]):
            waited = any(f.id in g.deps and p in ends[g.id] for g in flows)
            if p < members and not waited:
                last[ranks[p]].append(f.id)
    return last


@pytest.mark.parametrize("seed", range(40))
def test_random_dags_match_the_definition(seed: int) -> None:
    rng = random.Random(seed)
    positions = rng.randint(1, 7)
    helpers = rng.randint(0, 2) if positions > 2 else 0
    nodes = rng.sample(range(100, 200), positions)
    ranks = rng.sample(range(50), positions)
    base = rng.randint(0, 1000)
    flows: list[Flow] = []
    for i in range(rng.randint(0, 60)):
        src, dst = rng.choice(nodes), rng.choice(nodes)  # src == dst too: a marker or a join
        deps = tuple(sorted(rng.sample(range(base, base + i), min(i, rng.randint(0, 3)))))
        flows.append(Flow(base + i, src, dst, rng.randint(0, 9), deps))
    members = positions - helpers
    got = rank_last(flows, nodes, ranks, members, base)
    assert got == _by_definition(flows, nodes, ranks, members)
    assert all(type(i) is int for ids in got.values() for i in ids)  # (not numpy integers: they print otherwise)


def test_a_chain_and_a_marker_worked_by_hand() -> None:
    # 0 -> 1 (a), 1 -> 2 after a (b), a marker on 2 after b (c), 2 -> 0 after a (d)
    nodes, ranks = [10, 11, 12], [5, 6, 7]
    a = Flow(3, 10, 11, 1)
    b = Flow(4, 11, 12, 1, (3,))
    c = Flow(5, 12, 12, 0, (4,))
    d = Flow(6, 12, 10, 1, (3,))
    # a: covered at 1 by b (1 is b's end) and at 0 by d; b: covered at 2 by c; c and d: nothing waits on them
    assert rank_last([a, b, c, d], nodes, ranks, 3, 3) == {5: [6], 6: [4], 7: [5, 6]}
    # position 2 a helper: its flows make no rank wait
    assert rank_last([a, b, c, d], nodes, ranks, 2, 3) == {5: [6], 6: [4]}


def test_no_flows_every_rank_done_at_the_start() -> None:
    assert rank_last([], [1, 2], [0, 1], 2, 0) == {0: [], 1: []}


def test_a_dep_outside_the_dag_is_refused() -> None:
    with pytest.raises(ValueError, match="outside its DAG"):
        rank_last([Flow(10, 1, 2, 1, (9,))], [1, 2], [0, 1], 2, 10)
