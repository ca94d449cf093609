"""What one loop of a CTA costs in the published NVLS and NVLS-Tree all-reduce tables, read between two sizes.

    .venv/bin/python bench/bench_nvls_loops.py [NAME ...]

NCCL's NVLS kernels (src/device/all_reduce.h) move a chunk per head in each loop of each CTA, so between two sizes
that NCCL cuts into the same chunk (`calcCollChunking`, as chunking.py restates it) the latency and the pipeline
fill cancel: the time added over the loops added is one loop's time. For every all-reduce table (compared and
held out; only those whose name holds a NAME, if given; a first use's size left out, `published.SETUP_POINTS`) and
each such pair it prints the chunk, the loops a CTA runs (its channel's bytes over heads x chunk) and the µs a loop.
For the one-node kernel it also prints the 4 KiB hunks the busiest gather warp copies in a loop: NCCL's gather
warps (7 above six ranks, 6 up to six) copy each head's chunk in its own `reduceCopy` call, which deals the chunk's
hunks (COLL_UNROLL 8 x 32 lanes x 16 B) from warp 0 every time (src/device/common_kernel.h `reduceCopyPacks`), so
warp 0 copies ceil(hunks / warps) per head. Diagnostic only: nothing is fitted; docs/validation.md ("Held-out
tables") quotes it.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.collectives.nccl import tuning
from phantora.collectives.nccl.channels import nvls_heads
from phantora.collectives.nccl.chunking import chunk_bytes
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.published import SETUP_POINTS, Table, machine, tables
from phantora.collectives.nccl.settings import nccl_env, settings_of

MiB = 1 << 20
HUNK = 8 * 32 * 16  # COLL_UNROLL (8 from sm80, device.h `ncclCollUnroll`) x WARP_SIZE x a 16-byte pack


def gather_warps(nranks: int) -> int:
    """NCCL's gather warps of the one-node NVLS all-reduce, unregistered (all_reduce.h): 20 warps less the
    reduce warps (7 up to six ranks, else 5), halved."""
    return (20 - (7 if nranks <= 6 else 5)) >> 1


def busiest_gather_hunks(chunk: int, heads: int, nranks: int) -> int:
    """Hunks warp 0 of the gather copies in one loop: ceil(hunks of a chunk / gather warps), once per head."""
    return heads * math.ceil(math.ceil(chunk / HUNK) / gather_warps(nranks))


def time_us(table: Table, size: int, busbw: float) -> float:
    """The table's time (µs) of one all-reduce of `size` bytes from its bus bandwidth (GB/s)."""
    n = table.gpus
    return size / (busbw * n / (2 * (n - 1))) / 1000.0


def rows(table: Table) -> list[str]:
    """One line per pair of adjacent sizes with the same NVLS chunk: its loops and the µs a loop."""
    st = settings_of(nccl_env(table.env))
    p = platform_of(machine(table), tuple(range(table.gpus)), st)
    heads = nvls_heads(p)
    out: list[str] = []
    prev: tuple[int, int, float, float] | None = None  # size, chunk, loops, time
    for size, busbw in table.rows:
        choice = tuning.select("all_reduce", p, st, size)
        skip = size < 4 * MiB or size in SETUP_POINTS.get(table.name, {})  # a first use's connection time
        if skip or choice is None or choice.algorithm not in ("nvls", "nvls_tree"):
            prev = None
            continue
        chunk = chunk_bytes(choice.algorithm, choice.protocol, p, st, size, choice.channels * heads, "all_reduce")
        loops = size / choice.channels / (heads * chunk)
        t = time_us(table, size, busbw)
        if prev is not None and prev[1] == chunk and loops > prev[2]:
            per_loop = (t - prev[3]) / (loops - prev[2])
            hunks = busiest_gather_hunks(chunk, heads, p.nranks) if choice.algorithm == "nvls" else 0
            gather = f"  gather warp 0: {hunks:>3} hunks, {per_loop / hunks:4.2f} us each" if hunks else ""
            out.append(
                f"  {prev[0] // MiB:>5} -> {size // MiB:>5} MiB  {choice.algorithm}/{choice.channels}"
                f"  chunk {chunk // 1024:>3} KiB  loops {prev[2]:7.2f} -> {loops:7.2f}  {per_loop:6.1f} us a loop"
                f"{gather}"
            )
        prev = (size, chunk, loops, t)
    return out


def main() -> None:
    names = sys.argv[1:]
    for table in tables(include_held_out=True):
        if table.kind != "all_reduce" or (names and not any(n in table.name for n in names)):
            continue
        lines = rows(table)
        if lines:
            print(f"{table.name} ({nvls_heads(platform_of(machine(table), tuple(range(table.gpus))))} heads)")
            print("\n".join(lines))


if __name__ == "__main__":
    main()
