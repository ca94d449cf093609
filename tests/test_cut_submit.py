"""A partition worker's submit of wide dependency lists (issue 38): ids cross from Python packed in one call
(`PhantoraNetwork::UnpackIds`), and a worker counts each distinct dependency once (`Impl::AddWorkerDeps`)."""

from __future__ import annotations

from array import array

import pytest

from phantora.netsim.base import Flow
from phantora.netsim.partition import partition_fabric
from tests.test_cut_workers import TOPO, config


def test_unpack_ids_gives_the_packed_ids_and_refuses_a_partial_one() -> None:
    from phantora.netsim.packet import Ns3Simulator

    ids = [0, 1, 992, (1 << 64) - 1]
    with Ns3Simulator(TOPO, config("dcqcn", None)) as sim:
        assert list(sim._net.UnpackIds(array("Q", ids).tobytes())) == ids
        assert list(sim._net.UnpackIds(b"")) == []
        with pytest.raises(Exception, match="UnpackIds: 7 bytes"):
            sim._net.UnpackIds(b"\0" * 7)


def test_a_repeated_dependency_counts_once_in_a_worker() -> None:
    """As tests/test_cut_release_join.py, with each dependency named twice: J is released in B's completion ns
    (5,001) at the earliest, J2 300 ns after it (5,301)."""
    from phantora.netsim.packet import Ns3Simulator

    groups = partition_fabric(TOPO, 2, nvlink_fluid=False).groups
    mine = [n for n in TOPO.endpoints if groups[n] == 0]
    other = [n for n in TOPO.endpoints if groups[n] == 1]
    flows = [
        Flow(0, mine[0], mine[1], 10_000, delay_ns=1_000),
        Flow(1, mine[2], mine[3], 10_000, delay_ns=5_000),
        Flow(2, other[0], other[1], 10_000, deps=(0, 1, 0, 1)),
        Flow(3, other[2], mine[0], 10_000, deps=(1, 0, 1), delay_ns=300),
    ]
    cfg = config("dcqcn", None).with_updates(partition=2, partition_worker=0)
    with Ns3Simulator(TOPO, cfg) as sim:
        sim.submit(flows, 0)
        later, same = (int(x) for x in sim._net.CutReleaseBounds(0))
    assert (later, same) == (5_001 + 300, 5_001)
