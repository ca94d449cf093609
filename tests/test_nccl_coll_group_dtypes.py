"""A coalesced call whose tensors have mixed dtypes: NCCL aggregates a group's calls per (function, reduction, type).

enqueue.cc: before 2.22 consecutive calls of one (function, reduction, type) form an aggregate; from 2.22
`ncclPrepareTasks` bins the calls by (function, reduction, type) and aggregates runs within 4 x inside a bin. So
calls of two dtypes are never one aggregate: each type's calls take their own tuner pick, in the group's one launch.
"""

from __future__ import annotations

import pytest
import torch

from phantora.collectives import Collective, decompose
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from tests.test_nccl_coll_group import live_block
from tests.test_nccl_symmetric import H100, RANKS, KiB, MiB, opts


def _end_us(coll: Collective, **env: str) -> tuple[float, dict]:
    dag = decompose(coll, H100, opts(**env))
    sim = FlowSimulator(H100)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1000, dag.choice or {}


def _mixed(sizes: tuple[int, ...], types: tuple[str, ...]) -> Collective:
    return Collective("all_reduce", RANKS, sum(sizes), types[0], group_sizes=sizes, group_dtypes=types)


@pytest.mark.parametrize("version", ["2.21.5", "2.30.7"])
def test_two_dtypes_are_two_aggregates_each_its_own_pick(version):
    """64 KiB of fp32 and 64 KiB of bf16 all-reduced in one group: two aggregates at every version (equal sizes,
    which one type's 64 KiB + 64 KiB would join), each with the pick of its own call alone; one launch, so the group
    ends at the later latency plus the sum of their bandwidth times (bytes / algbw each)."""
    s = 64 * KiB
    env = {"PHANTORA_NCCL_VERSION": version}
    _, a = _end_us(Collective("all_reduce", RANKS, s, "fp32"), **env)
    _, b = _end_us(Collective("all_reduce", RANKS, s, "bf16"), **env)
    group_us, got = _end_us(_mixed((s, s), ("fp32", "bf16")), **env)
    assert got["group_calls"] == 2
    assert [(x["algorithm"], x["protocol"], x["calls"], x["bytes"]) for x in got["aggregates"]] == [
        (a["algorithm"], a["protocol"], 1, s),
        (b["algorithm"], b["protocol"], 1, s),
    ]
    lat = max(c["model_lat_us"] + c.get("fill_us", 0.0) for c in (a, b))
    bw = s / (a["model_algbw_gbs"] * 1e3) + s / (b["model_algbw_gbs"] * 1e3)
    assert group_us == pytest.approx(lat + bw, rel=0.02)
    _, same = _end_us(Collective("all_reduce", RANKS, 2 * s, "fp32", group_sizes=(s, s)), **env)
    assert "aggregates" not in same  # one type: one aggregate of the two


def test_consecutive_calls_of_a_type_before_2_22_and_binned_from_2_22():
    """fp32, bf16, fp32 calls of 8 KiB: 2.21 aggregates consecutive calls of one type (three aggregates, in issue
    order); 2.22+ bins them by type (the two fp32 calls, within 4 x, one aggregate; the bf16 one another)."""
    sizes, types = (8 * KiB,) * 3, ("fp32", "bf16", "fp32")
    _, old = _end_us(_mixed(sizes, types), PHANTORA_NCCL_VERSION="2.21.5")
    assert [x["calls"] for x in old["aggregates"]] == [1, 1, 1]
    _, new = _end_us(_mixed(sizes, types), PHANTORA_NCCL_VERSION="2.30.7")
    assert sorted(x["calls"] for x in new["aggregates"]) == [1, 2] and new["group_calls"] == 3


def test_the_planner_takes_the_calls_dtypes_from_the_algo_map():
    """A live coalesced call sends its calls' dtypes in its `algo` map (`group_dtypes`): the planner's group is two
    aggregates; without them, one of the first's type."""
    from phantora.collectives.mirrors import Mirrors
    from phantora.collectives.plan import CallSpec, CollectivePlanner

    planner = CollectivePlanner(H100, opts(), Mirrors(8, 8))
    algo = {"group_sizes": (64 * KiB, 64 * KiB), "group_dtypes": ("fp32", "bf16")}
    plan = planner.plan(CallSpec("all_reduce", RANKS, 128 * KiB, "fp32", algo=algo), "mixed")
    assert len((plan.choice or {})["aggregates"]) == 2
    one = planner.plan(
        CallSpec("all_reduce", RANKS, 128 * KiB, "fp32", algo={"group_sizes": algo["group_sizes"]}), "one"
    )
    assert "aggregates" not in (one.choice or {})


def test_bad_or_unmodelled_dtypes_are_one_line():
    """A dtype list of the wrong length, not starting with the call's dtype, or naming an unknown type is refused;
    so is a mixed group whose calls of one type would run NCCL's symmetric kernels (one kernel a type)."""
    with pytest.raises(InputError, match="group_dtypes"):
        Collective("all_reduce", RANKS, 2 * KiB, "fp32", group_sizes=(KiB, KiB), group_dtypes=("fp32",))
    with pytest.raises(InputError, match="group_dtypes"):
        Collective("all_reduce", RANKS, 2 * KiB, "fp32", group_sizes=(KiB, KiB), group_dtypes=("bf16", "fp32"))
    with pytest.raises(InputError, match="group_dtypes"):
        Collective("all_reduce", RANKS, 2 * KiB, "fp32", group_sizes=(KiB, KiB), group_dtypes=("fp32", "fp5"))
    sym = {"PHANTORA_NCCL_REGISTER": "2", "PHANTORA_NCCL_VERSION": "2.28.3"}
    with pytest.raises(InputError, match="mixed dtypes"):
        decompose(_mixed((8 * KiB, 8 * KiB), ("fp32", "bf16")), H100, opts(**sym))


def test_the_backend_sends_dtypes_only_where_they_differ():
    """runtime/backend.py's `_call_dtypes`: each call's dtype name for mixed tensors, () for one type."""
    from phantora.runtime.backend import _call_dtypes

    f, b = torch.zeros(4), torch.zeros(4, dtype=torch.bfloat16)
    assert _call_dtypes([[f], [b], [f]]) == ("fp32", "bf16", "fp32")
    assert _call_dtypes([[f], [f]]) == ()


def test_a_recorded_mixed_group_keeps_its_dtypes_and_replays_as_its_aggregates(tmp_path):
    """Node type 14 writes a mixed group's calls as [bytes, dtype code] pairs and reads them back; the graph and its
    Chakra export (phantora_group_dtypes) replay to the group's end decomposed alone, not to one type's group."""
    from phantora.egraph import replay_graph
    from phantora.egraph.builder import ProgramBuilder
    from phantora.egraph.chakra import export_chakra, read_chakra
    from phantora.egraph.format import Coll, Program, assemble

    sizes, types = (64 * KiB, 8 * MiB), ("fp32", "bf16")
    parts = []
    for r in RANKS:
        b = ProgramBuilder(r)
        b.wait([b.collective("all_reduce", RANKS, sum(sizes), dtype="fp32", group_sizes=sizes, group_dtypes=types)])
        prog, groups = b.build()
        back = Program.decode(prog.encode())
        assert back.nodes == prog.nodes
        parts.append((back, groups))
    node = parts[0][0].nodes[0]
    assert isinstance(node, Coll) and node.group_dtypes == types
    graph = assemble(parts)
    export_chakra(graph, tmp_path / "chakra")
    group_us, _ = _end_us(_mixed(sizes, types), PHANTORA_NCCL_VERSION="2.21.5")
    one_us, _ = _end_us(
        Collective("all_reduce", RANKS, sum(sizes), "fp32", group_sizes=sizes), PHANTORA_NCCL_VERSION="2.21.5"
    )
    assert abs(group_us - one_us) > 0.01 * one_us
    for g in (graph, read_chakra(tmp_path / "chakra")):
        res = replay_graph(g, H100, FlowSimulator(H100), opts(PHANTORA_NCCL_VERSION="2.21.5"))
        assert max(c.end_ns for c in res.completions) / 1000 == pytest.approx(group_us, abs=1e-3)


LIVE = live_block(  # 2 MiB each
    '[torch.ones(1 << 19, device="cuda"), torch.ones(1 << 20, device="cuda", dtype=torch.bfloat16)]',
    "float(xs[0][0]), float(xs[1][0])",
)


@pytest.mark.slow
def test_a_live_mixed_dtype_block_runs_as_its_aggregates(tmp_path):
    """4 ranks of an 8-H100 host, a `_coalescing_manager` block of a 2 MiB fp32 and a 2 MiB bf16 all-reduce (torch's
    allreduce_coalesced, one NCCL group): a block takes the group's end as two aggregates on an idle host, not as one
    fp32 aggregate of 4 MiB (which the first tensor's dtype made of it); the recording keeps the dtypes."""

    from phantora.egraph.format import Coll
    from phantora.egraph.live import record_run
    from phantora.launcher import RunConfig
    from phantora.topology.generators import dgx_host

    topo = dgx_host(8, gpu="h100")
    ranks, s = (0, 1, 2, 3), 2 * MiB

    def group_us(**kw) -> float:
        dag = decompose(Collective("all_reduce", ranks, 2 * s, "fp32", group_sizes=(s, s), **kw), topo, opts())
        sim = FlowSimulator(topo)
        sim.submit(dag.flows, at=0)
        return max(c.end_ns for c in sim.drain()) / 1000

    mixed, as_one = group_us(group_dtypes=("fp32", "bf16")), group_us()
    assert abs(mixed - as_one) > 0.05 * as_one
    script = tmp_path / "mixed.py"
    script.write_text(LIVE)
    cfg = RunConfig(str(script), topology=topo, nproc=4, trace="none", timeout_s=600, out_dir=tmp_path / "run")
    rep, graph = record_run(cfg, tmp_path / "graph")
    lines = [ln.split() for r in range(4) for ln in rep.logs[f"rank {r}"].splitlines() if ln.startswith("RESULT")]
    assert len(lines) == 4 and all(float(ln[3]) == float(ln[4]) == 4.0**12 for ln in lines)  # the sums went through
    assert all(float(ln[2]) == pytest.approx(mixed, rel=0.005) for ln in lines)
    colls = [n for p in graph.programs for n in p.nodes if isinstance(n, Coll) and n.kind == "all_reduce"]
    assert colls and all(n.group_dtypes == ("fp32", "bf16") for n in colls)


@pytest.mark.ns3
@pytest.mark.parametrize(
    ("sizes", "types", "env"),
    [
        ((MiB, MiB), ("fp32", "bf16"), {}),  # two Ring LL aggregates, one a type
        ((128 * KiB, MiB), ("fp32", "fp32"), {}),  # two Ring LL aggregates of one type, 8 x apart (2.22+)
        ((4 * KiB, 4 * KiB), ("fp32", "fp32"), {"PHANTORA_NCCL_REGISTER": "2", "PHANTORA_NCCL_VERSION": "2.28.3"}),
    ],
)
def test_groups_take_the_same_time_through_ns3(ns3_lib, sizes, types, env):
    """A group's flows on an idle 8-H100 host through both engines: every flow's bytes, and ns-3's end within 6 % of
    the flow network's at the packets' goodput. Aggregates kept apart run on the same channels here, each on its own
    connections: on shared ones ns-3 sent the capped aggregates one after another (1 MiB fp32 + 1 MiB bf16: 67.1
    against 41.0 us)."""
    from tests.engine_pair import flow_and_ns3_end_ns

    kw = {"group_dtypes": types} if len(set(types)) > 1 else {}
    coll = Collective("all_reduce", RANKS, sum(sizes), types[0], group_sizes=sizes, **kw)
    dag = decompose(coll, H100, opts(**env))
    times = flow_and_ns3_end_ns(H100, dag.flows)
    assert times["ns3"] == pytest.approx(times["flow"], rel=0.06)
