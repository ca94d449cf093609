"""The pipeline fill that published multi-host all-reduce tables imply for NVLS-Tree, against the model's.

    .venv/bin/python bench/bench_nvls_tree_fill.py

For every compared multi-host H100 all-reduce table (tests/data/nccl_tests/, SOURCES.md) and each size from 1 to
128 MiB, it prints the choice of NCCL 2.30's tuner (tuning.py) and of NCCL 2.22-2.27's (first_use.py: the tables
here were taken with 2.22.3 and 2.26.2, or with a version that the first-use inversions place in 2.22-2.27), then,
for NVLS-Tree, the chunks each operation (channel x head) runs (`k`), one chunk's time at an operation's share of
the model's bandwidth (`ct`), the model's fill (the pipelined (stages - 1) chunk times, or with one chunk per
operation that chunk's own crossing: nvls_tree.py), and the fill the table implies: its time less NCCL's latency
and bytes over the model's bandwidth. The implied figure is only NVLS-Tree's where the older tuner picks NVLS-Tree;
a missing connection time (first use, `published.SETUP_POINTS`) is excluded. Diagnostic only: nothing is fitted.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.collectives.nccl import first_use, tuning
from phantora.collectives.nccl.chunking import chunk_bytes
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.published import SETUP_POINTS, Table, machine, tables
from phantora.collectives.nccl.settings import settings_of

MiB = 1 << 20


def published_time_us(table: Table, size: int, busbw: float) -> float:
    """The table's time (µs) of one all-reduce of `size` bytes from its bus bandwidth (GB/s)."""
    n = table.gpus
    return size / (busbw * n / (2 * (n - 1))) / 1000.0


def rows(table: Table) -> list[str]:
    """One line per size from 1 to 128 MiB: the two tuners' choices, then NVLS-Tree's chunks and fills."""
    p = platform_of(machine(table), tuple(range(table.gpus)))
    st = settings_of(tuple(sorted(table.env.items())))
    forced = settings_of(tuple(sorted({**table.env, "NCCL_ALGO": "NVLSTree"}.items())))
    out = []
    for size, busbw in table.rows:
        if not MiB <= size <= 128 * MiB or size in SETUP_POINTS.get(table.name, {}):
            continue
        now = tuning.select("all_reduce", p, st, size)
        older = first_use.choice_2_2x(p, st, size)
        nt = tuning.select("all_reduce", p, forced, size)
        if now is None or nt is None:
            continue
        ops = nt.channels * p.ppn
        chunk = min(chunk_bytes("nvls_tree", "Simple", p, forced, size, ops), math.ceil(size / ops))
        k = math.ceil(size / ops / chunk)
        ct = chunk / (nt.algbw * 1000.0 / ops)
        model = nt.fill_us  # pipelined, or one chunk's own crossing (nvls_tree.py)
        implied = published_time_us(table, size, busbw) - nt.lat_us - size / (1000.0 * nt.algbw)
        out.append(
            f"  {size // MiB:>4} MiB  2.30 {now.algorithm}/{now.protocol:<7} 2.2x {older:<17}"
            f" chunk {chunk // 1024:>3} KiB  k {k:>2}  ct {ct:6.1f} us  fill model {model:6.1f}"
            f" ({model / ct:4.2f} ct)  implied {implied:6.1f} ({implied / ct:5.2f} ct)"
        )
    return out


def main() -> None:
    for table in tables():
        if table.test != "all_reduce" or table.nodes < 2 or not table.gpu.startswith("h100") or table.nccl_algo:
            continue
        print(f"{table.name} ({table.nodes} hosts)")
        print("\n".join(rows(table)))


if __name__ == "__main__":
    main()
