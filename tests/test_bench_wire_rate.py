"""bench/bench_wire_rate.py: a protocol's rate from published sizes, in wire bytes per CTA and as a share of the
NVLink payload NCCL rates a GPU at, against closed forms worked by hand from the table's CSV and NCCL's constants."""

from __future__ import annotations

import pytest
from script_modules import load

from phantora.collectives.nccl.published import tables

wire_rate = load("bench/bench_wire_rate.py")


def _table(name: str):
    return next(t for t in tables() if t.name == name)


def test_azure_ll128_marginal_rate_is_the_closed_form() -> None:
    """Azure ND A100 v4 publishes 89.99 / 109.22 GB/s busbw at 8 / 16 MiB (an 8-rank all-reduce: busbw = algbw x
    14/8), so the two calls take 8 MiB x 1.75 / 89.99 and 16 MiB x 1.75 / 109.22 µs, and the 8 MiB between them
    cross at 8 MiB x 1.75 / (t16 - t8): 138.9 GB/s busbw, 148.2 in LL128 lines (x 128/120), 6.17 a CTA over 24,
    61.7% of an A100's 240 GB/s (NCCL's ring graph: 12 channels of 20)."""
    table = _table("a100_8gpu_1node_all_reduce_azure_nda100v4")
    mib = 1 << 20
    t8, t16 = 8 * mib * 1.75 / (89.99 * 1e3), 16 * mib * 1.75 / (109.22 * 1e3)
    closed = 8 * mib * 1.75 / ((t16 - t8) * 1e3)
    got = {what: (proto, ctas, bus) for what, proto, ctas, bus in wire_rate.rates(table)}
    proto, ctas, bus = got["8-16 MiB"]
    assert (proto, ctas) == ("LL128", 24)
    assert bus == pytest.approx(closed) and bus == pytest.approx(138.9, abs=0.05)
    payload, raw, compcap = wire_rate.nvlink(table)
    assert (payload, raw, compcap) == (pytest.approx(240.0), pytest.approx(300.0), 80)
    assert bus * 128 / 120 / ctas == pytest.approx(6.17, abs=0.005)
    assert bus * 128 / 120 / payload == pytest.approx(0.617, abs=0.0005)


def test_only_the_a100_simple_buffer_is_read_across_nvlink() -> None:
    """paths.cc enables P2P read for sm80 pairs only and p2p.cc moves only the Simple buffer to the sender: an
    A100's Simple ring crosses NVLink by loads, its LL and LL128 by stores, and an H100 (sm90) stores all three."""
    assert [wire_rate.way(80, p) for p in ("LL", "LL128", "Simple")] == ["store", "store", "load"]
    assert [wire_rate.way(90, p) for p in ("LL", "LL128", "Simple")] == ["store", "store", "store"]
