"""Several legacy collectives in one NCCL group (nccl-tests' -m), against NCCL's scheduling rules restated by hand.

enqueue.cc (v2.19.4-1 to v2.30.7-1): a group's calls of one (function, reduction, type) are aggregated, the tuner
picks one algorithm and protocol for the aggregate on its summed bytes, and every call runs in the one plan (one
kernel launch), NCCL 2.22+ dealing the calls' traffic onto the channels one after another. The expected figures
below are worked out in each docstring from NCCL's code, not read back from phantora's.
"""

from __future__ import annotations

import json

import pytest

from phantora.collectives import Collective, decompose
from phantora.collectives.nccl import channel_split, coll_group
from phantora.errors import InputError
from phantora.netsim.flow import FlowSimulator
from tests.test_nccl_symmetric import H100, RANKS, KiB, MiB, opts


def _end_us(coll: Collective, **env: str) -> tuple[float, dict]:
    dag = decompose(coll, H100, opts(**env))
    sim = FlowSimulator(H100)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()) / 1000, dag.choice or {}


def test_small_calls_each_take_a_channel_of_their_own():
    """2.30, 4 all-reduces of 8 KiB on 8 ranks, Simple, the aggregate's nMaxChannels 1 of 24: traffic 2 B a byte,
    a cell 32 KiB / 2 = 16 KiB, each call counts max(32 KiB, 16 KiB) of traffic, so the plan's 128 KiB over
    min(4 x 1, 24) = 4 channels is a 32 KiB budget a channel. A call is one cell (8 KiB less than a cell) whose
    32 KiB of traffic fills its channel: the next call starts on the next channel."""
    got = coll_group.deal((2, 30), "all_reduce", "Simple", 8, [8 * KiB] * 4, 1, 24)
    assert got == [(c, (8 * KiB,)) for c in range(4)]


def test_two_large_calls_split_the_channels_and_share_one():
    """2.30, 2 all-reduces of 64 MiB, Simple, nMaxChannels 24 of 24: 256 MiB of traffic over min(48, 24) = 24
    channels, a budget of divUp(268435456 / 24 = 11184810, 16) x 16 = 11184816 B, 342 cells of 32 KiB traffic a
    channel (divUp). Call 1: 4096 cells, lo 342, mid (4096 - 342) // 342 = 10, hi 3754 - 3420 = 334: channels 0-11,
    its hi leaving 334 x 32 KiB = 10944512 B of channel 11's budget used. Call 2: lo divUp(11184816 - 10944512,
    32768) = 8 cells on channel 11, then 11 mid of 342 and hi 4088 - 3762 = 326: channels 11-23."""
    cell = 16 * KiB
    got = coll_group.deal((2, 30), "all_reduce", "Simple", 8, [64 * MiB] * 2, 24, 24)
    assert got == [
        (0, (342 * cell,) * 11 + (334 * cell,)),
        (11, (8 * cell,) + (342 * cell,) * 11 + (326 * cell,)),
    ]
    assert coll_group.channel_bytes(got)[11] == (334 + 8) * cell


def test_2_22_deals_16_byte_cells_without_a_least_traffic_per_call():
    """2.22: 16-byte cells, the calls' traffic summed as it is (no 16 KiB floor), a budget of at least 512 B:
    4 all-reduces of 8 KiB, nMaxChannels 1 of 24: 64 KiB over 4 channels, 16 KiB a channel = one call's 8 KiB x 2,
    so again a channel a call."""
    got = coll_group.deal((2, 22), "all_reduce", "Simple", 8, [8 * KiB] * 4, 1, 24)
    assert got == [(c, (8 * KiB,)) for c in range(4)]
    assert coll_group.deal((2, 21), "all_reduce", "Simple", 8, [8 * KiB] * 4, 1, 24) is None


@pytest.mark.parametrize("version", [(2, 22), (2, 23), (2, 26), (2, 29), (2, 30)])
@pytest.mark.parametrize("proto", ["LL", "Simple"])
@pytest.mark.parametrize("count", [4, 5000, 64 * KiB + 8, 3 * MiB, 64 * MiB])
def test_a_group_of_one_deals_as_a_lone_call(version, proto, count):
    """One task alone in its plan: the deal is `channel_split.split`'s parts (the same enqueue.cc loop, channel 0)."""
    got = coll_group.deal(version, "all_reduce", proto, 8, [count], 16, 24)
    assert got is not None and got[0][0] == 0
    assert got[0][1] == channel_split.split(version, "all_reduce", proto, 8, count, 16, 24)


def test_aggregates_within_four_times_from_2_22_and_consecutive_before():
    """2.22+: sorted, binned by (function, reduction, type), each bin smallest first, a run under 4 x its first's
    traffic: all-reduces of 1 MiB, 64 KiB, 100 KiB, 8 MiB -> [64 KiB, 100 KiB] (under 256 KiB), [1 MiB] (8 MiB is
    not under 4 MiB), [8 MiB]. Before 2.22 consecutive calls of one (function, reduction, type) are one aggregate,
    whatever their sizes; an all-gather between two all-reduces splits them."""
    calls = [("all_reduce", "sum", "bf16", s) for s in (1 * MiB, 64 * KiB, 100 * KiB, 8 * MiB)]
    assert coll_group.aggregates((2, 22), calls) == [[1, 2], [0], [3]]
    assert coll_group.aggregates((2, 21), calls) == [[0, 1, 2, 3]]
    mixed = [("all_reduce", "sum", "bf16", MiB), ("all_gather", "sum", "bf16", MiB), ("all_reduce", "sum", "bf16", MiB)]
    assert coll_group.aggregates((2, 19), mixed) == [[0], [1], [2]]
    assert {frozenset(a) for a in coll_group.aggregates((2, 30), mixed)} == {frozenset({0, 2}), frozenset({1})}
    other_type = [("all_reduce", "sum", "bf16", MiB), ("all_reduce", "sum", "fp32", MiB)]
    assert len(coll_group.aggregates((2, 30), other_type)) == 2


def test_pipe_ops_and_the_latency_they_charge():
    """numPipeOps: 2.22+ divUp(tasks, comm channels) (48 on 16: 3); 2.20-2.21 1; 2.19 opPerChannel: 64 calls of
    1 MiB on 8 ranks and 16 channels: bytePerChannel 16 MiB halved while 64 MiB < it x 16, so 4 MiB; the 63 calls
    after the first ask divUp(1 MiB, 4 MiB) = 1 channel each, 63 over min(16, 63): 4. 4 x 8 KiB there: 2 KiB a
    channel, 3 x 4 = 12 channels over 12: 1. latCount: a ring's numPipeOps, the others' over a batch's works (9
    before 2.22, 16 at 2.22, 10 at 2.23-2.29, 7 at 2.30)."""
    assert coll_group.pipe_ops((2, 30), [8 * KiB] * 48, 48, 8, 16) == 3
    assert coll_group.pipe_ops((2, 21), [8 * KiB] * 48, 48, 8, 16) == 1
    assert coll_group.pipe_ops((2, 19), [MiB] * 64, 64, 8, 16) == 4
    assert coll_group.pipe_ops((2, 19), [8 * KiB] * 4, 4, 8, 16) == 1
    assert coll_group.lat_count((2, 30), "ring", 3) == 3
    assert [coll_group.lat_count(v, "tree", 17) for v in ((2, 19), (2, 22), (2, 25), (2, 30))] == [2, 2, 2, 3]


def test_small_all_reduces_cost_one_latency_and_their_summed_bytes():
    """8 H100s, 4 all-reduces of 8 KiB in one group: NCCL picks Ring LL for the 32 KiB aggregate, as for one
    8 KiB call, so the group costs one call's latency L plus 4 calls' bytes at the algorithm bandwidth B
    (L + 4 x 8 KiB / B), where 4 calls one after another cost 4 (L + 8 KiB / B)."""
    one_us, one = _end_us(Collective("all_reduce", RANKS, 8 * KiB, "fp32"))
    group_us, grouped = _end_us(Collective("all_reduce", RANKS, 8 * KiB, "fp32", group_calls=4))
    assert (grouped["algorithm"], grouped["protocol"]) == (one["algorithm"], one["protocol"]) == ("Ring", "LL")
    assert grouped["group_calls"] == 4
    lat_us = one["model_lat_us"] + one.get("fill_us", 0.0)
    per_call_us = 8 * KiB / (one["model_algbw_gbs"] * 1e3)
    assert one_us == pytest.approx(lat_us + per_call_us, rel=0.01)
    assert group_us == pytest.approx(lat_us + 4 * per_call_us, rel=0.01)
    assert group_us < 0.3 * 4 * one_us


def test_large_all_reduces_move_their_total_at_the_bus_bandwidth():
    """4 all-reduces of 256 MiB in one group on 8 H100s: the latency is lost in the bytes, so the group moves its
    1 GiB at the bus bandwidth of a 1 GiB call (2 (n - 1) / n x bytes over the time, within 1 %), not at four
    256 MiB calls' one after another (each with its own latency and NCCL's lower rate for the smaller size)."""
    factor = 2 * 7 / 8
    one_us, _ = _end_us(Collective("all_reduce", RANKS, 256 * MiB, "fp32"))
    whole_us, whole = _end_us(Collective("all_reduce", RANKS, 1024 * MiB, "fp32"))
    group_us, grouped = _end_us(Collective("all_reduce", RANKS, 256 * MiB, "fp32", group_calls=4))
    assert grouped["group_calls"] == 4 and grouped["algorithm"] == whole["algorithm"]
    busbw = factor * 1024 * MiB / group_us
    assert busbw == pytest.approx(factor * 1024 * MiB / whole_us, rel=0.01)
    assert group_us < 4 * one_us


def test_the_tuner_picks_on_the_aggregate():
    """1 MiB all-reduces on 8 H100s: alone Ring LL (NCCL 2.30's tuner); 4 of them in a group are rated as 4 MiB,
    where NVLS Simple wins: the group records NVLS and the 4 MiB call's channels."""
    _, alone = _end_us(Collective("all_reduce", RANKS, MiB, "fp32"))
    _, four = _end_us(Collective("all_reduce", RANKS, 4 * MiB, "fp32"))
    _, grouped = _end_us(Collective("all_reduce", RANKS, MiB, "fp32", group_calls=4))
    assert (alone["algorithm"], alone["protocol"]) == ("Ring", "LL")
    assert (grouped["algorithm"], grouped["protocol"], grouped["channels"]) == (
        four["algorithm"],
        four["protocol"],
        four["channels"],
    )
    assert grouped["algorithm"] == "NVLS"


def test_more_tasks_than_channels_charge_a_rings_latency_per_pipelined_op():
    """NCCL_MAX_NCHANNELS=2, NCCL_ALGO=Ring, NCCL_PROTO=LL: 8 calls of 1 KiB on 2 channels, numPipeOps
    divUp(8, 2) = 4, so the ring's latency counts 4 times (ncclTopoGetAlgoTime); the bandwidth term stays the
    aggregate's 8 KiB."""
    env = {"NCCL_MAX_NCHANNELS": "2", "NCCL_ALGO": "Ring", "NCCL_PROTO": "LL"}
    _, total = _end_us(Collective("all_reduce", RANKS, 8 * KiB, "fp32"), **env)
    _, grouped = _end_us(Collective("all_reduce", RANKS, KiB, "fp32", group_calls=8), **env)
    lat = total["model_lat_us"]
    assert grouped["model_lat_us"] == pytest.approx(4 * lat, abs=2e-3)
    assert grouped["model_time_us"] == pytest.approx(total["model_time_us"] + 3 * lat, abs=2e-3)


def test_too_many_calls_in_one_group_are_refused_in_one_line():
    with pytest.raises(InputError, match="not modelled"):
        decompose(Collective("all_reduce", RANKS, KiB, "fp32", group_calls=1025), H100, opts())


def _table(argv: list[str], out) -> list[dict]:
    from phantora.cli import main

    assert main(["nccl-tests", *argv, "--out", str(out)]) == 0
    return json.loads((out / "results.json").read_text())["sizes"]


def test_nccl_tests_m_prints_the_groups_time_per_call(tmp_path):
    """`all_reduce_perf -m 4` on 8 H100s at 8 KiB: one launch for the four calls, so a call's printed time is the
    group's L + 4 S / B over 4 (the host's one launch a group, 4.26 us, hides behind the GPUs' time but for the
    first of the 20 iterations), well under `-m 1`'s L + S / B."""
    argv = ["all_reduce_perf", "-b", "8K", "-e", "8K", "-n", "20", "-w", "0"]
    four = _table([*argv, "-m", "4"], tmp_path / "m4")[0]
    one = _table(argv, tmp_path / "m1")[0]
    c = one["choice"]
    lat_us = c["model_lat_us"] + c.get("fill_us", 0.0)
    per_call_us = 8 * KiB / (c["model_algbw_gbs"] * 1e3)
    assert four["choice"]["group_calls"] == 4
    assert four["time_us"] < 0.5 * one["time_us"]
    assert four["time_us"] == pytest.approx((lat_us + 4 * per_call_us) / 4, rel=0.05)
