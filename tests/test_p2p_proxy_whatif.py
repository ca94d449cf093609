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
