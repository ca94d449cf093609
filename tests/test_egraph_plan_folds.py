"""A graph's back-to-back compute folded once a program (issue 38): the same DAG as node by node, closed-form delays."""

from __future__ import annotations

import pytest

import phantora.egraph.replay as replay
from phantora.egraph.format import Coll, Compute, ExecGraph, Node, Program, RankEntry, Step, Wait
from phantora.topology.generators import leaf_spine


def graph() -> ExecGraph:
    """Two ranks, one program: compute on two streams interleaved, one pinned node (named by a dep), an all-reduce
    between runs, a wait, then more compute and a step."""
    nodes: list[Node] = [
        Compute(0, "a", 10),
        Compute(1, "b", 7),
        Compute(0, "c", 20),  # pinned: node 5 depends on it
        Compute(0, "d", 30),
        Compute(1, "e", 5),
        Coll(0, 0, "all_reduce", 1 << 20, "bf16", None, 0, deps=(2,)),
        Compute(0, "f", 1),
        Compute(0, "g", 2),
        Compute(1, "h", 4),
        Wait(0, (5,)),
        Compute(0, "i", 100),
        Compute(0, "j", 200),
        Step(0, 0),
    ]
    return ExecGraph(2, [(0, 1)], [Program(nodes)], [RankEntry(0, (0,)), RankEntry(0, (0,))])


def test_folds_of_a_program() -> None:
    """Runs of two or more marker-free compute nodes, each stream's sum in first-use order; a pinned node breaks one."""
    g = graph()
    folds = replay._folds(g.programs[0], replay._pinned(g.programs[0]))
    want = {0: (2, ((0, 10), (1, 7))), 3: (5, ((0, 30), (1, 5))), 6: (9, ((0, 3), (1, 4))), 10: (12, ((0, 300),))}
    assert folds == want


def test_folded_plan_is_the_node_by_node_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same flows (ids, deps, delays, tags) with and without folding; the step marker waits 300 ns of compute
    after the wait, the closed-form sum of nodes i and j."""
    topo = leaf_spine(1, 2, 0, nvswitch=False)
    folded = replay.plan_graph(graph(), topo)
    monkeypatch.setattr(replay, "_folds", lambda prog, pinned: {})
    plain = replay.plan_graph(graph(), topo)
    assert folded.flows == plain.flows and folded.step_markers == plain.step_markers
    step = folded.flows[folded.step_markers[0][0]]
    assert step.delay_ns == 300 and step.tag == "r0/step0"
