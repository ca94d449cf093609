"""A group of collectives of several kinds, reductions or roots (a `_coalescing_manager(device=...)` block's
broadcasts, reductions and all-reduces together) as NCCL runs it: one plan (enqueue.cc v2.22.3-1 .. v2.30.7-1,
`ncclPrepareTasks` bins the calls by (function, reduction, type), not by root, and `scheduleCollTasksToPlan` deals
all the bins' tasks in one plan, one launch). Expected figures are worked out by hand from NCCL's code and its
model's published latencies and bandwidths (`Choice.lat_us`, `Choice.algbw` of each call alone), not read back from
the group's own output.
"""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.group_plans import group_plans
from phantora.collectives.options import resolve
from phantora.errors import InputError
from tests.test_nccl_symmetric import H100, RANKS, KiB, MiB, opts

V227 = {"PHANTORA_NCCL_VERSION": "2.27.3"}


def _mixed(**kw) -> Collective:
    return Collective(
        "all_reduce",
        RANKS,
        2 * MiB,
        "fp32",
        group_sizes=(MiB, MiB),
        group_kinds=("all_reduce", "broadcast"),
        group_roots=(None, 0),
        **kw,
    )


def test_an_all_reduce_and_a_broadcast_are_dealt_as_one_plan():
    """2.27, 8 H100s: a 1 MiB all-reduce and a 1 MiB broadcast, each Ring LL on 24 channels. Their traffic, LL's
    counted 4 x: 8 MiB and 4 MiB over min(48, 24) channels, 524,288 each. The all-reduce's cells are
    16 KiB / 8 = 2 KiB, 32 a channel: 16 channels of 64 KiB (0-15); the broadcast goes on from channel 16 with
    cells of 16 KiB / 4 = 4 KiB, 32 a channel: 8 channels of 128 KiB (16-23). Before, two coalesced calls each
    dealt from channel 0."""
    cut = group_plans(_mixed(), H100, opts(**V227))
    assert cut is not None and len(cut) == 1
    (ar, ar_o, _), (bc, bc_o, _) = cut[0]
    assert (ar.kind, bc.kind, bc.root) == ("all_reduce", "broadcast", 0)
    assert (ar_o.protocol, bc_o.protocol) == ("LL", "LL")
    assert (ar.dealt_from, ar.dealt_parts) == (0, (64 * KiB,) * 16)
    assert (bc.dealt_from, bc.dealt_parts) == (16, (128 * KiB,) * 8)


def test_one_plans_latency_once_and_the_calls_bandwidth_times_summed_in_both_engines():
    """One launch: the group ends at the larger latency plus both calls' bandwidth times (each call's bytes over
    its choice's algbw, as NCCL deals their traffic over the channels): 15.0 + 1 MiB / 80.571 GB/s +
    1 MiB / 141.0 GB/s = 35.451 us, through the flow engine and ns-3."""
    from tests.engine_pair import flow_and_ns3_end_ns

    o = opts(**V227)
    alone = [
        resolve(Collective(k, RANKS, MiB, "fp32", root=r), H100, o)[1]
        for k, r in (("all_reduce", None), ("broadcast", 0))
    ]
    assert all(c is not None for c in alone)
    expected_ns = 1000 * max(c.lat_us for c in alone) + sum(MiB / c.algbw for c in alone)  # type: ignore[union-attr]
    dag = decompose(_mixed(), H100, o)
    assert dag.choice is not None and dag.choice["group_calls"] == 2 and dag.choice["plans"] == 1
    ends = flow_and_ns3_end_ns(H100, dag.flows)
    assert ends["flow"] == pytest.approx(expected_ns, abs=5)
    assert ends["ns3"] == pytest.approx(ends["flow"], rel=0.01)


def test_broadcasts_of_two_roots_are_one_aggregate_rated_on_their_total():
    """4 x 512 KiB broadcasts from roots 0, 1, 0, 1: NCCL bins them by (function, reduction, type), not root, so
    its tuner rates their 2 MiB: Ring Simple (11.8 us, 360 GB/s), where each root's 1 MiB alone runs Ring LL.
    Each root's calls run its own chain on the aggregate's choice: 11.8 + 2 MiB / 360 GB/s = 17.625 us, what one
    root's 4 calls take."""
    from phantora.netsim.flow import FlowSimulator

    half = 512 * KiB
    o = opts(**V227)
    group = Collective("broadcast", RANKS, 4 * half, "fp32", root=0, group_sizes=(half,) * 4, group_roots=(0, 1, 0, 1))
    cut = group_plans(group, H100, o)
    assert cut is not None and len(cut) == 1
    assert sorted((p.root, p.group_sizes, po.protocol) for p, po, _ in cut[0]) == [
        (0, (half,) * 2, "Simple"),
        (1, (half,) * 2, "Simple"),
    ]
    total = resolve(Collective("broadcast", RANKS, 4 * half, "fp32", root=0), H100, o)[1]
    one_root = resolve(Collective("broadcast", RANKS, 2 * half, "fp32", root=0), H100, o)[1]
    assert total is not None and one_root is not None
    assert (total.protocol, one_root.protocol) == ("Simple", "LL")
    sim = FlowSimulator(H100)
    sim.submit(decompose(group, H100, o).flows, at=0)
    end_ns = max(c.end_ns for c in sim.drain())
    assert end_ns == pytest.approx(1000 * total.lat_us + 4 * half / total.algbw, abs=5)


def test_before_2_22_the_plans_pieces_are_dealt_alone():
    """2.21 deals no plan (each task strides its own channels): the pieces run with one launch, undealt."""
    cut = group_plans(_mixed(), H100, opts(PHANTORA_NCCL_VERSION="2.21.5"))
    assert cut is not None and len(cut) == 1 and all(not p.dealt_parts for p, _, _ in cut[0])
    assert decompose(_mixed(), H100, opts(PHANTORA_NCCL_VERSION="2.21.5")).choice["group_calls"] == 2


def test_bad_per_call_fields_are_refused_in_one_line():
    with pytest.raises(InputError, match="group_kinds"):
        Collective(
            "all_reduce", RANKS, 2 * MiB, "fp32", group_sizes=(MiB, MiB), group_kinds=("broadcast", "all_reduce")
        )
    with pytest.raises(InputError, match="group_roots"):
        Collective("broadcast", RANKS, 2 * MiB, "fp32", root=0, group_sizes=(MiB, MiB), group_roots=(0, 9))
    with pytest.raises(InputError, match="group_kinds"):
        Collective(
            "all_reduce", RANKS, 2 * MiB, "fp32", group_sizes=(MiB, MiB), group_kinds=("all_reduce", "all_to_all")
        )


def test_the_ideal_model_runs_each_kind_and_root_apart():
    """model=ideal has no NCCL plan: the group's calls run as one collective per (kind, reduction, root), started
    together (tests/test_nccl_coll_group_mixed_live.py checks their flows against each alone)."""
    dag = decompose(_mixed(), H100, AlgoOptions(model="ideal"))
    assert dag.flows and dag.choice is None
