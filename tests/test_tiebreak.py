"""The tie-breaking rule of parallel packet simulation against one engine's own event order (issue 38).

One engine (nic_latency = 1 us, the reference of decomposition) runs cross-partition traffic on a small
leaf-spine with PhantoraOrderLog on; each group of an automatic partition then sorts its same-time events by
the rule (phantora.netsim.tiebreak), knowing only its own order and the ancestry of events from other groups,
and must get the order one engine ran them in, event for event.
"""

from __future__ import annotations

import functools

import pytest

from phantora.netsim.base import Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet import load_ns3
from phantora.netsim.packet_config import PacketConfig, apply_overrides
from phantora.netsim.partition import partition_fabric
from phantora.netsim.tiebreak import OrderLog, check_rule, order_log
from phantora.topology.generators import leaf_spine

TOPO = leaf_spine(4, 4, 2, nvswitch=False)


def traffic() -> list[Flow]:
    """Every NIC sends 200 KB to the one 5 ahead (across leaves and groups), and 8 NICs of two other leaves
    send 100 KB each to one NIC (an incast over the spines)."""
    eps = TOPO.endpoints
    flows = [Flow(i, s, eps[(i + 5) % len(eps)], 200_000) for i, s in enumerate(eps)]
    flows += [Flow(len(eps) + j, s, eps[1], 100_000) for j, s in enumerate(eps[4:12])]
    return flows


@functools.cache
def logged_run(cc: str) -> OrderLog:
    """One engine's order for `cc` (once per test session)."""
    sim = make_engine(EngineSpec("ns3", apply_overrides(PacketConfig(cc=cc), ["nic_latency=1us"])), TOPO)

    def run() -> None:
        sim.submit(traffic(), 0)
        assert len(sim.drain()) == len(traffic())

    try:
        return order_log(run, load_ns3())
    finally:
        sim.close()


@pytest.mark.parametrize("cc", ["dcqcn", pytest.param("hpcc", marks=pytest.mark.slow)])
def test_each_group_orders_its_ties_as_one_engine(cc: str) -> None:
    log = logged_run(cc)
    assert len(log) > 50_000
    for n in (2, 4):
        part = partition_fabric(TOPO, n)
        assert part.cut_links and part.lookahead_ns == 1000
        got = check_rule(log, part.groups)
        assert got.events > 0.9 * len(log)  # the rest: the caller's stop events (no node)
        assert got.ties > 20_000 and got.cross > 5_000  # same-time events, decided across groups
        assert got.mismatches == 0
        # the crux: a per-node key (no ancestry) would run thousands of ties in another order than one engine,
        # and ancestries tie back hundreds of levels (lockstep packets of symmetric flows)
        assert got.local_key_moves > 1_000
        assert got.max_depth > 100


def test_the_log_is_the_engine_order() -> None:
    """Times never go back, uids are unique, and each event's uid range starts where the log says it ran."""
    log = logged_run("dcqcn")
    assert all(a <= b for a, b in zip(log.ts[:-1], log.ts[1:], strict=True))
    assert len(set(log.uid)) == len(log)
    assert all(f <= e for f, e in zip(log.first, log.end, strict=True))
    assert all(e <= f for e, f in zip(log.end[:-1], log.first[1:], strict=True))
