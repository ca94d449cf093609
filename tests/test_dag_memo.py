"""`DagMemo`: a repeated call's DAG copied from the first one is the DAG `decompose` makes for it, and a call whose
queue pairs depend on the calls before it (the run's message counters) is decomposed every time."""

from __future__ import annotations

from phantora.collectives import decompose
from phantora.collectives.dag import FlowDag, MessageCounters
from phantora.collectives.dag_memo import DagMemo
from phantora.collectives.spec import AlgoOptions, Collective
from phantora.netsim.base import Flow
from phantora.replay import plan_workload
from phantora.topology.loader import load_topology
from phantora.workload import workload_from_dict

GATE = (1_000_000,)  # a start marker's id, far from the DAGs' own


def _gated(dag: FlowDag) -> list[Flow]:
    return [f if f.deps else f.with_deps(GATE) for f in dag.flows]


def _calls(opts: AlgoOptions) -> tuple[DagMemo, list[FlowDag], list[FlowDag]]:
    """Three repeats of one all-gather over both hosts of testbed16, through a memo and through `decompose` with
    one set of message counters, each call from the next id after a gap of 3 (the planner's markers)."""
    topo = load_topology("testbed16")
    coll = Collective("all_gather", tuple(range(16)), 64 << 20)
    memo, sent = DagMemo(topo), MessageCounters()
    got, want, first = [], [], 7
    for seq in range(3):
        got.append(memo.gated(coll, opts, first, f"all_gather#{seq}@0-15", GATE))
        want.append(decompose(coll, topo, opts, first_flow_id=first, tag=f"all_gather#{seq}@0-15", sent=sent))
        first = want[-1].next_id + 3
    return memo, got, want


def test_a_repeat_is_the_first_call_moved_to_its_ids_and_tag() -> None:
    memo, got, want = _calls(AlgoOptions())
    assert memo.copies == 2
    n = len(want[0].flows)
    assert n > 0
    for dag, w in zip(got, want, strict=True):
        assert dag.flows == _gated(w)
        assert dag.rank_last == w.rank_last and dag.next_id == w.next_id and dag.choice == w.choice
    # the closed form of a copy: every id and dep moved by the first ids' difference (n flows and 3 markers)
    a, b = want[0].flows, got[1].flows
    assert [f.id for f in b] == [f.id + n + 3 for f in a]
    for f, g in zip(a, b, strict=True):
        assert g.tag == "all_gather#1@0-15/" + f.tag.removeprefix("all_gather#0@0-15/")
        assert g.deps == (GATE if not f.deps else tuple(d + n + 3 for d in f.deps))


def test_a_call_that_posts_to_the_message_counters_is_decomposed_each_time() -> None:
    # four queue pairs a connection, a chunked call's messages on them in turn: a repeat's first message takes the
    # queue pair after the last one of the call before, so its ECMP keys are not the first call's (a connection
    # sends 15 steps of 2 slices a pass: 30, not a multiple of 4)
    opts = AlgoOptions(granularity="chunked", nccl_env=(("NCCL_IB_QPS_PER_CONNECTION", "4"),))
    memo, got, want = _calls(opts)
    assert memo.copies == 0
    for dag, w in zip(got, want, strict=True):
        assert dag.flows == _gated(w)
    keys = [[f.key for f in w.flows] for w in want]
    assert keys[0] != keys[1]


def test_a_workload_of_repeated_ops_plans_as_each_op_decomposed() -> None:
    ops = [
        {"name": "ar0", "kind": "all_reduce", "ranks": "0-15", "bytes": "32MiB"},
        {"name": "ar1", "kind": "all_reduce", "ranks": "0-15", "bytes": "32MiB", "after": ["ar0"]},
        {"name": "ar2", "kind": "all_reduce", "ranks": "0-15", "bytes": "1MiB", "after": ["ar1"]},
    ]
    wl = workload_from_dict({"op": ops})
    topo = load_topology("testbed16")
    plan = plan_workload(wl, topo)
    sent: MessageCounters = {}
    for op in wl.ops:
        ids = plan.op_flows[op.name]
        dag = decompose(op.coll, topo, AlgoOptions(), first_flow_id=ids.start, tag=op.name, sent=sent)
        start = plan.op_start_marker[op.name]
        assert len(dag.flows) > 0
        assert plan.flows[ids.start : ids.stop] == [f if f.deps else f.with_deps((start,)) for f in dag.flows]
