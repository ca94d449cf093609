"""Outer gates (issue 38, item 2): over the plain decomposition driver the hybrid hands a packet flow that waits on the
fluid NVLink side to the workers when it is placed, gated on those deps (`DecomposedSimulator.submit_outer`), and
opens the gate at their last arrival (`open_outer`), instead of holding it (and the ring steps chained on it) until
then. Every completion is one engine's; the flows behind a closed gate, and those waiting on them, are not read by
the horizon until it opens."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.workers import spawn_workers
from phantora.netsim.base import Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.hybrid import FluidNvlinkSimulator
from phantora.netsim.packet_config import PacketConfig
from phantora.replay import replay_inprocess
from phantora.topology.loader import load_topology
from phantora.topology.model import Topology
from phantora.workload import load_workload
from tests.random_dags import rail_batches, run_batches, tiny_rails

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "workloads" / "rail_allreduce.toml"  # 2 hierarchical all-reduces: rings behind NVLink phases
BASE = PacketConfig(cc="dcqcn", nvlink="fluid", nic_latency=1000, payload_bytes=4096, header_bytes=62)
Run = tuple[list[tuple[int, int, int]], dict[str, object]]


def _run(topo: Topology, config: PacketConfig, first: list[Flow], second: list[Flow], *, outer: bool = True) -> Run:
    """Two batches (the second 30 us in, after an advance), drained; every flow's (id, start, end) and the stats."""
    sim = make_engine(EngineSpec("ns3", config), topo, spawner=spawn_workers)
    try:
        if isinstance(sim, FluidNvlinkSimulator):
            sim.outer_gates = sim.outer_gates and outer
        done = run_batches(sim, first, second)
        stats = sim.stats()
    finally:
        sim.close()
    return sorted((c.flow_id, c.start_ns, c.end_ns) for c in done), stats


@pytest.mark.slow  # per seed one engine, then 2 workers twice (about 12 CPU s)
@pytest.mark.parametrize("seed", range(3))
def test_outer_gates_equal_one_engine_on_random_dags(seed: int) -> None:
    topo = tiny_rails()
    first, second = rail_batches(random.Random(700 + seed), 90)
    one, _ = _run(tiny_rails(), BASE, first, second)
    gated, stats = _run(topo, replace(BASE, workers=2), first, second)
    held, held_stats = _run(topo, replace(BASE, workers=2), first, second, outer=False)
    assert len(one) == len(first) + len(second)
    assert gated == one
    assert held == one
    # not vacuous: packet flows went out behind outer gates (with them off, none did)
    assert isinstance(stats["outer_gated"], int) and stats["outer_gated"] > 5
    assert "outer_gated" not in held_stats


@pytest.mark.slow  # two replays, one on 2 workers that load ns-3 (about 12 CPU s)
def test_a_whole_dag_replay_with_outer_gates_equals_one_engine() -> None:
    """The hierarchical all-reduces: each rail ring's head waits on an NVLink phase; its gate opens at the phase's end,
    and the ring's later steps, booked at the first submit, follow it on the workers."""
    topo = load_topology("rail128")
    config = PacketConfig(cc="dcqcn", nvlink="fluid", payload_bytes=4096, header_bytes=62, nic_latency=1000)
    got: list[Run] = []
    for workers in (0, 2):
        sim = make_engine(
            EngineSpec("ns3", replace(config, workers=workers)), topo, spawner=spawn_workers, whole_dag=True
        )
        try:
            res = replay_inprocess(load_workload(WORKLOAD, world=topo.num_ranks), topo, sim)
            got.append((sorted((c.flow_id, c.start_ns, c.end_ns) for c in res.completions), sim.stats()))
        finally:
            sim.close()
    (one, _), (two, stats) = got
    assert len(one) > 600  # (the two all-reduces' fabric and NVLink flows)
    assert two == one
    assert isinstance(stats["outer_gated"], int) and stats["outer_gated"] >= 256  # (a ring head per rail and phase)
