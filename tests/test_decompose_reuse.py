"""Profile reuse (`reuse=on`) under NIC latency and decomposition (`workers=N`): each worker keeps its own episodes.

The tiny fabric of tests/test_decompose.py (3 hosts x 2 GPUs, a rail leaf per GPU index, one spine) with a step
ECN marking (kmin = kmax: ns-3 draws no random number) and a fresh queue pair per flow: there reuse is exact, so
one engine without reuse, one engine with it, and 1 or 2 workers with it must give every flow the same start and
end to the ns. Each period, each rail runs an incast (hosts 0 and 1 -> host 2); rail 1's is 3 us later and
differs in every third period, so on one engine (or one worker) the two rails' episodes are one episode, which
repeats only when both rails repeat, while with two workers rail 0's worker serves every repeat of its own.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from bridge.workers import spawn_workers
from phantora.netsim.base import Completion, Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.packet_config import PacketConfig
from phantora.topology.generators import rail_optimized
from phantora.topology.model import Topology

L_NS = 1000
PERIOD_NS = 1_000_000  # the fabric falls quiet within a period (DCQCN stretches each incast to about 0.4 ms)
PERIODS = 6
_G100 = 100_000_000_000
_STEP = {_G100: 40_000}
SETTINGS: dict[str, object] = {
    "cc": "dcqcn",
    "nvlink": "fluid",
    "nic_latency": L_NS,
    "payload_bytes": 4096,
    "header_bytes": 62,
    "kmin_map": _STEP,  # a step marking: no RED draw, so a served episode leaves no random stream behind
    "kmax_map": _STEP,
    "qp": "flow",  # a fresh CC state per flow: nothing outlives an episode
}


def tiny() -> Topology:
    return rail_optimized(3, 2, 1, nic_rate="100Gbps", uplink_rate="100Gbps", latency="1us", name="rail-3x2")


def periodic_incasts(topo: Topology) -> list[Flow]:
    """PERIODS periods; per period and rail an incast of 2 x 512 KiB into host 2 (rail 1: 3 us later, and 640 KiB
    from host 1 in every third period), each flow delayed to its period's start (no deps)."""
    flows: list[Flow] = []
    for k in range(PERIODS):
        for r in (0, 1):
            for h in (0, 1):
                size = 640 << 10 if (r == 1 and h == 1 and k % 3 == 2) else 512 << 10
                src, dst = topo.node_of_rank(2 * h + r), topo.node_of_rank(4 + r)
                fid = len(flows)
                flows.append(Flow(fid, src, dst, size, delay_ns=k * PERIOD_NS + 3000 * r + 200 * h, key=fid))
    return flows


def run(topo: Topology, flows: list[Flow], **changes: object) -> tuple[list[tuple[int, int, int]], dict[str, object]]:
    """Every flow's (id, start, end) and the engine's stats."""
    config = PacketConfig(**{**SETTINGS, **changes})  # type: ignore[arg-type]
    sim = make_engine(EngineSpec("ns3", config), topo, spawner=spawn_workers)
    try:
        sim.submit(flows, 0)
        done: list[Completion] = sim.drain()
        return sorted((c.flow_id, c.start_ns, c.end_ns) for c in done), dict(sim.stats())
    finally:
        sim.close()


def test_reuse_over_nic_latency_on_one_engine_is_exact_and_serves_whole_periods() -> None:
    """One engine, reuse under the NIC latency: equal to reuse off; a period repeats only where both rails do."""
    topo = tiny()
    flows = periodic_incasts(topo)
    want, off = run(topo, flows)
    assert len(want) == len(flows) and off["ecn_marks"]  # the incasts mark: CC acts, the check is not vacuous
    # Time-shift invariance, the closed form reuse rests on: a period that repeats the first one's flows (rail 0
    # in every period) has the first period's FCTs, shifted by k x PERIOD_NS.
    rel: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for fid, start, end in want:
        k, r = divmod(fid // 2, 2)
        if r == 0:
            rel[k].append((start - k * PERIOD_NS, end - k * PERIOD_NS))
    assert all(rel[k] == rel[0] for k in range(PERIODS))
    assert want[0][1] == 0 and want[0][2] > L_NS  # starts are posting times; the NIC latency counts in the FCT

    got, on = run(topo, flows, reuse="on")
    assert got == want
    # both rails in one episode per period, a repeat only where rail 1 repeats too: periods 0, 1, 3, 4 (1 recorded,
    # 3 served) and 2, 5 (1 recorded, 1 served)
    assert on["reuse_served"] == 4 and on["reuse_mismatches"] == 0
    assert "reuse=on" in on["approximations"]  # type: ignore[operator]


@pytest.mark.slow  # workers=2: two processes loading ns-3, about 6 CPU s (23 s wall at load 10)
def test_reuse_with_two_workers_equals_one_engine_without_reuse_to_the_ns() -> None:
    """Each worker keeps its own episodes: rail 0's worker serves every repeat of its rail, whatever rail 1 does,
    and every start and end stays one engine's without reuse."""
    topo = tiny()
    flows = periodic_incasts(topo)
    want, _ = run(topo, flows)
    got, stats = run(topo, flows, reuse="on", workers=2)
    assert got == want
    assert stats["reuse_mismatches"] == 0 and "reuse=on" in stats["approximations"]  # type: ignore[operator]
    assert [w["reuse_served"] for w in stats["workers"]] == [5, 4]  # type: ignore[index, union-attr]
    assert stats["reuse_served"] == 5 + 4  # rail 0: all 5 repeats; rail 1: the 4 of the test above


@pytest.mark.slow
def test_reuse_with_one_worker_equals_one_engine_and_two_workers() -> None:
    """One worker holds both rails: one engine's episodes (4 served), and the same completions as 2 workers."""
    topo = tiny()
    flows = periodic_incasts(topo)
    want, _ = run(topo, flows)
    w1, s1 = run(topo, flows, reuse="on", workers=1)
    w2, _ = run(topo, flows, reuse="on", workers=2)
    assert w1 == want and w2 == want
    assert s1["reuse_served"] == 4 and s1["reuse_mismatches"] == 0
