"""Published nccl-tests tables of the same experiment (GPU, GPUs, hosts, collective, NCCL settings, NIC rate,
-g, hosts' CPU) on different clusters, side by side, size by size: how far apart they are, the band of predictions
that would meet the goal on all of them (empty: no model of NCCL can), and where the model lands.

    .venv/bin/python bench/bench_cluster_spread.py           # every group of two or more tables (flow network)

Columns: size, each table's published busbw (GB/s, in the order the group lists them), largest / smallest, the
goal's band [max x (1 - tol), min x (1 + tol)] or "none", the model's busbw and which tables it meets the goal on.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_nccl_tests import simulate

from phantora.collectives.nccl.published import tables
from phantora.collectives.nccl.spread import Spread, groups, spreads, tolerance


def _size(n: int) -> str:
    return f"{n >> 30} GiB" if n >= 1 << 30 and n % (1 << 30) == 0 else f"{n >> 20} MiB"


def _row(s: Spread, model: float) -> str:
    low, high = s.band
    band = f"{low:7.1f}-{high:<7.1f}" if s.reachable else f"{'none':<15}"
    tol = tolerance(s.size)
    meets = "".join("y" if abs(model - p) <= tol * p else "." for p in s.published)
    figures = " ".join(f"{p:7.2f}" for p in s.published)
    return f"  {_size(s.size):>8}  {figures}  {s.ratio:5.2f}  {band}  {model:7.2f}  {meets}"


def main() -> None:
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
