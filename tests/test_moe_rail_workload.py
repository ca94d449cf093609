"""workloads/moe_rail_alltoall.toml (bench/bench_whole_dag_driver.py's moe case): expert parallelism over one GPU per
host, strided, so every flow of a group stays on its rail's piece and `--set workers=N` may split it by rail."""

from __future__ import annotations

from pathlib import Path

from phantora.collectives.spec import AlgoOptions
from phantora.netsim.pieces import fabric_pieces
from phantora.replay import plan_workload
from phantora.topology.loader import load_topology
from phantora.workload import load_workload

WORKLOAD = Path(__file__).resolve().parents[1] / "workloads" / "moe_rail_alltoall.toml"


def test_each_group_is_one_rail_and_its_flows_stay_on_it() -> None:
    topo = load_topology("rail128")
    wl = load_workload(WORKLOAD, world=topo.num_ranks)
    assert len(wl.ops) == 16  # a dispatch and a combine per rail
    for op in wl.ops:
        rail = op.coll.ranks[0]
        assert op.coll.ranks == tuple(range(rail, 128, 8)) and op.coll.kind == "all_to_all"
    plan = plan_workload(wl, topo, AlgoOptions(granularity="coarse"))
    pieces = fabric_pieces(topo)
    gpu_nodes = {topo.node_of_rank(r) for r in range(topo.num_ranks)}
    fabric = [f for f in plan.flows if f.src in gpu_nodes and f.dst in gpu_nodes and f.src != f.dst]
    rank_of = {topo.node_of_rank(r): r for r in range(topo.num_ranks)}
    pairs = {(rank_of[f.src], rank_of[f.dst]) for f in fabric}
    assert pairs == {(a, b) for a in range(128) for b in range(a % 8, 128, 8) if a != b}  # 8 x 16 x 15 pairs
    assert all(pieces[f.src] == pieces[f.dst] for f in fabric)
    assert len({pieces[f.src] for f in fabric}) == 8  # one piece per rail
