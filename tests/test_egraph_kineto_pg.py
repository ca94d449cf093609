"""Kineto import of calls on several process groups over the same ranks: numbered per group (`Process Group
Name`, `distributedInfo.pg_config` as torch 2.13's profiler writes them), so crossed orders on two groups match."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phantora.collectives.spec import AlgoOptions
from phantora.egraph import replay_graph
from phantora.egraph.format import P2P, Coll
from phantora.egraph.kineto import import_kineto
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from phantora.topology.generators import leaf_spine

B = 100e9
MIB = 2**20
AR = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
SEND = "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)"
# torch 2.13's distributedInfo for world [0, 1] and new_group([0, 1]) twice (seen in a gloo run's trace)
PG_CONFIG = [{"pg_name": n, "pg_desc": d, "pg_size": 2, "ranks": [0, 1]}
             for n, d in (("0", "default_pg"), ("1", "undefined"), ("2", "undefined"))]  # fmt: skip


def call(name: str, stream: int, corr: int, ts: float, pg: str | None, nelems: int, **args: Any) -> dict[str, Any]:
    full = {"device": 0, "stream": stream, "correlation": corr, "External id": corr + 1000, "dtype": "Float",
            "In msg nelems": nelems, "Out msg nelems": nelems, "Group size": 2,
            "Process Group Ranks": "[0, 1]"}  # fmt: skip
    full.update(args)
    if pg is not None:
        full["Process Group Name"] = pg
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": 10.0, "args": full}


def trace(rank: int, calls: list[dict[str, Any]], config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    info: dict[str, Any] = {"backend": "nccl", "rank": rank, "world_size": 2}
    if config is not None:
        info["pg_config"] = config
    return {"schemaVersion": 1, "distributedInfo": info, "traceEvents": calls}


def crossed(pgs: tuple[str | None, str | None]) -> list[dict[str, Any]]:
    """Rank 0 all-reduces 1 MiB on group A then 16 MiB on B; rank 1 B then A (each group its own stream)."""
    a, b = pgs
    r0 = [call(AR, 20, 1, 0, a, MIB // 4), call(AR, 30, 2, 1, b, 16 * MIB // 4)]
    r1 = [call(AR, 30, 1, 0, b, 16 * MIB // 4), call(AR, 20, 2, 1, a, MIB // 4)]
    return [trace(0, r0, PG_CONFIG), trace(1, r1, PG_CONFIG)]


def write(tmp_path: Path, traces: list[dict[str, Any]]) -> list[Path]:
    paths = [tmp_path / f"rank{i}.json" for i in range(len(traces))]
    for p, t in zip(paths, traces, strict=True):
        p.write_text(json.dumps(t))
    return paths


def topo2():
    return leaf_spine(1, 2, 0, nic_rate="100Gbps", latency="1us", name="pair")


def test_two_groups_over_the_same_ranks_in_crossed_orders_match_apart(tmp_path: Path) -> None:
    graph, rep = import_kineto(write(tmp_path, crossed(("1", "2"))), gaps="drop")
    assert rep.collectives == 4
    for r in (0, 1):
        got = {(n.pg, n.nbytes, n.seq) for n in graph.program_of(r).nodes if isinstance(n, Coll)}
        assert got == {(1, MIB, 0), (2, 16 * MIB, 0)}  # the world "0" over [0, 1] is pg 0
    # Both run at once on the one 100 Gb/s link (a 2-rank ring all-reduce sends S each way): the big one ends
    # at (1 + 16) MiB / B plus the two hops' latencies.
    res = replay_graph(graph, topo2(), FlowSimulator(topo2()), AlgoOptions(model="ideal"))
    assert res.step_times_ns[0] / 1e3 == pytest.approx(17 * MIB * 8 / B * 1e6 + 2, abs=0.5)


def test_without_group_names_the_crossed_calls_still_meet_each_other(tmp_path: Path) -> None:
    """Older traces name no group: calls are numbered per set of ranks, as before, so the crossed program is
    refused (sizes differ) rather than silently paired."""
    graph, _ = import_kineto(write(tmp_path, crossed((None, None))), gaps="drop")
    assert {n.pg for n in graph.program_of(0).nodes if isinstance(n, Coll)} == {0}
    with pytest.raises(InputError, match="mismatch"):
        replay_graph(graph, topo2(), FlowSimulator(topo2()), AlgoOptions(model="ideal"))


def test_hashed_group_names_follow_pg_config_order_and_transfers_number_per_group(tmp_path: Path) -> None:
    """Hashed names (use_local_synchronization) carry no order: pg_config's does. A transfer's pg counts the
    groups holding both ends (the world "0" first)."""
    config = [PG_CONFIG[0], {"pg_name": "f00d", "ranks": [0, 1]}, {"pg_name": "0bad", "ranks": [0, 1]}]
    r0 = [
        call(AR, 20, 1, 0, "0bad", 256),
        call(SEND, 30, 2, 1, "f00d", 256, **{"Collective name": "send", "Dst Rank": 1}),
    ]
    r1 = [
        call(AR, 20, 1, 0, "0bad", 256),
        call(SEND, 30, 2, 1, "f00d", 256, **{"Collective name": "recv", "Src Rank": 0}),
    ]
    graph, _ = import_kineto(write(tmp_path, [trace(0, r0, config), trace(1, r1, config)]), gaps="drop")
    for r in (0, 1):
        nodes = graph.program_of(r).nodes
        assert [n.pg for n in nodes if isinstance(n, Coll)] == [2]  # after "0" and "f00d"
        assert [n.pg for n in nodes if isinstance(n, P2P)] == [1]  # after "0"
    replay_graph(graph, topo2(), FlowSimulator(topo2()), AlgoOptions(model="ideal"))


def test_a_bad_pg_config_names_its_field(tmp_path: Path) -> None:
    traces = crossed(("1", "2"))
    traces[1]["distributedInfo"]["pg_config"] = [{"pg_name": "1", "ranks": "0,1"}]
    with pytest.raises(InputError, match=r"rank1.json.*distributedInfo.pg_config\[0\]"):
        import_kineto(write(tmp_path, traces))
