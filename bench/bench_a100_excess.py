"""What the one-host A100 all-reduce tables take over the model, size by size: a cost per call, or a rate.

    .venv/bin/python bench/bench_a100_excess.py                     # the A100 one-host all-reduce tables with
                                                                     # sizes of 1-128 MiB, from 1 MiB
    .venv/bin/python bench/bench_a100_excess.py --min-size 32768    # and their sizes from 32 KiB

For each compared size (from 1 MiB, as bench_nccl_tests.py) of each table: the published time (µs, from its
busbw), the model's GPU time of one call alone (`bench_nccl_tests.bus_bandwidth`), the time of one iteration of
nccl-tests' timed loop in the model (`simulate`: the `-g` thread's launches overlap the GPUs,
`nccl_tests.launch_bound`), that thread's host time per iteration (`host_launch.host_ns_per_call`), the published
time less the model's loop (`over`), and, as a what-if that is not the model, the busbw error if each iteration's
host time were added to its GPU time instead of overlapping it (`launch_bound(..., blocking=True)`, the form of
nccl-tests' -z). Per table, the median and range of `over` on the sizes from 1 MiB that NCCL runs with LL or
LL128, and on the Simple sizes from 32 to 128 MiB. A cost per call shows as an `over` that stays put while the
size doubles; a rate, as one that doubles with it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_nccl_tests import bus_bandwidth, simulate, test_calls

from phantora.collectives import AlgoOptions
from phantora.collectives.nccl.published import Table, machine, tables
from phantora.collectives.nccl.settings import nccl_env
from phantora.report.host_launch import host_ns_per_call
from phantora.report.nccl_tests import launch_bound

MIN_SIZE = 1 << 20  # bench_nccl_tests.py compares from 1 MiB
SIMPLE_SIZES = (32 << 20, 128 << 20)  # the Simple sizes of the A100 misses (docs/validation.md)


def chosen(table: Table) -> bool:
    """A one-host A100 all-reduce table with published sizes from 1 to 128 MiB."""
    sizes = [s for s, _ in table.rows if MIN_SIZE <= s <= SIMPLE_SIZES[1]]
    return table.gpu == "a100" and table.nodes == 1 and table.kind == "all_reduce" and len(sizes) > 2


def row(table: Table, size: int, busbw: float) -> tuple[float, float, float, float, float, str]:
    """(published, GPU, loop, host µs, busbw error with the host added, algorithm/protocol) of one size."""
    calls = test_calls(table.kind, tuple(range(table.gpus)), size)
    factor = calls[0].busbw_factor()
    bus, choice = bus_bandwidth(calls, machine(table), AlgoOptions(nccl_env=nccl_env(table.env)), "flow")
    gpu_ns = round(size / bus * factor)
    host_ns = host_ns_per_call(table.kind, choice, table.gpus, table.gpus_per_thread)
    added = statistics.mean(launch_bound([gpu_ns] * table.iters, host_ns, blocking=True))
    loop_bus, _ = simulate(table, size)
    published = size * factor / (busbw * 1e3)
    what = f"{choice.get('algorithm')}/{choice.get('protocol')}"
    error = size / added * factor / busbw - 1  # (simulated - published) / published busbw, as bench_nccl_tests.py
    return published, gpu_ns / 1e3, size * factor / (loop_bus * 1e3), host_ns / 1e3, error, what


def spread(values: list[float]) -> str:
    """Median and range of `values` (µs), or 'none'."""
    if not values:
        return "none"
    return f"median {statistics.median(values):+.0f} µs ({min(values):+.0f} to {max(values):+.0f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--min-size", type=int, default=MIN_SIZE, help="smallest size printed (default 1 MiB)")
    args = ap.parse_args()
    for table in sorted((t for t in tables() if chosen(t)), key=lambda t: t.name):
        print(f"\n{table.name} (-g {table.gpus_per_thread}, {dict(table.env) or 'NCCL not stated'})")
        print(f"{'size':>7} {'published':>9} {'GPU':>8} {'loop':>8} {'host':>6} {'over':>7} {'added':>7}  choice")
        proto, simple = [], []
        for size, busbw in table.rows:
            if size < args.min_size or busbw <= 0:
                continue
            pub, gpu, loop, host, added, what = row(table, size, busbw)
            over = pub - loop
            if size < MIN_SIZE:
                pass
            elif what.endswith(("/LL", "/LL128")):
                proto.append(over)
            elif SIMPLE_SIZES[0] <= size <= SIMPLE_SIZES[1]:
                simple.append(over)
            cells = f"{pub:>9.1f} {gpu:>8.1f} {loop:>8.1f} {host:>6.1f} {over:>+7.1f} {added:>+7.1%}"
            label = f"{size >> 20}M" if size >= MIN_SIZE else f"{size >> 10}K"
            print(f"{label:>7} {cells}  {what}")
        print(f"  over, LL/LL128 sizes: {spread(proto)}; Simple 32-128 MiB: {spread(simple)}")
        one = host_ns_per_call(table.kind, {"channels": 1}, table.gpus, table.gpus_per_thread) / 1e3
        print(f"  host per iteration on one channel (NCCL's LL count up to 32 KiB on 8 GPUs): {one:.1f} µs")


if __name__ == "__main__":
    main()
