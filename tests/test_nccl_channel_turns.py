"""Aggregates of one NCCL plan that share a channel run their works there in turn (collectives/channel_turns.py).

A kernel's CTA runs its channel's work batches one after another (enqueue.cc `addWorkBatchToPlan`, device/common.h,
v2.22.3-1 .. v2.30.7-1), so where `scheduleCollTasksToPlan` deals two aggregates onto one channel the later one's
work there starts after the earlier one's: the group takes the first's latency, the second's less the launch's base
latency (tables `BASE_LAT`: the kernel is running already) and both bandwidth times, not the larger latency alone.
Expected figures come from each aggregate's choice alone (NCCL's model: `model_lat_us`, `fill_us`,
`model_algbw_gbs`) and NCCL's base latencies, not from the group's own output.
"""

from __future__ import annotations

import pytest

from phantora.collectives import Collective, decompose
from phantora.collectives.nccl import tables as T
from phantora.netsim.flow import FlowSimulator
from tests.test_nccl_symmetric import H100, RANKS, KiB, MiB, opts

V227 = {"PHANTORA_NCCL_VERSION": "2.27.3"}
RING_LL_BASE_US = T.BASE_LAT["ring"][T.PROTOCOLS.index("LL")]  # 6.6 us
PROPAGATION_NS = 200  # what the flow engine's paths add or the delays net out (an NVLink hop's propagation)


def _end_ns(coll: Collective) -> tuple[int, dict]:
    dag = decompose(coll, H100, opts(**V227))
    sim = FlowSimulator(H100)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()), dag.choice or {}


def _alone(nbytes: int, dtype: str) -> dict:
    return decompose(Collective("all_reduce", RANKS, nbytes, dtype), H100, opts(**V227)).choice or {}


def _lat_ns(c: dict) -> float:
    return 1000.0 * (c["model_lat_us"] + c.get("fill_us", 0.0))


def _bw_ns(c: dict, nbytes: int) -> float:
    return nbytes / c["model_algbw_gbs"]


def _group(sizes: tuple[int, int]) -> Collective:
    return Collective("all_reduce", RANKS, sum(sizes), "fp32", group_sizes=sizes, group_dtypes=("fp32", "bf16"))


def test_two_aggregates_on_the_same_channels_take_the_sum_of_their_times():
    """2 MiB fp32 + 2 MiB bf16 on 8 H100s under 2.27: each NVLS Simple on 16 channels, dealt apart from channel 0,
    so both run on channels 0-15. NCCL's base latency of NVLS is 0: the bf16 work pays its whole latency after the
    fp32 one, and the group ends at the sum of the two calls' times alone (latency, fill and bandwidth), not at
    one latency plus both bandwidth times (the aggregates side by side, before: 47.46 us)."""
    s = 2 * MiB
    a, b = _alone(s, "fp32"), _alone(s, "bf16")
    assert (a["algorithm"], b["algorithm"], a["channels"], b["channels"]) == ("NVLS", "NVLS", 16, 16)
    assert T.BASE_LAT["nvls"][T.PROTOCOLS.index("Simple")] == 0.0
    end, got = _end_ns(_group((s, s)))
    assert len(got["aggregates"]) == 2
    serial = _lat_ns(a) + _bw_ns(a, s) + _lat_ns(b) + _bw_ns(b, s)
    side_by_side = max(_lat_ns(a), _lat_ns(b)) + _bw_ns(a, s) + _bw_ns(b, s)
    assert end == pytest.approx(serial, abs=PROPAGATION_NS)
    assert end > side_by_side + 20_000


def test_a_channel_between_two_dealt_aggregates_adds_the_second_ones_steps():
    """1 MiB fp32 + 1 MiB bf16 under 2.27: two Ring LL aggregates dealt one after another over 24 channels, the fp32
    one on channels 0-11, the bf16 one from channel 11 on: channel 11 runs the fp32 work, then the bf16 one's ring
    steps (its latency less the 6.6 us launch), so the group takes 15.0 + (15.0 - 6.6) us of latency and both
    bandwidth times (before: 15.0 us of latency, 41.03 us in all)."""
    s = MiB
    a, b = _alone(s, "fp32"), _alone(s, "bf16")
    assert (a["algorithm"], a["protocol"], b["algorithm"], b["protocol"]) == ("Ring", "LL", "Ring", "LL")
    end, _ = _end_ns(_group((s, s)))
    expected = _lat_ns(a) + (_lat_ns(b) - 1000.0 * RING_LL_BASE_US) + _bw_ns(a, s) + _bw_ns(b, s)
    assert end == pytest.approx(expected, abs=PROPAGATION_NS)


def test_an_nvls_aggregate_after_a_ring_waits_for_the_rings_latency_on_the_channels_they_share():
    """2 MiB fp32 (NVLS Simple, channels 0-15) + 256 KiB bf16 (Ring LL, 8 channels): the ring is dealt first (the
    plan deals NVLS after the others), from channel 0, so NVLS's works on channels 0-7 start after the ring's
    latency; NVLS's base is 0, so its whole latency and fill follow."""
    big, small = 2 * MiB, 256 * KiB
    a, b = _alone(big, "fp32"), _alone(small, "bf16")
    assert (a["algorithm"], b["algorithm"], b["protocol"]) == ("NVLS", "Ring", "LL")
    end, _ = _end_ns(_group((big, small)))
    expected = _lat_ns(b) + _lat_ns(a) + _bw_ns(a, big) + _bw_ns(b, small)
    assert end == pytest.approx(expected, abs=PROPAGATION_NS)


def test_aggregates_on_channels_of_their_own_keep_one_latency():
    """64 KiB fp32 + 64 KiB bf16 (Ring LL, 2 channels each) are dealt onto channels 0-1 and 2-3: no channel in common,
    so the group ends at one latency plus both bandwidth times, as before."""
    s = 64 * KiB
    a, b = _alone(s, "fp32"), _alone(s, "bf16")
    end, _ = _end_ns(_group((s, s)))
    expected = max(_lat_ns(a), _lat_ns(b)) + _bw_ns(a, s) + _bw_ns(b, s)
    assert end == pytest.approx(expected, abs=PROPAGATION_NS)


def test_two_aggregates_of_one_kernel_on_a_shared_channel_run_in_turn():
    """64 KiB + 1 MiB fp32 all-reduces under 2.27: 16 x the traffic apart, so two aggregates (a run stops under 4 x its
    first), each Ring LL: one kernel. The plan deals them one after another, the 1 MiB one starting on the 64 KiB
    one's last channel, and a CTA runs a batch's works one after another (device/common.h `RunWorkBatch::run`), so
    the group takes the first's latency, the second's less the 6.6 us launch, and both bandwidth times (before: one
    latency, 28.83 us in all)."""
    small, big = 64 * KiB, MiB
    a, b = _alone(small, "fp32"), _alone(big, "fp32")
    assert (a["algorithm"], a["protocol"], b["algorithm"], b["protocol"]) == ("Ring", "LL", "Ring", "LL")
    end, got = _end_ns(Collective("all_reduce", RANKS, small + big, "fp32", group_sizes=(small, big)))
    assert len(got["aggregates"]) == 2
    expected = _lat_ns(a) + (_lat_ns(b) - 1000.0 * RING_LL_BASE_US) + _bw_ns(a, small) + _bw_ns(b, big)
    assert end == pytest.approx(expected, abs=PROPAGATION_NS)


@pytest.mark.ns3
def test_two_aggregates_of_one_kernel_run_in_turn_through_ns3_too():
    """The same group through ns-3 ends within 1 % of the flow network at the packets' goodput."""
    from tests.engine_pair import flow_and_ns3_end_ns

    coll = Collective("all_reduce", RANKS, 64 * KiB + MiB, "fp32", group_sizes=(64 * KiB, MiB))
    ends = flow_and_ns3_end_ns(H100, decompose(coll, H100, opts(**V227)).flows)
    assert ends["ns3"] == pytest.approx(ends["flow"], rel=0.01)
