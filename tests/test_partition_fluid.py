"""`partition=N` beside the fluid NVLink side (issue 38, item 3; `phantora.netsim.partition_stepped`).

Default (no ns-3): a fabric flow's completion bound per endpoint pair is the least propagation and the largest
bottleneck of its equal-cost routes, as testbed16's file gives them (4 hops of 1 us, 400G NICs; 25 ns NVLink).
Slow (each worker imports ns-3): a workload (an all-to-all, then a ring all-reduce 1 us after it: NVLink flows on
the fluid side, fabric flows on 2 or 4 stepped workers, dependencies both ways) on testbed16 and on a small rail
fabric, replayed with ``nvlink=fluid``: every completion, and so flows.csv byte for byte, as one keyed engine's
with the fluid side; the windows' lookahead the fabric's 1 us on both.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from phantora.netsim.base import Flow
from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig
from phantora.netsim.partition_stepped import PairBounds
from phantora.topology.generators import rail_optimized
from phantora.topology.loader import load_topology


def test_pair_bounds_are_the_least_propagation_at_the_largest_bottleneck() -> None:
    topo = load_topology("testbed16")
    gpus = [v for v, node in enumerate(topo.nodes) if node.kind == "gpu"]
    bounds = PairBounds(topo)
    # gpu0 -> leaf0 -> spine -> leaf1 -> gpu15: 4 cables of 1 us, the NICs' 400G the bottleneck of every route
    assert bounds.of(Flow(1, gpus[0], gpus[15], 1)) == (0, 4_000, 400_000_000_000)
    assert bounds.of(Flow(2, gpus[15], gpus[0], 1)) == (0, 4_000, 400_000_000_000)


def tiny_workload(path: Path) -> Path:
    path.write_text(
        'name = "tiny"\n[defaults]\nranks = "all"\ndtype = "bf16"\n'
        '[[op]]\nname = "a2a"\nkind = "all_to_all"\nbytes = "256KiB"\n'
        '[[op]]\nname = "ar"\nkind = "all_reduce"\nbytes = "4MiB"\nafter = ["a2a"]\ngap = "1us"\n'
    )
    return path


RAIL = rail_optimized(2, 4, 2)  # 2 hosts x 4 GPUs, a rail leaf per GPU index, 2 spines; 1 us cables, 25 ns NVLink


@pytest.mark.slow
@pytest.mark.ns3
@pytest.mark.parametrize(("topology", "workers"), [("testbed16", 2), ("testbed16", 4), ("rail", 2)])
def test_fluid_nvlink_on_stepped_partition_workers_gives_one_keyed_engines_completions(
    topology: str, workers: int, tmp_path: Path
) -> None:
    """On testbed16 each host's NVSwitch runs with its GPUs' group; on the rail fabric a host's GPUs span the two
    groups, so its NVSwitch is idle (partition.Idle: it carries no packet under fluid NVLink) and the windows'
    lookahead is the fabric's 1 us, not NVLink's 25 ns."""
    from bridge.cut_pool import run_partitioned_batches
    from bridge.cut_stepped_start import spawn_stepped
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.replay import replay_inprocess
    from phantora.report.replay_report import write_replay_outputs
    from phantora.workload import load_workload

    topo = RAIL if topology == "rail" else load_topology(topology)
    wl = load_workload(tiny_workload(tmp_path / "tiny.toml"), world=topo.num_ranks)
    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, nvlink="fluid", queue_sample_ns=0)

    def replay(config: PacketConfig, out: Path) -> Any:
        spec = EngineSpec("ns3", config)
        sim = make_engine(spec, topo, partitioner=run_partitioned_batches, stepper=spawn_stepped)
        try:
            res = replay_inprocess(wl, topo, sim)
            write_replay_outputs(out, res, workload=wl.name, topology=topo, network="ns3", engine=sim, spec=spec)
            return res, sim.stats()
        finally:
            sim.close()

    one, one_stats = replay(cfg, tmp_path / "one")
    got, stats = replay(dataclasses.replace(cfg, partition=workers), tmp_path / "n")
    counters = ("flows_submitted", "flows_completed", "data_packets", "acks", "cnps", "ecn_marks", "pfc_pause")
    assert {k: stats[k] for k in counters} == {k: one_stats[k] for k in counters}  # each flow counted once
    part = stats["partition"]
    assert part["workers"] == workers and part["stepped"] and part["rounds"] > 1 and part["windows"] > 1
    assert part["lookahead_ns"] == 1_000
    assert stats["fluid_flows"] > 0  # NVLink flows ran on the fluid side, fabric flows on the workers
    assert sorted(dataclasses.astuple(c) for c in got.completions) == sorted(
        dataclasses.astuple(c) for c in one.completions
    )
    flows = (tmp_path / "one" / "flows.csv").read_bytes()
    assert (tmp_path / "n" / "flows.csv").read_bytes() == flows and flows.count(b"\n") > 100


@pytest.mark.slow
@pytest.mark.ns3
def test_a_flow_released_mid_run_with_a_dependency_pending_in_another_worker() -> None:
    """testbed16 on 2 stepped workers: flow 3 (gpu1 -> gpu9) waits on an NVLink flow (fluid, done in about 3 us)
    and on a 32 MB fabric flow (gpu0 -> gpu8, about 0.7 ms) whose receiver the other worker runs; the fluid side
    hands flow 3 over mid-run with that dependency pending, and the other worker releases it across the cut, at one
    keyed engine's instant."""
    from bridge.cut_pool import run_partitioned_batches
    from bridge.cut_stepped_start import spawn_stepped
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine

    topo = load_topology("testbed16")
    g = [v for v, node in enumerate(topo.nodes) if node.kind == "gpu"]
    flows = [
        Flow(1, g[0], g[8], 32 << 20),
        Flow(2, g[0], g[1], 1 << 20),
        Flow(3, g[1], g[9], 1 << 20, deps=(1, 2)),
        Flow(4, g[9], g[10], 1 << 20, deps=(3,)),  # back to the fluid side
    ]
    cfg = PacketConfig(cc="dcqcn", scheduler=KEYED_SCHEDULER, nvlink="fluid", queue_sample_ns=0)
    got = {}
    for n in (0, 2):
        sim = make_engine(
            EngineSpec("ns3", dataclasses.replace(cfg, partition=n)), topo,
            partitioner=run_partitioned_batches, stepper=spawn_stepped,
        )  # fmt: skip
        try:
            sim.submit(flows, 0)
            got[n] = sorted(dataclasses.astuple(c) for c in sim.drain())
        finally:
            sim.close()
    assert got[2] == got[0] and len(got[0]) == 4
    ends = {c[0]: c[2] for c in got[0]}
    assert ends[2] < 10_000 < ends[1] <= ends[3] - 2_000  # flow 3 started after flow 1 ended, crossed the fabric
