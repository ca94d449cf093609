"""A partition worker's release bound for a flow waiting on several flows (issue 38): it is released when the last
of them completes, so no earlier than the greatest of their completion bounds (`CutReleaseBounds`), not the least.
"""

from __future__ import annotations

from phantora.netsim.base import Flow
from phantora.netsim.partition import partition_fabric
from tests.test_cut_workers import TOPO, config


def test_a_join_is_released_at_its_latest_dependencys_bound() -> None:
    """Worker 0 starts A and B (to its own group) after 1,000 and 5,000 ns of delay: each is queued to start then,
    so completes no earlier than one ns later (1,001 and 5,001). J (no delay) and J2 (300 ns) of group 1 wait on
    both: released at 5,001 at the earliest (in B's completion ns: `same`) and at 5,301 (after it: `later`); the
    least of each dependency's own bounds would give 1,001 and 1,301."""
    from phantora.netsim.packet import Ns3Simulator

    groups = partition_fabric(TOPO, 2, nvlink_fluid=False).groups
    mine = [n for n in TOPO.endpoints if groups[n] == 0]
    other = [n for n in TOPO.endpoints if groups[n] == 1]
    flows = [
        Flow(0, mine[0], mine[1], 10_000, delay_ns=1_000),
        Flow(1, mine[2], mine[3], 10_000, delay_ns=5_000),
        Flow(2, other[0], other[1], 10_000, deps=(0, 1)),
        Flow(3, other[2], mine[0], 10_000, deps=(1, 0), delay_ns=300),
    ]
    cfg = config("dcqcn", None).with_updates(partition=2, partition_worker=0)
    with Ns3Simulator(TOPO, cfg) as sim:
        sim.submit(flows, 0)
        later, same = (int(x) for x in sim._net.CutReleaseBounds(0))
    assert (later, same) == (5_001 + 300, 5_001)
