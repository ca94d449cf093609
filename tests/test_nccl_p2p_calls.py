"""nccl-tests' `-m N` of alltoall_perf and sendrecv_perf: N equal p2p calls in one NCCL group, one launch, each
peer's N operations one after another on one call's channels (enqueue.cc `scheduleP2pTasksToPlan`, which passes
over its rounds until every peer's queue is empty; nccl/p2p_calls.py). Closed forms from NCCL's latency table
(tuning.cc: ring base latency LL 6.6 / Simple 8.4 us; a step over NVLink LL 0.6 / Simple 3.4 us, over the network
Simple 14 us) and the p2p model's rates."""

from __future__ import annotations

import json

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import choose, runs_as_one
from phantora.netsim.flow import FlowSimulator
from tests.test_nccl_multinode import hosts
from tests.test_nccl_symmetric import H100, RANKS, KiB, MiB, opts


def _end_us(coll: Collective, topo=H100) -> tuple[float, dict]:
    dag = decompose(coll, topo, opts())
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1000, dag.choice or {}


def test_a_small_all_to_all_group_costs_one_launch_and_four_operations_steps():
    """8 H100s, 4 all-to-alls of 8 KiB (1 KiB a peer, LL on one channel) in one group: one launch (6.6 us) and 4
    LL steps over NVLink (4 x 0.6 us) before the 4 operations' bytes at one call's peer rate, 9.0 us of latency
    where 4 calls one after another pay 4 x 7.2. The simulated group ends at that latency plus 4 KiB a peer at the
    peer's rate (within 2 %), under half of 4 calls' time."""
    one_us, one = _end_us(Collective("all_to_all", RANKS, 8 * KiB, "fp32"))
    group_us, grouped = _end_us(Collective("all_to_all", RANKS, 8 * KiB, "fp32", group_calls=4))
    assert (one["protocol"], one["model_lat_us"]) == ("LL", pytest.approx(6.6 + 0.6))
    assert (grouped["protocol"], grouped["channels"]) == ("LL", one["channels"])
    assert grouped["model_lat_us"] == pytest.approx(6.6 + 4 * 0.6)
    assert grouped["group_calls"] == 4
    per_op_us = KiB / (one["peer_bw_gbs"] * 1e3)
    assert one_us == pytest.approx(7.2 + per_op_us, rel=0.02)
    assert group_us == pytest.approx(9.0 + 4 * per_op_us, rel=0.02)
    assert group_us < 0.5 * 4 * one_us


def test_each_operation_takes_the_protocol_and_channels_of_its_own_bytes():
    """4 all-to-alls of 64 KiB (8 KiB a peer: LL, at most 16 KiB a channel) in one group run LL on one call's
    channels, though the 32 KiB each peer gets in all would run Simple as one call (a 256 KiB all-to-all)."""
    whole = choose(Collective("all_to_all", RANKS, 256 * KiB, "fp32"), H100, AlgoOptions())
    grouped = choose(Collective("all_to_all", RANKS, 64 * KiB, "fp32", group_calls=4), H100, AlgoOptions())
    one = choose(Collective("all_to_all", RANKS, 64 * KiB, "fp32"), H100, AlgoOptions())
    assert whole is not None and grouped is not None and one is not None
    assert whole.protocol == "Simple"
    assert (grouped.protocol, grouped.channels) == ("LL", one.channels)


def test_a_large_all_to_all_group_moves_its_total_at_the_bus_bandwidth():
    """4 all-to-alls of 256 MiB in one group on 8 H100s: the latency is lost in the bytes, so the group moves its
    1 GiB at the bus bandwidth ((n - 1) / n x bytes over the time) of one 256 MiB call's model (its channels and
    rate, (n - 1) / n x its algorithm bandwidth), within 1 %, and in less than 4 calls one after another."""
    factor = 7 / 8
    one_us, one = _end_us(Collective("all_to_all", RANKS, 256 * MiB, "fp32"))
    group_us, grouped = _end_us(Collective("all_to_all", RANKS, 256 * MiB, "fp32", group_calls=4))
    assert grouped["channels"] == one["channels"]
    assert factor * 1024 * MiB / group_us / 1e3 == pytest.approx(factor * one["model_algbw_gbs"], rel=0.01)
    assert group_us < 4 * one_us


def test_across_nodes_each_operation_posts_its_proxy_ops():
    """2 hosts of 8 H100s (400G NICs), 4 all-to-alls of 16 MiB in one group: Simple, one launch (8.4 us), and each
    operation a network step (14 us) and the proxy's ops, 2 per part for each of the 8 remote peers at 1 us
    (Intel hosts), as one call alone pays them once."""
    topo, ranks = hosts(2), tuple(range(16))
    one = choose(Collective("all_to_all", ranks, 16 * MiB, "fp32"), topo, AlgoOptions())
    grouped = choose(Collective("all_to_all", ranks, 16 * MiB, "fp32", group_calls=4), topo, AlgoOptions())
    assert one is not None and grouped is not None
    per_op = 14.0 + 2 * 8 * one.channels * 1.0
    assert (one.protocol, one.lat_us) == ("Simple", pytest.approx(8.4 + per_op))
    assert grouped.lat_us == pytest.approx(8.4 + 4 * per_op)
    assert grouped.time_us - grouped.lat_us == pytest.approx(4 * (one.time_us - one.lat_us))


def test_outside_nccls_model_the_calls_run_one_after_another():
    """The ideal model's pairwise all-to-all has no NCCL group: -m's calls run call after call."""
    coll = Collective("all_to_all", RANKS, 8 * KiB, "fp32", group_calls=4)
    assert runs_as_one(coll, H100, AlgoOptions())
    assert not runs_as_one(coll, H100, AlgoOptions(model="ideal"))
    assert not runs_as_one(coll, H100, AlgoOptions(algorithm="pairwise"))


def test_more_than_1024_calls_in_one_group_run_as_one_launch_before_2_22():
    """2.19 - 2.21 hold a group in one plan while half the work FIFO holds its works (fifo_budget.py): 1025
    all-to-alls of 1 KiB on 8 H100s, 8 works a call, one launch: LL's 6.6 us once and a 0.6 us step a call."""
    got = decompose(
        Collective("all_to_all", RANKS, KiB, "fp32", group_calls=1025), H100, opts(PHANTORA_NCCL_VERSION="2.21.5")
    ).choice
    assert got is not None and "plans" not in got
    assert got["model_lat_us"] == pytest.approx(6.6 + 1025 * 0.6)


def _table(argv: list[str], out) -> list[dict]:
    from phantora.cli import main

    assert main(["nccl-tests", *argv, "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())["sizes"]


@pytest.mark.parametrize("test", ["alltoall_perf", "sendrecv_perf"])
def test_nccl_tests_m_prints_the_groups_time_per_call(tmp_path, test):
    """`-m 4` at 8 KiB on 8 H100s: one launch for the four calls (LL: 6.6 + 4 x 0.6 us, and 4 operations' bytes a
    peer), so a call's printed time is about a quarter of the group's, under half of `-m 1`'s."""
    argv = [test, "-b", "8K", "-e", "8K", "-n", "20", "-w", "0"]
    four = _table([*argv, "-m", "4"], tmp_path / "m4")[0]
    one = _table(argv, tmp_path / "m1")[0]
    assert four["choice"]["group_calls"] == 4
    assert four["choice"]["model_lat_us"] == pytest.approx(6.6 + 4 * 0.6)
    assert four["time_us"] < 0.5 * one["time_us"]
    per_op_us = one["choice"]["model_time_us"] - one["choice"]["model_lat_us"]
    assert four["time_us"] == pytest.approx((9.0 + 4 * per_op_us) / 4, rel=0.1)


@pytest.mark.ns3
@pytest.mark.parametrize("nbytes", [64 * KiB, 4 * MiB])
def test_groups_take_the_same_time_through_ns3(ns3_lib, nbytes):
    """A group of 4 all-to-alls on an idle 8-H100 host through both engines: every flow's bytes, and ns-3's end
    within 6 % of the flow network's at the packets' goodput."""
    from tests.engine_pair import flow_and_ns3_end_ns

    dag = decompose(Collective("all_to_all", RANKS, nbytes, "fp32", group_calls=4), H100, opts())
    times = flow_and_ns3_end_ns(H100, dag.flows)
    assert times["ns3"] == pytest.approx(times["flow"], rel=0.06)
