"""bench/bench_p2p_proxy_whatif.py: its closed forms and its p2p cap (docs/validation.md, "Held-out tables")."""

from __future__ import annotations

import pytest

from phantora.collectives.nccl import proxy, shape
from tests.script_modules import load

W = load("bench/bench_p2p_proxy_whatif.py")


def test_cap_is_chunk_over_two_steps() -> None:
    # one relayed send and one receive a chunk: 131072 B / (2 x 0.6 us) = 109,226.7 B/us
    assert W.cap_gbs(128 << 10, 0.6) == pytest.approx(109.2267, rel=1e-5)
    assert W.cap_gbs(512 << 10, 0.6) == pytest.approx(4 * W.cap_gbs(128 << 10, 0.6))  # a 4x chunk, 4x the cap
    assert W.implied_step_us(45.87) == pytest.approx(131072 / (2 * 45870), rel=1e-9)
    assert W.cap_gbs(128 << 10, W.implied_step_us(45.87)) == pytest.approx(45.87)


def test_p2p_cap_binds_the_two_host_ring_and_is_undone() -> None:
    size = 256 << 20
    free = W.h100_ring(size)
    with W.p2p_cap(40.0):
        capped = W.h100_ring(size)
    assert shape._net_caps.__name__ == "_net_caps"  # the model's own again
    assert 0.97 * 40.0 < capped <= 40.0  # the cap, less the call's latency
    assert free == pytest.approx(W.h100_ring(size))  # the model again after the context
    assert free > 49.0  # the NIC's 50 GB/s, less the latency


def test_step_cost_is_restored() -> None:
    before = proxy.PROXY_STEP_US
    with W.step_cost(1.5):
        assert proxy.PROXY_STEP_US == 1.5
    assert proxy.PROXY_STEP_US == before


def test_turns_rate_is_the_step_time_closed_form() -> None:
    # n channels of c GB/s each: a 128 KiB step takes S / c + 2 (n - 1) x step, so the n move n S / that
    s, c, step = 128 << 10, 14.0, 0.6
    for n in (1, 2, 4):
        t_us = s / (c * 1000.0) + 2 * (n - 1) * step
        assert W.turns_rate(n * c, n, step) == pytest.approx(n * s / (t_us * 1000.0), rel=1e-12)
    assert W.turns_rate(14.0, 1, step) == 14.0  # one connection: NCCL's figure holds its own turns
    assert W.turns_rate(56.0, 4, step) == pytest.approx(40.45, abs=0.005)  # 4 x 128 KiB / 12.96 us


def test_turns_in_series_is_undone() -> None:
    with W.turns_in_series(0.6):
        assert shape._net_caps.__name__ == "patched"
    assert shape._net_caps.__name__ == "_net_caps"


def test_net_peer_channels_halve_with_the_ranks() -> None:
    # paths.cc: one channel per 14 GB/s of a 400G NIC, pow2Up (4), halved while 8-peer rounds need more than the 16
    # p2p channels of an 8-GPU B200 host: 4 up to 32 ranks, 2 at 64, 1 at 128
    assert [W.net_peer_channels(g, h)[0] for g, h in ((16, 2), (32, 4), (64, 8), (128, 16))] == [4, 4, 2, 1]
    assert W.net_peer_channels(16, 2)[1] == pytest.approx(14.0)  # B200's SM clock is the reference's


def test_depth_closed_forms() -> None:
    # 4 channels x 8 steps x 128 KiB = 4 MiB a NIC; at 50 GB/s: 4,194,304 B / 50,000 B/us = 83.886 us
    assert W.in_flight(4) == 4 << 20
    assert W.loop_us(W.in_flight(4), 50.0) == pytest.approx(83.886, abs=5e-4)
    # a ring's step is the 4 MiB Simple buffer over NCCL_STEPS: 2 channels hold 2 x 8 x 512 KiB = 8 MiB
    assert W.RING_STEP == 512 << 10
    assert W.in_flight(2, W.RING_STEP) == 8 << 20


def test_nic_rate_of_a_two_host_alltoall() -> None:
    # 16 GPUs on 2 hosts: algbw = busbw x 16 / 15, and 8 of each GPU's 16 blocks go to the other host
    t = W.read_table(W.data_dir() / "a100_16gpu_2node_hdr200assumed_alltoall_alcfsophia.csv")
    assert (t.gpus, t.nodes) == (16, 2)
    assert W.nic_rate(t, 39.93) == pytest.approx(39.93 * 16 / 15 * 8 / 16, rel=1e-12)
