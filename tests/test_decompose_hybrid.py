"""Issue 38, route (a): decomposition workers that each run the whole fluid NVLink hybrid for their flows.

`HybridDecomposedSimulator` gives each worker its rails' fabric flows and its hosts' NVLink flows; the driver keeps
only the dependencies between workers (gates). On the tiny rail fabric of tests/test_decompose.py (3 hosts x 2
GPUs; each host's NVLink flows release the other rail's incasts, so every stage crosses workers both ways), every
start and end, PFC frame, ECN mark, CNP and transport counter must equal one engine's.
"""

from __future__ import annotations

from dataclasses import astuple
from typing import Any

import pytest

from bridge.workers import spawn_workers
from phantora.netsim.base import Flow
from phantora.netsim.decompose_hybrid import HybridDecomposedSimulator
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.hybrid import FLUID, flow_side
from phantora.netsim.packet_config import PacketConfig
from tests.test_decompose import QUIET_NS, SETTINGS, gpu, nvlink_chain_beside_rings, rail_dag, tiny, watched_run


def records(sim: Any) -> dict[str, list[Any]]:
    fab = sim.fabric()
    return {
        "pfc": sorted(map(astuple, fab.pfc_events())),
        "marks": sorted(map(astuple, fab.ecn_mark_events())),
        "cnps": sorted(map(astuple, fab.cnp_events())),
        "transport": sorted(map(astuple, fab.flow_transport().values())),
    }


def ends(done: list[Any]) -> list[tuple[int, int, int]]:
    return sorted((c.flow_id, c.start_ns, c.end_ns) for c in done)


@pytest.mark.slow  # two worker processes loading ns-3 (about 4 CPU s)
def test_hybrid_workers_equal_one_engine_to_the_ns() -> None:
    topo = tiny()
    flows = rail_dag(topo, stages=3)
    one = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS)), topo)
    try:
        one.submit(flows, 0)
        want = ends(one.drain())
        want_records = records(one)
        one.advance(one.now() + QUIET_NS)
        want_bytes = sorted((u.channel, u.bytes, u.packets) for u in one.fabric().channel_usage())  # type: ignore[union-attr]
    finally:
        one.close()
    assert len(want) == len(flows) and want_records["marks"] and want_records["cnps"]  # congested: not vacuous
    nvlink = [f.id for f in flows if flow_side(f, topo.shared_nvswitch) == FLUID]
    assert nvlink  # the stages hand over through NVLink flows

    sim = HybridDecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), spawn_workers)
    try:
        sim.submit(flows, 0)
        assert ends(sim.drain()) == want
        assert records(sim) == want_records
        stats = sim.stats()
        per = stats["workers"]
        # each worker ran NVLink flows of its own hosts (host 2's NVSwitch is one worker's): none in the driver
        assert sum(w["fluid_flows"] for w in per) == len(nvlink)  # type: ignore[attr-defined, union-attr]
        sim.advance(sim.now() + QUIET_NS)
        got_bytes = sorted((u.channel, u.bytes, u.packets) for u in sim.fabric().channel_usage())  # type: ignore[union-attr]
    finally:
        sim.close()
    # every channel's bytes and packets: the fabric's from the workers' ns-3, NVLink's from their fluid sides
    fabric = {c for c, _, _ in want_bytes if topo.channel_bandwidth(c) == 100_000_000_000}
    assert fabric and len(fabric) < len(want_bytes)  # (both kinds carried traffic: not vacuous)
    assert got_bytes == want_bytes


@pytest.mark.slow  # two worker processes loading ns-3 (about 4 CPU s)
def test_hybrid_workers_return_at_watched_completions_as_one_engine() -> None:
    """The runtime's way: `advance_watching`, and new flows (NVLink and rail) submitted at each watched completion;
    every call returns at the same ns with the same completions as one engine's."""
    topo = tiny()
    flows = nvlink_chain_beside_rings(topo)
    one = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS)), topo)
    try:
        want = watched_run(one, topo, flows)
    finally:
        one.close()
    sim = HybridDecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), spawn_workers)
    try:
        assert watched_run(sim, topo, flows) == want
    finally:
        sim.close()


@pytest.mark.slow  # two worker processes loading ns-3 (about 4 CPU s)
def test_an_nvlink_flow_on_another_worker_starts_the_ns_its_fabric_dep_ends() -> None:
    """No lookahead: host 2's NVLink flow waits on a rail 1 flow whose worker is not host 2's, and a rail 0 flow
    waits on the NVLink flow. The NVLink flow starts at the fabric flow's end (no NIC latency), the rail flow is
    posted at the NVLink flow's end, and both equal one engine's. Each worker has its own horizon: the rail 1
    flow's worker has no gate into it and runs it to its end in the first round, host 2's worker stops at its bound;
    the second round opens the gate at the real end and runs the rest: 3 rounds at most (a shared horizon crawled
    through the flow's last packets one worker event a round)."""
    topo = tiny()
    flows = [
        Flow(0, gpu(topo, 0, 1), gpu(topo, 2, 1), 256 << 10, key=0),
        Flow(1, gpu(topo, 2, 1), gpu(topo, 2, 0), 8 << 20, (0,), key=1),
        Flow(2, gpu(topo, 2, 0), gpu(topo, 1, 0), 256 << 10, (1,), key=2),
    ]
    one = make_engine(EngineSpec("ns3", PacketConfig(**SETTINGS)), topo)
    try:
        one.submit(flows, 0)
        want = ends(one.drain())
    finally:
        one.close()
    sim = HybridDecomposedSimulator(topo, PacketConfig(**SETTINGS, workers=2), spawn_workers)
    try:
        sim.submit(flows, 0)
        got = ends(sim.drain())
        owners = {f.id: sim._owner[f.id] for f in flows}
        rounds = sim.rounds
    finally:
        sim.close()
    assert got == want
    assert owners[0] != owners[1]  # the hand-off crosses workers
    assert got[1][1] == got[0][2] and got[2][1] == got[1][2]  # each starts (is posted) at its dep's end
    assert rounds <= 3
