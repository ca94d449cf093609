"""The A100 protocol kernels' achieved rates (phantora/collectives/nccl/proto_rate.py) against closed forms: they
time the A100's LL and LL128 all-reduce, NCCL's ratings still choose, and other collectives and GPUs without a
recorded rate run at NCCL's rating."""

from __future__ import annotations

import pytest

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl import platform_of, proto_rate, tuning
from phantora.collectives.nccl.settings import nccl_env, settings_from_env
from phantora.collectives.nccl.tuning import costs, select
from phantora.netsim.flow import FlowSimulator
from phantora.topology import dgx_host

MiB = 1 << 20
RING_8 = 8 / 14  # an 8-rank ring all-reduce's algorithm over bus bandwidth: n / 2(n-1)
LL128_RING_LAT_US = 14.0 + 14 * 1.9  # NCCL's LL128 ring base latency plus 2(n-1) NVLink steps
LL_RING_LAT_US = 6.6 + 14 * 0.6


def _time_ns(topo, size: int, **env: str) -> tuple[float, dict]:
    """One all-reduce over the host's 8 GPUs on an idle flow network: its time (ns) and NCCL's choice."""
    dag = decompose(Collective("all_reduce", tuple(range(8)), size, "fp32"), topo, AlgoOptions(nccl_env=nccl_env(env)))
    sim = FlowSimulator(topo)
    sim.submit(dag.flows, at=0)
    return max(c.end_ns for c in sim.drain()), dag.choice or {}


@pytest.mark.parametrize("size", [4 * MiB, 8 * MiB, 16 * MiB])
def test_a100_ll128_all_reduce_is_nccls_latency_plus_bytes_at_the_fitted_rate(size):
    """8 A100s, NCCL 2.30: LL128 ring, 40.6 µs plus the bytes at the fitted bus rate x 8/14 (not NCCL's 220.8)."""
    rate = proto_rate.achieved_busbw("ampere", "LL128")
    assert rate is not None and rate < 0.92 * 240  # below NCCL's own LL128 rating of an 8-GPU A100
    t, choice = _time_ns(dgx_host(gpu="a100"), size)
    assert (choice["algorithm"], choice["protocol"], choice["channels"]) == ("Ring", "LL128", 24)
    expected_us = LL128_RING_LAT_US + size / (1000 * rate * RING_8)
    assert t / 1e3 == pytest.approx(expected_us, rel=0.01)


def test_a100_ll_all_reduce_runs_at_the_fitted_ll_rate():
    """1 MiB on 8 A100s runs the ring LL: 15 µs plus the bytes at the fitted LL bus rate x 8/14."""
    rate = proto_rate.achieved_busbw("ampere", "LL")
    assert rate is not None and rate < 87.7  # below NCCL's Ampere llMaxBw
    t, choice = _time_ns(dgx_host(gpu="a100"), MiB)
    assert (choice["algorithm"], choice["protocol"]) == ("Ring", "LL")
    assert t / 1e3 == pytest.approx(LL_RING_LAT_US + MiB / (1000 * rate * RING_8), rel=0.01)


def test_the_rates_time_the_protocol_but_ncclss_ratings_choose_it():
    """With and without the achieved rates, NCCL's choice is the same at every size from 4 KiB to 1 GiB."""
    p = platform_of(dgx_host(gpu="a100"), tuple(range(8)))
    st = settings_from_env({})
    sizes = [1 << k for k in range(12, 31)]
    with_rates = [select("all_reduce", p, st, s) for s in sizes]
    saved = dict(proto_rate.ACHIEVED_BUSBW)
    try:
        proto_rate.ACHIEVED_BUSBW.clear()
        tuning.select.cache_clear()
        without = [select("all_reduce", p, st, s) for s in sizes]
    finally:
        proto_rate.ACHIEVED_BUSBW.update(saved)
        tuning.select.cache_clear()
    picked = [(c.algorithm, c.protocol, c.channels) for c in with_rates if c]
    assert picked == [(c.algorithm, c.protocol, c.channels) for c in without if c]
    assert {c.protocol for c in with_rates if c} == {"LL", "LL128", "Simple"}  # every protocol was exercised


@pytest.mark.parametrize("gpu", ["h100", "h200", "b200"])
def test_generations_without_a_rate_run_at_nccls_rating(gpu):
    """H100, H200, B200: no achieved rate is recorded, so the ring LL and LL128 run at NCCL's own rating."""
    assert all(
        proto_rate.achieved_busbw(a, proto) is None for a in ("hopper", "blackwell") for proto in ("LL", "LL128")
    )
    p = platform_of(dgx_host(gpu=gpu), tuple(range(8)))
    st = settings_from_env({"NCCL_ALGO": "Ring"})
    rating = {c.protocol: c.algbw for c in costs("all_reduce", p, st) if c.algorithm == "ring"}
    for proto, size in (("LL", 256 * 1024), ("LL128", 8 * MiB)):
        forced = settings_from_env({"NCCL_ALGO": "Ring", "NCCL_PROTO": proto})
        choice = select("all_reduce", p, forced, size)
        assert choice is not None and choice.protocol == proto
        assert choice.algbw == pytest.approx(rating[proto])


def test_a100_all_gather_and_reduce_scatter_keep_nccls_rating():
    """The rates were measured on all-reduces; an A100 all-gather (whose two-host LL128 curve grows at 156-203 GB/s
    busbw, above the all-reduce's) and reduce-scatter (no A100 table) keep NCCL's LL128 rating."""
    p = platform_of(dgx_host(gpu="a100"), tuple(range(8)))
    st = settings_from_env({"NCCL_PROTO": "LL128"})
    for kind in ("all_gather", "reduce_scatter"):
        rating = next(c.algbw for c in costs(kind, p, st) if c.algorithm == "ring")
        choice = select(kind, p, st, 8 * MiB)
        assert choice is not None and (choice.algorithm, choice.protocol) == ("ring", "LL128")
        assert choice.algbw == pytest.approx(rating)
    rate = proto_rate.achieved_busbw("ampere", "LL128")
    assert rate is not None and rate * 8 / 7 < rating  # the all-reduce's rate would have bound them


def test_more_ctas_than_nccls_default_raise_the_rate_with_them():
    """NCCL_MIN_NCHANNELS=32 on 8 A100s (NCCL's default: 24): 32 CTAs, the per-GPU rate x 32/24 (below the
    rating NCCL scales the same way)."""
    rate = proto_rate.achieved_busbw("ampere", "LL128")
    assert rate is not None
    p = platform_of(dgx_host(gpu="a100"), tuple(range(8)))
    choice = select("all_reduce", p, settings_from_env({"NCCL_MIN_NCHANNELS": "32"}), 16 * MiB)
    assert choice is not None and (choice.protocol, choice.channels) == ("LL128", 32)
    assert choice.algbw == pytest.approx(rate * 32 / 24 * RING_8)


@pytest.mark.parametrize("channels", [4, 24])
def test_the_achieved_rate_is_per_cta_and_binds_over_the_ctas_that_run(channels):
    """8 A100s, 8 MiB, NCCL_MAX_NCHANNELS=4 or 24 (NCCL's default: 24): LL128 ring on that many CTAs. Each CTA
    reaches NCCL's rating over 24 (min(0.92 x 12 x 20, 12 x 20) = 220.8 / 24) and the achieved rate over 24 (148 /
    24): busbw = min(ch x 220.8 / 24, ch x 148 / 24) = 24.67 GB/s on 4 CTAs, 148 on 24. A whole-GPU ceiling
    (min(4 x 220.8 / 24, 148) = 36.8 on 4) is not what the kernel is: a CTA's LL128 throughput is its own."""
    rate = proto_rate.achieved_busbw("ampere", "LL128")
    assert rate is not None
    rating = min(0.92 * 12 * 20, 12 * 20)
    p = platform_of(dgx_host(gpu="a100"), tuple(range(8)))
    choice = select("all_reduce", p, settings_from_env({"NCCL_MAX_NCHANNELS": str(channels)}), 8 * MiB)
    assert choice is not None and (choice.algorithm, choice.protocol, choice.channels) == ("ring", "LL128", channels)
    busbw = min(channels * rating / 24, channels * rate / 24)
    assert choice.algbw == pytest.approx(busbw * RING_8)
    assert choice.time_us == pytest.approx(LL128_RING_LAT_US + 8 * MiB / (1000 * busbw * RING_8), rel=1e-3)
    if channels < 24:
        assert choice.algbw < min(channels * rating / 24, rate) * RING_8 * 0.9  # not a GPU-wide ceiling
