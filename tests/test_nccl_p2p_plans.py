"""NCCL 2.22+'s plan budget for a group's p2p operations (enqueue.cc `scheduleP2pTasksToPlan`, `addWorkBatchToPlan`,
`ncclTestBudget`, v2.22.3-1 .. v2.30.7-1; nccl/p2p_plans.py). Closed forms: the kernel's 4 KiB arguments less their
32 B header hold (4096 - 32) / 16 = 254 work batches; before each operation the planner wants room for one new batch
on each of the peer's most channels (32 on an 8-H100 host: 2 x 16 NVLinks, pow2, at most the 32 p2p channels), so a
plan holds operations while its batches are at most 254 - 32 = 222 before the next. Plans launch one after another:
each the launch's base latency (LL 6.6 us, Simple 8.4) and, per operation to a peer it holds, a step (LL 0.6 us,
Simple 3.4 over NVLink), then the bytes at one call's rate; nccl-tests' host pays one more launch (4.26 us) a plan.
"""

from __future__ import annotations

import json
import math

import pytest

from phantora.collectives import Collective, decompose
from phantora.collectives.nccl.host_launch import HOST_CHANNEL_US, HOST_LAUNCH_US
from phantora.collectives.nccl.p2p_plans import BatchRules, batch_rules, pair_plans, plan_ops, plan_queues, resumes
from phantora.collectives.nccl.settings import settings_of
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from tests.test_nccl_symmetric import H100, RANKS, KiB, opts

BATCHES = (4096 - 32) // 16  # 254
MOST = 32  # a peer's most p2p channels on an 8-H100 host
V227 = {"PHANTORA_NCCL_VERSION": "2.27.3"}


def test_one_channel_operations_of_one_round_take_a_batch_each():
    """sendrecv's operations are all of one round: each opens a new batch on its channel. The plan takes the
    operation while its batches are at most 254 - 32, so 223 operations (batches 0 .. 222 before each)."""
    ops = [(1, (16,))] * 1000
    assert plan_ops(ops, MOST) == [223, 223, 223, 223, 108]
    four = [(1, (16, 17, 18, 19))] * 100  # four channels an operation: 4 batches each, (254 - 32) // 4 + 1 fit
    assert plan_ops(four, MOST) == [56, 44]


def test_rounds_share_a_channels_batch_up_to_eight_works():
    """2.22 - 2.28.3's rules (`BatchRules()`; later releases: the tests below). Works of different rounds share one
    batch on a channel, up to 8 (NCCL_MAX_DEV_WORK_P2P_PER_BATCH). 4 rounds
    on channel 0, pass after pass: a pass's works fill one batch and the next pass's first round opens another, so
    the plan ends after 222 passes and one operation (222 x 4 + 1). 9 rounds: any 8 in a row differ, so batches
    of 8 run across the passes: 222 x 8 + 1 operations."""
    four = [(r, (0,)) for _ in range(300) for r in range(4)]
    assert plan_ops(four, MOST)[0] == 222 * 4 + 1
    nine = [(r, (0,)) for _ in range(300) for r in range(9)]
    assert plan_ops(nine, MOST)[0] == 222 * 8 + 1


GROUPS = BatchRules(groups=True)  # 2.28.7 - 2.28.9, or 2.29.2+ with NCCL_P2P_EPOCH_ENABLE=0
EPOCHS = BatchRules(groups=True, epochs=True)  # 2.29.2+


def test_from_2_28_7_a_batch_holds_rounds_of_one_group_of_eight():
    """v2.28.7-1 also opens a batch where the channel's batch holds a round of another group of 8 (round // 8). Nine
    rounds on channel 0: rounds 0-7 fill a batch and round 8 opens one; the next pass's round 0 may not join round
    8's batch (2.28.3 let it), so 2 batches a pass, opened by round 0 (before it 2p batches in pass p) and round 8
    (2p + 1). Pass 111's round 0 goes in at 222, its round 1 finds 223: 111 x 9 + 1 operations. Rounds 6-9: 6 and 7
    share a batch, 8 and 9 another (2.28.3: one a pass, 222 x 4 + 1); pass 111's round 6 goes in at 222, round 7
    finds 223: 111 x 4 + 1."""
    nine = [(r, (0,)) for _ in range(300) for r in range(9)]
    assert plan_ops(nine, MOST, GROUPS)[0] == plan_ops(nine, MOST, EPOCHS)[0] == 111 * 9 + 1
    across = [(r, (0,)) for _ in range(300) for r in range(6, 10)]
    assert plan_ops(across, MOST)[0] == 222 * 4 + 1
    assert plan_ops(across, MOST, GROUPS)[0] == 111 * 4 + 1


# Rounds 0 and 1 on channels 0 and 1, swapped every other pass (an operation's channels may differ pass to pass).
SWAPPED = [op for p in range(300) for op in (((0, (0,)), (1, (1,))) if p % 2 == 0 else ((0, (1,)), (1, (0,))))]


def test_from_2_29_2_a_batch_holds_works_of_one_pass():
    """v2.29.2-1 opens a batch where the channel's batch is of another pass (`p2pEpoch`). `SWAPPED`: without it an
    odd pass's works join the even pass's batches (each channel's batch lacks that round), so only even passes open
    batches, 2 each (2p before pass 2p); the cut falls in pass 222: its round 0 at 222, its round 1 finds 223, so
    222 x 2 + 1 operations. With it every operation opens a batch: 223 (as one round's operations)."""
    assert plan_ops(SWAPPED, MOST)[0] == plan_ops(SWAPPED, MOST, GROUPS)[0] == 222 * 2 + 1
    assert plan_ops(SWAPPED, MOST, EPOCHS)[0] == 223
    queues = [[op[1] for op in SWAPPED if op[0] == r] for r in (0, 1)]  # the same sweeps through `plan_queues`
    for rules, held in ((GROUPS, 222 * 2 + 1), (EPOCHS, 223)):
        for resume in (True, False):
            flat = [i for row in plan_queues(queues, MOST, resume, rules) for i in row]
            assert flat.count(0) == held


def test_the_releases_batch_rules_and_nccl_p2p_epoch_enable():
    """enqueue.cc `addWorkBatchToPlan`: the group-of-8 test from v2.28.7-1 (not in v2.28.3-1), the epoch test from
    v2.29.2-1 under `ncclParamP2pEpochEnable()` (NCCL_PARAM default 1; 0 turns it off, other integers leave it on);
    a minor alone or patch 0 is its newest patch (2.28.9, 2.29.7)."""
    assert batch_rules((2, 27)) == batch_rules((2, 28, 3)) == batch_rules((2, 28, 3), False) == BatchRules()
    assert batch_rules((2, 28, 7)) == batch_rules((2, 28)) == batch_rules((2, 28, 9)) == GROUPS
    assert all(batch_rules(v) == EPOCHS for v in ((2, 29, 2), (2, 29), (2, 29, 0), (2, 29, 7), (2, 30, 7)))
    assert batch_rules((2, 29, 7), False) == GROUPS
    assert settings_of(()).p2p_epoch and settings_of((("NCCL_P2P_EPOCH_ENABLE", "2"),)).p2p_epoch
    assert not settings_of((("NCCL_P2P_EPOCH_ENABLE", "0"),)).p2p_epoch
    with pytest.raises(InputError, match="NCCL_P2P_EPOCH_ENABLE"):
        settings_of((("NCCL_P2P_EPOCH_ENABLE", "on"),))


# Three rounds of one rank on channels 0, 1, 2: rounds 0 and 2 with 300 operations each, round 1 with 2.
UNEVEN = [[(0,)] * 300, [(1,)] * 2, [(2,)] * 300]
# NCCL 2.29.7+ (resume at the cut round) and 2.22 - 2.29.3 (the next plan from round 0): round 0's, round 2's plans.
RESUMED = ([0] * 111 + [1] * 111 + [2] * 78, [0] * 110 + [1] * 112 + [2] * 78)
RESTARTED = ([0] * 111 + [1] * 112 + [2] * 77, [0] * 110 + [1] * 111 + [2] * 79)


def test_an_uneven_group_cut_mid_pass_resumes_from_2_29_7_and_restarts_before() -> None:
    """`UNEVEN`, NCCL's loop by hand (`for round in 0..nRanks-1`: each round's queue head, one new batch each since
    a round repeats on its channel, 223 operations a plan). Plan 0 both ways: passes 0-1 take 3 operations (6), passes
    2-109 two (216), then round 0's op 110: 223, so round 0 ops 0-110, round 2 ops 0-109; the cut falls at round 2's
    op 110. 2.29.7 (`*p2pRound` kept): plan 1 starts there, r2 110, r0 111, r2 111, ... 223 operations end with
    r2 221 (r2 110-221: 112, r0 111-221: 111), plan 2 the rest (r0 222-299: 78, r2 222-299: 78). 2.27 (`round=0`
    each call): plan 1 starts at round 0, whose head is already op 111: r0 111, r2 110, r0 112, ... 223 operations
    end with r0 222 (r0 111-222: 112, r2 110-220: 111); plan 2 again from round 0: r0 223-299 (77), r2 221-299 (79).
    Round 1's two operations are in plan 0 either way."""
    resumed, restarted = plan_queues(UNEVEN, MOST, True), plan_queues(UNEVEN, MOST, False)
    assert (resumed[0], resumed[2]) == RESUMED and resumed[1] == [0, 0]
    assert (restarted[0], restarted[2]) == RESTARTED and restarted[1] == [0, 0]


def test_a_live_rank_plans_its_queues_as_its_release_does() -> None:
    """`UNEVEN` as rank 0's operations on 3 ranks of one host: to itself (round 0), to rank 1 (round 1) and to rank
    2 (round 2). Rank 1 receives 2 operations (plan 0), rank 2 receives 300 alone (k // 223: plans 0 and 1, never
    later than rank 0's), so each operation runs in rank 0's plan."""
    chans = {(0, 0): tuple(UNEVEN[0]), (0, 1): tuple(UNEVEN[1]), (0, 2): tuple(UNEVEN[2])}
    for resume, (self_plans, far_plans) in ((True, RESUMED), (False, RESTARTED)):
        plans = pair_plans((0, 0, 0), chans, MOST, resume)
        assert plans == {(0, 0): tuple(self_plans), (0, 1): (0, 0), (0, 2): tuple(far_plans)}


def test_even_rounds_cut_alike_either_way() -> None:
    """Rounds of equal queues: after a cut at round c the restarted planner takes rounds 0..c-1's next operations,
    then c..: the same cyclic order of rounds, so the same operations a plan (all-to-all: `calls_per_plan`)."""
    queues = [[(r,)] * 100 for r in range(8)]
    flat = [i for row in plan_queues(queues, MOST, False) for i in row]
    counts = [flat.count(i) for i in range(4)]
    assert counts == plan_ops([(r, (r,)) for _ in range(100) for r in range(8)], MOST) == [223, 223, 223, 131]


def test_the_release_that_resumes_at_the_cut_round() -> None:
    """enqueue.cc: `for (int round=0; ...)` through v2.29.3-1, `for (; *p2pRound < nRanks; ...)` from v2.29.7-1; a
    minor alone or patch 0 is its newest patch."""
    assert not any(resumes(v) for v in ((2, 22, 3), (2, 27), (2, 28, 9), (2, 29, 2), (2, 29, 3)))
    assert all(resumes(v) for v in ((2, 29, 7), (2, 29), (2, 29, 0), (2, 30), (2, 30, 7)))


def _end_ns(coll: Collective) -> tuple[int, dict]:
    dag = decompose(coll, H100, opts(**V227))
    sim = FlowSimulator(H100)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()), dag.choice or {}


def test_a_sendrecv_group_past_the_budget_runs_as_plans_one_after_another():
    """2000 sendrecv calls of 8 B on 8 H100s (2.27): LL on one channel, 223 to a plan, so 9 plans; the group takes
    9 launches, 2000 LL steps and the bytes of 2000 calls (it was refused past 1024)."""
    one = _end_ns(Collective("send_recv", (0, 1), 8, "fp32"))[1]
    end, got = _end_ns(Collective("send_recv", (0, 1), 8, "fp32", group_calls=2000))
    plans = math.ceil(2000 / 223)
    assert (got["plans"], got["protocol"], got["channels"]) == (plans, "LL", 1)
    assert got["model_lat_us"] == pytest.approx(plans * 6.6 + 2000 * 0.6)
    per_call_us = 8 / (one["model_algbw_gbs"] * 1e3)  # a call's bytes at its rate
    assert end / 1000 == pytest.approx(plans * 6.6 + 2000 * 0.6 + 2000 * per_call_us, abs=0.2)


def test_an_all_to_all_group_cut_inside_a_pass_counts_that_pass_in_both_plans():
    """64 all-to-alls of 256 B (32 B a peer: LL, one channel) on 8 H100s: 8 operations a pass (itself too), 8 rounds
    on 8 different channels, so a batch each: 223 operations a plan, cut inside the 28th pass (ops 0-222: passes
    0-27), the next one inside the 56th (223-445: passes 27-55), the last 9 passes: 3 plans of 28 + 29 + 9 = 66
    passes, whose steps and bytes the group pays (2 more than 64: each cut pass's peer left over waits for the next
    plan)."""
    one = _end_ns(Collective("all_to_all", RANKS, 256, "fp32"))[1]
    end, got = _end_ns(Collective("all_to_all", RANKS, 256, "fp32", group_calls=64))
    assert (got["plans"], got["protocol"], got["channels"]) == (3, "LL", 1)
    per_call_us = 256 / (one["model_algbw_gbs"] * 1e3)  # a call's bytes at its rate
    assert got["model_time_us"] == pytest.approx(3 * 6.6 + 66 * 0.6 + 66 * per_call_us, abs=0.01)
    assert end / 1000 == pytest.approx(got["model_time_us"], abs=0.2)


def test_before_2_22_more_than_1024_calls_run_in_one_plan_while_the_work_fifo_holds_them():
    """2.21: 1025 all-to-alls of 1 KiB (128 B a peer, one part) open 8 works a call (tests/test_nccl_fifo_budget.py):
    8,200 of the 32,768 a plan, so one launch (refused before)."""
    got = decompose(
        Collective("all_to_all", RANKS, KiB, "fp32", group_calls=1025), H100, opts(PHANTORA_NCCL_VERSION="2.21.5")
    ).choice
    assert got is not None and got["group_calls"] == 1025 and "plans" not in got


def test_nccl_tests_charges_a_host_launch_a_plan(tmp_path, monkeypatch):
    """`sendrecv_perf -b 8 -e 8 -m 2000` (2.27): the first iteration starts after the host's launch, one call's
    (4.26 us and a work batch's 0.032) and 4.26 us for each of the 8 further plans, then takes the group's GPU time;
    the second, launched while the first ran, its GPU time alone."""
    from phantora.cli import main

    monkeypatch.setenv("PHANTORA_NCCL_VERSION", "2.27.3")
    argv = ["sendrecv_perf", "-b", "8", "-e", "8", "-m", "2000", "-n", "2", "-w", "0"]
    assert main(["nccl-tests", *argv, "--out", str(tmp_path)]) == 0
    size = json.loads((tmp_path / "results.json").read_text())["sizes"][0]
    choice = size["choice"]
    assert choice["plans"] == 9 and choice["group_calls"] == 2000
    host_us = HOST_LAUNCH_US + HOST_CHANNEL_US + 8 * HOST_LAUNCH_US
    gpu_us = choice["model_time_us"]
    assert [t / 1000 for t in size["iter_ns"]] == pytest.approx([host_us + gpu_us, gpu_us], abs=0.01)
