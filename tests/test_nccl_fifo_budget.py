"""NCCL 2.19 - 2.21's plan budget: half the work FIFO, 64 Ki works / 2 = 32,768 a plan (enqueue.cc
`ncclLaunchPrepare`, `appendWorkElemColl`, `appendWorkElemP2p`, v2.19.4-1 .. v2.21.5-1; nccl/fifo_budget.py). Each
expected cut is worked out by hand in its docstring from NCCL's code; groups past 1024 calls run, no longer refused.
"""

from __future__ import annotations

import pytest

from phantora.collectives import Collective, decompose
from phantora.collectives.nccl import fifo_budget as F
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from tests.test_nccl_symmetric import H100, RANKS, opts

ONE_HOST = (0,) * 8


def test_the_order_of_one_host_pairs_step_k_with_its_send_to_plus_k_and_receive_from_minus_k():
    """init.cc: one node, delta 0 only, steps = 8 (8 local ranks): step s sends to local + s and receives from
    local - s. Two nodes of 8: node delta 0 then 1 (deltas 0, 2 - 0, 1, 2 - 1: the repeats dropped)."""
    assert F.order(ONE_HOST, 0) == [(s, (8 - s) % 8) for s in range(8)]
    two = F.order((0,) * 8 + (1,) * 8, 3)
    assert two[:8] == [((3 + s) % 8, (3 - s) % 8) for s in range(8)]
    assert two[8:] == [(8 + (3 + s) % 8, 8 + (3 - s) % 8) for s in range(8)]


def test_a_peers_channel_is_its_local_step_mirrored_over_the_p2p_channels():
    """channel.h: one node, base = the peer's local step; mirrorBits over 32 channels: 1 -> 16, 3 -> 24, 2 -> 8;
    part k adds k. A send to +1 and a receive from -1 share a base, so share channels."""
    assert F.p2p_channel(ONE_HOST, 0, 1, 0, F.SEND, 32) == 16
    assert F.p2p_channel(ONE_HOST, 0, 7, 0, F.RECV, 32) == 16
    assert F.p2p_channel(ONE_HOST, 0, 3, 2, F.SEND, 32) == 26
    assert F.p2p_channel(ONE_HOST, 5, 7, 0, F.SEND, 32) == 8


def test_a_sendrecv_ring_opens_one_work_a_call_and_part():
    """nccl-tests' ring on 8 one-host ranks: each call's receive from rank 7 meets the last call's receive from rank 7
    in its channel's work (one peer twice: a new work), and its send to rank 1 joins it. One part: a work a call, so
    32,768 receives fill the budget; the 32,768th call's send finds none left and goes to the next plan, which
    holds calls 32,767 .. 39,999: 7,233. Four parts: 4 works a call, 8,192 calls, each later plan one more (its
    first call counted in the plan before too); 8,191 calls fit one plan, 8,192 leave their last sends to a second."""
    assert F.nccl_tests_p2p_plans("send_recv", ONE_HOST, 40000, 1, 1, 32, 32) == [32768, 7233]
    assert F.nccl_tests_p2p_plans("send_recv", ONE_HOST, 40000, 4, 4, 32, 32) == [8192, 8193, 8194, 8195, 7236]
    assert F.nccl_tests_p2p_plans("send_recv", ONE_HOST, 8191, 4, 4, 32, 32) == [8191]
    assert F.nccl_tests_p2p_plans("send_recv", ONE_HOST, 8192, 4, 4, 32, 32) == [8192, 1]  # its last sends


def test_an_all_to_all_opens_a_work_for_each_step():
    """An all-to-all on 8 one-host ranks, one part a peer: step 0 (itself) clears fuseOk, and each of steps 1-7 is
    on its own channel (bases 1-7 mirrored) whose open work holds the last call's receive from the same peer: 8
    works a call, 4,096 calls a plan."""
    assert F.nccl_tests_p2p_plans("all_to_all", ONE_HOST, 8000, 1, 1, 32, 32) == [4096, 3905]
    assert F.nccl_tests_p2p_plans("all_to_all", ONE_HOST, 1024, 32, 32, 32, 32) == [1024]


def test_collectives_fill_the_channels_by_bytes_nine_elements_a_work():
    """2.20 - 2.21 (`addCBDCollToPlan`): 300,000 8-byte calls on 24 channels, maxBytesPerChannel 2,400,000 / 24 =
    100,000 bytes: 12,500 calls a channel, 1,389 works each (9 elements a work). 23 channels take 31,947 works; the
    24th gets 821 works, and once the last is open no budget is left (a task needs 1): 820 x 9 + 1 = 7,381 calls,
    294,881 in the plan."""
    assert F.coll_plans([(0, 8)] * 300000, 24) == [294881, 5119]
    assert F.coll_plans([(0, 8)] * 2000, 24) == [2000]


def test_2_19_calls_on_every_channel_open_a_work_every_nine():
    """2.19 (`addCollToPlan`): calls of nBid = 24 on 24 channels: after k calls 24 x ceil(k / 9) works; call k + 1
    is placed while 32,768 minus that is at least 24: ceil(k / 9) <= 1,364, so 12,277 calls a plan."""
    assert F.coll_plans_least([(0, 1 << 30, 64)] * 13000, 24) == [12277, 723]


def _run(coll: Collective, **env: str) -> tuple[float, dict]:
    dag = decompose(coll, H100, opts(**env))
    sim = FlowSimulator(H100)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1000, dag.choice or {}


def test_a_group_past_1024_collectives_runs_as_one_launch_on_2_21():
    """2.21, 2000 all-reduces of 8 B on 8 H100s (refused before, past 1024): one aggregate of 16,000 B, rated with
    numPipeOps 1 (2.20+): NCCL's Ring LL latency on one 8-GPU NVLink host, 15.0 us, once."""
    _, got = _run(Collective("all_reduce", RANKS, 8, "fp32", group_calls=2000), PHANTORA_NCCL_VERSION="2.21.5")
    assert (got["algorithm"], got["protocol"], got["model_lat_us"]) == ("Ring", "LL", 15.0)
    assert got["group_calls"] == 2000 and "plans" not in got


def test_a_sendrecv_group_past_the_budget_pays_a_launch_a_plan():
    """2.21, a send/recv pair of 8 B on 8 H100s (two ranks: steps 0 and 1, one channel, as the ring above): 2000
    calls are one plan, LL's base 6.6 us and 2000 steps of 0.6 us; 40,000 calls are two plans (32,768 and 7,233),
    two launches and 40,001 steps."""
    _, one = _run(Collective("send_recv", (0, 1), 8, "fp32", group_calls=2000), PHANTORA_NCCL_VERSION="2.21.5")
    assert one["model_lat_us"] == pytest.approx(6.6 + 2000 * 0.6)
    _, two = _run(Collective("send_recv", (0, 1), 8, "fp32", group_calls=40000), PHANTORA_NCCL_VERSION="2.21.5")
    assert two["plans"] == 2
    assert two["model_lat_us"] == pytest.approx(2 * 6.6 + 40001 * 0.6, abs=0.01)


def test_collectives_past_the_budget_are_refused_naming_it():
    """2.19, 13,000 all-reduces of 1 GiB: 12,277 a plan (above); several plans before 2.22 are refused in one line."""
    with pytest.raises(InputError, match="work FIFO budget .32768 works a plan, 12277 calls in the first"):
        decompose(
            Collective("all_reduce", RANKS, 1 << 30, "fp32", group_calls=13000),
            H100,
            opts(PHANTORA_NCCL_VERSION="2.19.4"),
        )
