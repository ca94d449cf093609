"""The keyed scheduler mode of the packet engine (issue 38): events of one time run by (time scheduled,
scheduling node, that node's count), a key each node computes alone, so that a partitioned run can be
byte-identical to one engine in this mode. Checked against the key derived from the run's own order log
(`phantora.netsim.tiebreak.keyed_mode_keys`), not against an earlier run."""

from __future__ import annotations

import pytest

from phantora.netsim.base import Completion, Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet import load_ns3
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.netsim.tiebreak import OrderLog, keyed_order_breaks, order_log
from phantora.topology.generators import leaf_spine

pytestmark = pytest.mark.ns3

TOPO = leaf_spine(4, 4, 2, nvswitch=False)
KEYED = "ns3::PhantoraKeyedScheduler"


def traffic() -> list[Flow]:
    """Every NIC sends 200 KB to the one 5 ahead (across leaves), and 8 NICs send 100 KB each to one (an
    incast over the spines): many same-ns events on different nodes."""
    eps = TOPO.endpoints
    flows = [Flow(i, s, eps[(i + 5) % len(eps)], 200_000) for i, s in enumerate(eps)]
    flows += [Flow(len(eps) + j, s, eps[1], 100_000) for j, s in enumerate(eps[4:12])]
    return flows


def logged(cc: str, scheduler: str) -> tuple[OrderLog, list[Completion]]:
    """One run's order log and completions."""
    config = apply_overrides(PacketConfig(cc=cc, scheduler=scheduler), ["nic_latency=1us"])
    sim = make_engine(EngineSpec("ns3", config), TOPO)
    done: list[Completion] = []

    def run() -> None:
        sim.submit(traffic(), 0)
        done.extend(sim.drain())

    try:
        return order_log(run, load_ns3()), done
    finally:
        sim.close()


def check_keyed(cc: str) -> OrderLog:
    log, done = logged(cc, KEYED)
    assert sorted(c.flow_id for c in done) == [f.id for f in traffic()]
    assert all(c.end_ns > c.start_ns for c in done)
    ties, breaks = keyed_order_breaks(log)
    assert ties > 20_000  # same-time events: the key decided each pair
    assert breaks == 0
    return log


def test_keyed_mode_runs_ties_in_key_order() -> None:
    check_keyed("dcqcn")


@pytest.mark.slow
@pytest.mark.parametrize("cc", ["hpcc", "none"])
def test_keyed_mode_other_ccs_and_the_default_order_differs(cc: str) -> None:
    """HPCC (INT) and no CC in the keyed mode; the default engine (uid order) breaks the key thousands of
    times on the same traffic, so the check above can fail."""
    check_keyed(cc)
    log, _ = logged(cc, "ns3::PhantoraWheelScheduler")
    ties, breaks = keyed_order_breaks(log)
    assert ties > 20_000 and breaks > 1_000
