"""The plain decomposition driver with its fluid NVLink side in shard processes (issue 38, item 2, step 3): whole-DAG
runs when `factory.WHOLE_DAG_FLUID` is "procs" (or "workers", opt-in: each shard served by a thread of a worker's
process), any run with ``fluid_shards=N,fluid_procs=on,fluid_chains=on`` beside ``workers=2``. Every
completion is one engine's, and the shards' CPU is counted on the critical path (`DecomposedSimulator.helper_cpu`)."""

from __future__ import annotations

import random
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bridge.workers import spawn_workers
from phantora.netsim import factory
from phantora.netsim.base import Flow
from phantora.netsim.engine_spec import EngineSpec
from phantora.netsim.factory import make_engine
from phantora.netsim.flow import FlowSimulator
from phantora.netsim.fluid_procs import ProcShardedFluid
from phantora.netsim.packet_config import PacketConfig
from phantora.replay import replay_inprocess
from phantora.topology.loader import load_topology
from phantora.topology.model import Topology
from phantora.workload import load_workload
from tests.random_dags import rail_batches, run_batches, tiny_rails

ROOT = Path(__file__).resolve().parents[1]
WORKLOAD = ROOT / "workloads" / "rail_allreduce.toml"  # README's workers=2 line: 2 rail all-reduces of 8 MiB
# the settings of the random-DAG tests' one engine (tests/test_decompose_pulled_bounds.py)
BASE = PacketConfig(cc="dcqcn", nvlink="fluid", nic_latency=1000, payload_bytes=4096, header_bytes=62)


def _replay(workers: int) -> tuple[list[tuple[int, int, int]], object, dict[str, object]]:
    """Every flow's (id, start, end) of a whole-DAG replay of WORKLOAD on rail128; the fluid engine; the stats."""
    topo = load_topology("rail128")
    config = PacketConfig(cc="dcqcn", nvlink="fluid", payload_bytes=4096, header_bytes=62, nic_latency=1000)
    sim = make_engine(EngineSpec("ns3", replace(config, workers=workers)), topo, spawner=spawn_workers, whole_dag=True)
    try:
        res = replay_inprocess(load_workload(WORKLOAD, world=topo.num_ranks), topo, sim)
        stats = sim.stats()
        return sorted((c.flow_id, c.start_ns, c.end_ns) for c in res.completions), sim.fluid, stats  # type: ignore[attr-defined]
    finally:
        sim.close()


@pytest.mark.slow  # two replays, one on 2 workers that load ns-3 and 2 fluid shards (about 15 CPU s)
@pytest.mark.parametrize("where", ["procs", "workers"])
def test_a_whole_dag_replay_with_the_fluid_side_in_shard_processes_equals_one_engine(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, one_fluid, _ = _replay(0)
    monkeypatch.setattr(factory, "WHOLE_DAG_FLUID", where)
    two, fluid, stats = _replay(2)
    assert isinstance(one_fluid, FlowSimulator)
    assert isinstance(fluid, ProcShardedFluid) and len(fluid.procs) == 2  # (one shard a worker)
    # ("workers": no process of their own, each served by a worker's process)
    assert all((p._proc is None) == (where == "workers") for p in fluid.procs)
    assert len(one) > 600  # (not vacuous: the two all-reduces' fabric and NVLink flows)
    assert two == one
    d = stats["decompose"]
    assert isinstance(d, dict)
    # the shards worked, most of it while the workers ran, and that is on the rounds' path beside the driver's own
    assert d["helper_cpu_s"] > 0
    assert 0 < d["helper_meanwhile_cpu_s"] <= d["helper_cpu_s"]
    assert d["overlap_cpu_s"] >= d["meanwhile_cpu_s"] + d["helper_meanwhile_cpu_s"] + d["built_cpu_s"] - 1e-5


def _run(topo: Topology, config: PacketConfig, first: list[Flow], second: list[Flow]) -> list[tuple[int, int, int]]:
    """Two batches (the second 30 us in, after an advance), drained; every flow's (id, start, end)."""
    sim = make_engine(EngineSpec("ns3", config), topo, spawner=spawn_workers)
    try:
        done = run_batches(sim, first, second)
    finally:
        sim.close()
    return sorted((c.flow_id, c.start_ns, c.end_ns) for c in done)


@pytest.mark.slow  # per seed one engine, then 2 workers and 2 shard processes (about 10 CPU s)
@pytest.mark.parametrize("seed", range(2))
def test_workers_with_fluid_shard_processes_equal_one_engine_on_random_dags(seed: int) -> None:
    topo = tiny_rails()
    first, second = rail_batches(random.Random(300 + seed), 80)
    one = _run(tiny_rails(), BASE, first, second)
    split = _run(topo, replace(BASE, workers=2, fluid_shards=2, fluid_procs="on", fluid_chains="on"), first, second)
    assert len(one) == len(first) + len(second)
    assert split == one


def test_the_bench_counts_the_shards_cpu_outside_the_rounds() -> None:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from bench_whole_dag_driver import critical_of
    finally:
        sys.path.remove(str(ROOT / "bench"))
    d = {"meanwhile_cpu_s": 0.5, "built_cpu_s": 0.1, "overlap_cpu_s": 2.0}
    # driver 3.0 less its 0.6 while the workers ran, plus the rounds' 2.0
    assert critical_of({"decompose": d}, 3.0) == pytest.approx(4.4)
    # the shards' 0.7, 0.4 of it inside the rounds (in overlap_cpu_s): 0.3 more between rounds
    shards = {**d, "helper_cpu_s": 0.7, "helper_meanwhile_cpu_s": 0.4}
    assert critical_of({"decompose": shards}, 3.0) == pytest.approx(4.7)
