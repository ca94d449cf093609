"""Published nccl-tests tables of the same experiment (GPU, GPUs, hosts, collective, NCCL settings, NIC rate,
-g, hosts' CPU) on different clusters, side by side, size by size: how far apart they are, the band of predictions
that would meet the goal on all of them (empty: no model of NCCL can), and where the model lands.

    .venv/bin/python bench/bench_cluster_spread.py           # every group of two or more tables (flow network)
    .venv/bin/python bench/bench_cluster_spread.py --fits gjaion  # fixed cost and rate per algorithm, by table

Columns: size, each table's published busbw (GB/s, in the order the group lists them), largest / smallest, the
goal's band [max x (1 - tol), min x (1 + tol)] or "none", the model's busbw and which tables it meets the goal on.

`--fits NAME`: for each table whose name contains NAME (runs of one cluster under other NCCL settings are
different experiments, so `groups` never puts them side by side), every run of three or more sizes from 16 MiB
that NCCL's choice in the model runs on one algorithm, protocol and channel count, fitted as t = a + S x f / B
(`spread.fit`): the published and the model's fixed cost a (µs) and marginal bus bandwidth B (GB/s). Points that
time a connection set-up (`published.SETUP_POINTS`) are left out.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse

from bench_nccl_tests import simulate

from phantora.collectives.nccl.published import SETUP_POINTS, tables
from phantora.collectives.nccl.spread import Spread, fit, groups, runs, spreads, tolerance
from phantora.collectives.spec import BUSBW_FACTOR

FIT_FROM = 16 << 20  # smallest size fitted: below it NCCL's latency and fill, not bytes, make most of the time


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 and n % (1 << 30) == 0 else f"{n >> 20} MiB"


def _row(s: Spread, model: float) -> str:
    low, high = s.band
    band = f"{low:7.1f}-{high:<7.1f}" if s.reachable else f"{'none':<15}"
    tol = tolerance(s.size)
    meets = "".join("y" if abs(model - p) <= tol * p else "." for p in s.published)
    figures = " ".join(f"{p:7.2f}" for p in s.published)
    return f"  {_size(s.size):>8}  {figures}  {s.ratio:5.2f}  {band}  {model:7.2f}  {meets}"


def fits(name: str) -> None:
    """The published and the model's (fixed cost, marginal busbw) of every one-algorithm run of sizes of each table
    whose name contains `name`."""
    for t in tables():
        if name not in t.name:
            continue
        rows = [(s, bw) for s, bw in t.rows if s >= FIT_FROM and bw > 0 and s not in SETUP_POINTS.get(t.name, {})]
        sims = [simulate(t, s) for s, _ in rows]
        labels = [f"{c.get('algorithm')}/{c.get('protocol')}/{c.get('channels')}" for _, c in sims]
        print(f"{t.name} ({t.nodes} host(s), {', '.join(f'{k}={v}' for k, v in sorted(t.env.items())) or 'default'}):")
        factor = BUSBW_FACTOR[t.kind](t.gpus)
        for lo, hi in runs(labels):
            pub = fit(rows[lo:hi], factor)
            mod = fit([(s, bw) for (s, _), (bw, _) in zip(rows[lo:hi], sims[lo:hi], strict=True)], factor)
            span = f"{_size(pub.lo)}-{_size(pub.hi)}"
            print(
                f"  {labels[lo]:<20} {span:>15} {pub.points:>2} sizes  published {pub.intercept_us:7.1f} us"
                f" + {pub.busbw:6.1f} GB/s   model {mod.intercept_us:7.1f} us + {mod.busbw:6.1f} GB/s"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fits", metavar="NAME", help="fixed cost and rate per algorithm of the tables named so")
    args = ap.parse_args()
    if args.fits:
        fits(args.fits)
        return
    unreachable = 0
    total = 0
    for group in groups(tables()):
        rows = spreads(group)
        if not rows:
            continue
        print(f"{group[0].gpu}, {group[0].gpus} GPUs, {group[0].nodes} host(s), {group[0].test}:")
        for i, t in enumerate(group, 1):
            print(f"  [{i}] {t.name}")
        for s in rows:
            model, _ = simulate(group[0], s.size)
            print(_row(s, model))
            unreachable += not s.reachable
            total += 1
        print()
    print(f"{unreachable} of {total} shared sizes have no prediction within the goal of every table")


if __name__ == "__main__":
    main()
