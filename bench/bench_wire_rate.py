"""One-host ring rates in wire bytes per CTA, A100 against H100, and which way each protocol crosses NVLink.

    .venv/bin/python bench/bench_wire_rate.py        # LL and LL128 rates table by table, then each protocol's share
    .venv/bin/python bench/bench_wire_rate.py --all  # the Simple rates table by table too

A check on published tables that needs no model of the rate itself: for each compared one-host ring table of an
A100 or H100 host, the bus bandwidth each protocol reaches, from the published sizes alone (LL and LL128: the
marginal rate between consecutive sizes the model runs with one protocol on the same channels, every fixed cost
cancelled; Simple, and a table that forces one protocol at one size: the busbw of its largest size), turned into
the bytes the protocol puts on NVLink (LL: 16-byte lines of 8 data bytes, LL128: 128-byte lines of 120,
`shape.WIRE_FACTOR`) per CTA (the channels NCCL runs there) and into a share of the NVLink payload NCCL rates one
GPU at (its ring graph: channels x per-channel speed). `way` is how the bytes cross NVLink: NCCL reads the Simple
buffer from the peer on sm80 only (graph/paths.cc "Enable P2P Read for Ampere/NVLink only"; transport/p2p.cc puts
that buffer on the sender, the LL and LL128 buffers on the receiver), so an A100's Simple ring moves its bytes by
loads, every other (GPU, protocol) by the sender's stores. The model's choices (algorithm, protocol, channels) come
from `bench_nccl_tests.simulate`; the rates do not. A marginal rate whose wire bytes exceed the GPU's raw NVLink
(its link to the NVSwitch) is no kernel's: the two sizes' fixed costs did not cancel (the host launching the calls
bounds one of them); it is printed and marked `host`, and left out of the medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_nccl_tests import simulate

from phantora.collectives.nccl.channels import ring_graph
from phantora.collectives.nccl.platform import nvlink_bps, platform_of
from phantora.collectives.nccl.published import Table, machine, not_compared, tables
from phantora.collectives.nccl.settings import nccl_env, settings_of
from phantora.collectives.nccl.shape import WIRE_FACTOR

GPUS = ("a100", "h100")
KINDS = ("all_reduce", "all_gather", "reduce_scatter")
MIN_SIZE = 1 << 20  # bench_nccl_tests.py compares from 1 MiB
READ_COMPCAP = 80  # paths.cc: P2P read over NVLink when both GPUs are sm80


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' bus bandwidth over algorithm bandwidth for a ring of `n` ranks."""
    return 2 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n


def way(compcap: int, proto: str) -> str:
    """How `proto`'s bytes cross NVLink: loads (NCCL's P2P read, the Simple buffer on sm80) or stores."""
    return "load" if compcap == READ_COMPCAP and proto == "Simple" else "store"


def nvlink(table: Table) -> tuple[float, float, int]:
    """One GPU of `table`'s host: NCCL's rated NVLink payload (GB/s: ring channels x speed), the raw rate of its
    NVLink (GB/s) and its compute capability."""
    topo = machine(table)
    p = platform_of(topo, tuple(range(table.gpus)), settings_of(nccl_env(table.env)))
    g = ring_graph(p)
    return g.nchannels * g.bw_intra, nvlink_bps(topo, 0) / 8e9, p.compcap


def rates(table: Table) -> list[tuple[str, str, int, float]]:
    """(what, protocol, channels, busbw GB/s) of `table`'s ring rates from its published sizes."""
    f = bus_factor(table.kind, table.gpus)
    rows = [(s, b) for s, b in table.rows if s >= MIN_SIZE and b > 0]
    choice = {s: simulate(table, s)[1] for s, _ in rows}
    rows = [(s, b) for s, b in rows if choice[s].get("algorithm") == "Ring"]
    out: list[tuple[str, str, int, float]] = []
    for (s1, b1), (s2, b2) in zip(rows, rows[1:], strict=False):
        c1, c2 = choice[s1], choice[s2]
        key1, key2 = (c1["protocol"], c1["channels"]), (c2["protocol"], c2["channels"])
        if key1 != key2 or c1["protocol"] == "Simple":
            continue
        t1, t2 = s1 * f / (b1 * 1e3), s2 * f / (b2 * 1e3)  # µs
        if t2 > t1:
            out.append(
                (f"{s1 >> 20}-{s2 >> 20} MiB", c1["protocol"], c1["channels"], (s2 - s1) * f / ((t2 - t1) * 1e3))
            )
    if rows:
        s, b = rows[-1]
        c = choice[s]
        if c["protocol"] == "Simple" or len(rows) == 1:
            out.append((f"{s >> 20} MiB", c["protocol"], c["channels"], b))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true", help="print the Simple rates table by table too")
    args = ap.parse_args()
    skip = {name for name, _ in not_compared()}
    shares: dict[tuple[str, str], list[float]] = {}
    print(f"{'table':<64} {'sizes':>12} {'proto':>6} {'CTAs':>4} {'busbw':>6} {'wire/CTA':>8} {'NVLink':>7}  way")
    for table in tables():
        if table.gpu not in GPUS or table.nodes != 1 or table.kind not in KINDS or table.name in skip:
            continue
        payload, raw, compcap = nvlink(table)
        for what, proto, ctas, bus in rates(table):
            wire = bus * WIRE_FACTOR[proto]
            share = wire / payload
            host = "-" in what and wire > raw
            if not host:
                shares.setdefault((table.gpu, proto), []).append(share)
            if proto == "Simple" and not args.all:
                continue
            print(
                f"{table.name:<64} {what:>12} {proto:>6} {ctas:>4} {bus:>6.0f} {wire / ctas:>8.2f} "
                f"{share:>6.0%}  {'host' if host else way(compcap, proto)}"
            )
    print("\nshare of NCCL's rated NVLink payload in wire bytes: median, range (rates, way)")
    for (gpu, proto), vals in sorted(shares.items()):
        compcap = READ_COMPCAP if gpu == "a100" else 90
        print(
            f"  {gpu} {proto:<6} {statistics.median(vals):>4.0%}, {min(vals):.0%}-{max(vals):.0%} "
            f"({len(vals)}, {way(compcap, proto)})"
        )


if __name__ == "__main__":
    main()
