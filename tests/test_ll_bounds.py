"""bench/bench_ll_bounds.py's bounds against NCCL's cost form (docs/validation.md, "LL misses bounded")."""

from __future__ import annotations

import pytest

from tests.script_modules import load

B = load("bench/bench_ll_bounds.py")

# NCCL's one-node ring LL constants (tuning.cc): base latency and NVLink latency per hop, µs.
BASE, HOP = 6.6, 0.6


def _ring(n: int, hops: int, nbytes: float, rate: float) -> float:
    """NCCL's cost form of a ring: base + hops x hop latency + bytes moved per rank at `rate` bytes/µs."""
    return BASE + hops * HOP + nbytes / rate


@pytest.mark.parametrize("n", [4, 8])
@pytest.mark.parametrize("size", [1 << 20, 2 << 20, 16 << 20])
def test_half_bound_holds_and_is_tight_at_the_fixed_part(n: int, size: int) -> None:
    rate = 141e3 / 2  # any rate: the bound does not depend on it
    moved = size * (n - 1) / n
    t_ar = _ring(n, 2 * (n - 1), 2 * moved, rate)
    t_half = _ring(n, n - 1, moved, rate)
    t_small = _ring(n, 2 * (n - 1), 8 * 2 * (n - 1) / n, rate)  # an 8-byte all-reduce: its hops and nothing more
    assert B.half_bound(t_ar, t_small) >= t_half
    assert B.half_bound(t_ar, t_small) - t_half == pytest.approx((n - 1) * HOP, abs=1e-3)
    assert B.half_bound(t_ar, BASE) == pytest.approx(t_half)


def test_half_bound_refuses_a_small_size_slower_than_the_size() -> None:
    with pytest.raises(ValueError, match="exceeds"):
        B.half_bound(20.0, 21.0)


def test_needed_is_the_15_percent_edge() -> None:
    # busbw error = published time / model time - 1; at the edge it is exactly +15%.
    assert 27.87 / B.needed(27.87) - 1 == pytest.approx(0.15)


def test_spikes_finds_only_isolated_rises() -> None:
    series = {1: 10.0, 2: 16.0, 4: 10.5, 8: 11.0, 16: 30.0, 32: 40.0}
    assert B.spikes(series) == [(2, 16.0, 5.5)]
