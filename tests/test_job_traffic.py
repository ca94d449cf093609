"""`phantora.collectives.job_traffic.JobTraffic`: each job's flows keyed as if it ran alone (closed forms)."""

from __future__ import annotations

from phantora.collectives.job_traffic import JobTraffic
from phantora.netsim.base import Flow
from phantora.topology.generators import leaf_spine


def test_keys_count_per_job_whatever_the_interleaving() -> None:
    """Job 1's keys are 0, 1, 2 whether or not job 0 submitted first; a job's class overrides its flows'."""
    topo = leaf_spine(2, 2, 2, nic_rate="100Gbps")
    flows = [Flow(i, 0, 3, 1000, priority=5) for i in range(3)]
    alone = JobTraffic(topo, [None, 2])
    mine, key0 = alone.stamp(1, flows)
    shared = JobTraffic(topo, [None, 2])
    shared.stamp(0, [Flow(10 + i, 0, 3, 1000) for i in range(7)])
    theirs, key0_shared = shared.stamp(1, flows)
    assert (key0, key0_shared) == (0, 0)
    assert [f.key for f in mine] == [f.key for f in theirs] == [0, 1, 2]
    assert {f.priority for f in mine} == {2}
    assert [f.priority for f in shared.stamp(0, flows)[0]] == [5, 5, 5]  # no class of its own: the flows' kept
    assert shared.stamp(0, flows)[1] == 10  # job 0 had used keys 0..6, then 7..9


def test_channel_bytes_follow_each_flows_route() -> None:
    """Every channel on a flow's route carries its bytes once: the job's total is size x hops."""
    topo = leaf_spine(2, 2, 2, nic_rate="100Gbps")
    jt = JobTraffic(topo, [None])
    flows = [Flow(1, 0, 3, 1000), Flow(2, 0, 1, 500), Flow(3, 2, 2, 99), Flow(4, 1, 2, 0)]
    jt.stamp(0, flows)
    hops = {f.id: len(topo.route(f.src, f.dst, k)) for k, f in enumerate(flows) if f.size and f.src != f.dst}
    assert sum(jt.channel_bytes[0].values()) == 1000 * hops[1] + 500 * hops[2]
    assert hops[1] == 4 and hops[2] == 2  # across the spine: 4 links; within a leaf: 2
