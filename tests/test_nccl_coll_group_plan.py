"""A group's aggregates that NCCL keeps apart, scheduled as one plan: the channels dealt on from one aggregate to
the next, and every aggregate rated with numPipeOps from the whole group (enqueue.cc, `ncclPrepareTasks` and
`scheduleCollTasksToPlan`, v2.22.3-1 to v2.30.7-1; v2.19.4-1's opPerChannel). The expected parts are worked out by
hand in each docstring from NCCL's code, not read back from phantora's.
"""

from __future__ import annotations

import pytest

from phantora.collectives import Collective, decompose
from phantora.collectives.channel_shares import channel_shares, plan_parts
from phantora.collectives.decompose import group_aggregates
from phantora.collectives.nccl import coll_group
from phantora.collectives.options import resolve
from phantora.errors import InputError
from tests.test_nccl_symmetric import H100, RANKS, KiB, MiB, opts

V227 = {"PHANTORA_NCCL_VERSION": "2.27.3"}


def test_a_plans_second_aggregate_starts_where_the_first_stopped():
    """2.27, 8 ranks, two 1 MiB Ring LL all-reduce aggregates (24 channels each): traffic per byte 2 x 4 (LL), so
    8 MiB each; the plan's 24 channels get 16 MiB / 24 = 699,050 each; cells of 16 KiB / 8 = 2 KiB, 43 of them a
    channel (div_up(699,050, 16,384)). The first: 43 cells on channels 0-10, its last 39 on channel 11 (638,976 of
    traffic there); the second goes on on channel 11 with div_up(60,074, 16,384) = 4 cells, then 11 x 43 and 35 on
    channels 12-23. Dealt alone, each would start at channel 0."""
    task = ("all_reduce", "LL", MiB, 24)
    got = coll_group.deal_plan((2, 27), 8, [task, task], 24)
    assert got == [
        (0, (43 * 2048,) * 11 + (39 * 2048,)),
        (11, (4 * 2048,) + (43 * 2048,) * 11 + (35 * 2048,)),
    ]
    alone = coll_group.deal((2, 27), "all_reduce", "LL", 8, [MiB], 24, 24)
    assert alone is not None and alone[0][0] == 0


def test_small_aggregate_and_large_one_share_the_first_channel():
    """2.27: 3 x 8 KiB (one aggregate, Ring LL on 1 channel) and 1 MiB (Ring LL, 24): traffic 3 x 64 KiB + 8 MiB
    over min(27, 24) channels, 357,717 each: the three small calls (4 cells each) fill channel 0 to 196,608, the
    1 MiB call puts div_up(161,109, 16,384) = 10 cells there and 22 x 22 cells and 18 on channels 1-23. Through
    decompose the two aggregates' flows carry those parts: 24 KiB on one channel, and the large one's, where each
    dealt alone would give the small calls a channel each."""
    sizes = (8 * KiB,) * 3 + (MiB,)
    group = Collective("all_reduce", RANKS, sum(sizes), "bf16", group_sizes=sizes)
    parts = group_aggregates(group, H100, opts(**V227))
    assert parts is not None and [p.group_sizes or (p.nbytes,) for p in parts] == [(8 * KiB,) * 3, (MiB,)]
    resolved = [resolve(p, H100, opts(**V227))[0] for p in parts]
    assert [(o.algorithm, o.protocol, o.channels) for o in resolved] == [("ring", "LL", 1), ("ring", "LL", 24)]
    large = (10 * 2048,) + (22 * 2048,) * 22 + (18 * 2048,)
    assert plan_parts(parts, resolved, H100) == [(0, (3 * 8 * KiB,)), (0, large)]
    assert channel_shares(parts[0], H100, resolved[0]) == [8 * KiB] * 3  # alone: a channel each
    dag = decompose(group, H100, opts(**V227))
    assert dag.choice["group_calls"] == 4


def test_an_nvls_aggregate_is_dealt_apart_and_2_21_deals_none():
    """An NVLS aggregate is scheduled after the others from channel 0 on its own channels (collBins[.][nvls]): a
    64 KiB Ring LL and an 8 MiB NVLS Simple all-reduce (2.27) leave the ring's 64 KiB dealt as if alone (512 KiB
    of LL traffic over its 2 channels: 16 cells of 2 KiB, 32 KiB, on each); before 2.22 NCCL splits on the host:
    nothing is dealt."""
    sizes = (64 * KiB, 8 * MiB)
    group = Collective("all_reduce", RANKS, sum(sizes), "bf16", group_sizes=sizes)
    parts = group_aggregates(group, H100, opts(**V227))
    assert parts is not None
    resolved = [resolve(p, H100, opts(**V227))[0] for p in parts]
    assert [o.algorithm for o in resolved] == ["ring", "nvls"]
    got = plan_parts(parts, resolved, H100)
    assert got is not None and got[1] == (0, ())
    assert got[0] == (0, (32 * KiB, 32 * KiB)) and list(got[0][1]) == channel_shares(parts[0], H100, resolved[0])
    old = [resolve(p, H100, opts(PHANTORA_NCCL_VERSION="2.21.5"))[0] for p in parts]
    assert plan_parts(parts, old, H100) is None


def test_an_aggregate_dealt_from_channel_11_runs_channel_11s_ring_and_tree():
    """The two 1 MiB aggregates of 1 MiB fp32 + 1 MiB bf16 (2.27; dealt as in the first test): the second starts on
    NCCL channel 11, so its first channel runs the ring and tree NCCL's channel 11 runs (on 8 H100s: the search's
    chain 5, tree 0; its channel 12, chain 0 of tree 1), not channel 0's."""
    from phantora.collectives.decompose import _tree_of_channel, channel_chain
    from phantora.collectives.nccl import platform_of, settings, tree_channels

    o = opts(**V227)
    group = Collective("all_reduce", RANKS, 2 * MiB, "fp32", group_sizes=(MiB, MiB), group_dtypes=("fp32", "bf16"))
    parts = group_aggregates(group, H100, o)
    assert parts is not None
    resolved = [resolve(p, H100, o)[0] for p in parts]
    got = plan_parts(parts, resolved, H100)
    assert got is not None and [lo for lo, _ in got] == [0, 11]
    second = Collective(
        "all_reduce", RANKS, MiB, "bf16", plan_sizes=(MiB, MiB), dealt_parts=got[1][1], dealt_from=got[1][0]
    )
    st = settings(o)
    p = platform_of(H100, RANKS, st)
    assert [channel_chain(second, H100, o)(k) for k in (0, 1)] == [tree_channels.chain_of(p, st, c) for c in (11, 12)]
    assert [channel_chain(second, H100, o)(k) for k in (0, 1)] == [5, 0]
    assert [_tree_of_channel(second, H100, o)(k) for k in (0, 1)] == [(0, 5), (1, 0)]
    with pytest.raises(InputError, match="dealt_from"):
        Collective("all_reduce", RANKS, MiB, "bf16", dealt_from=3)


def test_every_aggregate_takes_numpipeops_from_the_groups_calls():
    """2.22+: nTasksPerChannel = DIVUP(the group's calls, comm->nChannels) rates every aggregate. 30 fp32 + 1 bf16
    8 KiB all-reduces on 8 H100s (24 channels): the lone bf16 call is rated with numPipeOps 2, so a ring counts
    its latency twice (2 x 15.0 us) and NCCL's tuner picks Tree LL (latCount DIVUP(2, 10) = 1), where the call
    alone runs Ring LL."""
    o = opts(**V227)
    sizes = (8 * KiB,) * 31
    types = ("fp32",) * 30 + ("bf16",)
    group = Collective("all_reduce", RANKS, sum(sizes), "fp32", group_sizes=sizes, group_dtypes=types)
    parts = group_aggregates(group, H100, o)
    assert parts is not None and parts[-1].dtype == "bf16" and parts[-1].plan_sizes == sizes
    lone = decompose(Collective("all_reduce", RANKS, 8 * KiB, "bf16"), H100, o).choice
    tree = decompose(Collective("all_reduce", RANKS, 8 * KiB, "bf16"), H100, opts(NCCL_ALGO="Tree", **V227)).choice
    assert lone["algorithm"] == "Ring" and lone["protocol"] == "LL"
    ring_twice = 2 * lone["model_lat_us"] + 8 * KiB / (lone["model_algbw_gbs"] * 1e3)
    assert tree["model_time_us"] < ring_twice
    got = decompose(parts[-1], H100, o).choice
    assert (got["algorithm"], got["protocol"]) == ("Tree", "LL")
    assert got["model_time_us"] == pytest.approx(tree["model_time_us"], abs=1e-3)


def test_pipe_ops_from_the_group_at_each_version():
    """numPipeOps, by hand: 2.22+ DIVUP(calls, channels) for an aggregate of one call too (31 calls, 24 channels:
    2); 2.20 - 2.21: 1; 2.19, ten 4 MiB calls on 8 ranks and 24 channels: alone their 40 MiB halve
    NCCL_AGG_CHANNEL_SIZE x 8 = 16 MiB to 1 MiB (24 MiB < 40 MiB), the 9 followers ask 4 channels each, 36 over
    24: 2; in a group of 1 GiB it stays 16 MiB, 9 channels asked: 1."""
    assert coll_group.pipe_ops((2, 27), (8 * KiB,), 31, 8, 24) == 2
    assert coll_group.pipe_ops((2, 21), (8 * KiB,) * 31, 31, 8, 24) == 1
    ten = (4 * MiB,) * 10
    assert coll_group.pipe_ops((2, 19), ten, 10, 8, 24) == 2
    assert coll_group.pipe_ops((2, 19), ten, 11, 8, 24, group_bytes=1 << 30) == 1


def test_plan_sizes_must_be_a_group_holding_the_aggregate():
    with pytest.raises(InputError, match="plan_sizes"):
        Collective("all_reduce", RANKS, 3 * KiB, "fp32", group_sizes=(KiB, 2 * KiB), plan_sizes=(KiB, KiB))
