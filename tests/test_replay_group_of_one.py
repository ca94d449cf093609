"""A collective on a group of one rank (a DeviceMesh dimension of size 1, `new_subgroups(group_size=1)`) replays:
NCCL runs it on the GPU alone, so it moves nothing over the network and adds no time. Before, the replay's
planner took the group's second rank for a pair and stopped with an IndexError (`phantora replay` of any
recording holding one)."""

from __future__ import annotations

from phantora.egraph import ProgramBuilder, build_graph, replay_graph
from phantora.netsim.flow import FlowSimulator
from tests.stars import star


def test_a_group_of_one_adds_no_time_and_moves_nothing() -> None:
    bs = []
    for r in range(2):
        b = ProgramBuilder(r)
        b.compute("fwd", 5_000 * (r + 1))
        h = b.collective("all_reduce", [r], 1 << 20)
        b.wait([h])
        b.compute("opt", 7_000)
        b.step()
        bs.append(b)
    res = replay_graph(build_graph(bs), star(2), FlowSimulator(star(2)))
    assert res.rank_step_ends_ns == [[12_000], [17_000]]
    assert sum(c.size for c in res.completions) == 0  # markers only: no flow of the all-reduces
