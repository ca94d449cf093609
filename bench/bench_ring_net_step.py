"""What-if: a ring step across the network costs more than NCCL's model says (issue 33, multi-host).

Three clusters' ring tables take far longer at small and mid sizes than NCCL's ring latency (hwLat NET ring: LL
2.7, LL128 4.0, Simple 14 µs per inter-node step): ALCF's two DGX A100 (LL128 flat at about 80 µs from 1 to 2 MiB
where NCCL's LL128 ring costs 46 µs, while its LL sizes sit at NCCL's 37 µs), #309 gj-aion's forced two-host ring
(LL128 flat at 157 µs at 1-2 MiB) and the 10-host cluster's ring all-gather and reduce-scatter (about 630 µs at
32-128 MiB). This adds `extra` µs to each inter-node step of the ring (nNodes - 1 for all-gather and
reduce-scatter, 2 (nNodes - 1) for all-reduce) for the protocols named, in the time only: NCCL's choice is made
with its own constants, as the real NCCL makes it. It changes nothing in phantora's model; it prints how the
published-table comparison would move. It prints first the measure the what-if rests on: where NCCL's choice is a
ring on LL128, the published time less the model's per inter-node step; then, for each what-if, every table that
changes (its summary line and each size whose error moves, before and after) and how many tables meet the goal at
every size (within 15%, within 10% from 64 MiB).

    .venv/bin/python bench/bench_ring_net_step.py                         # 34 µs on LL128, then on LL128 and Simple
    .venv/bin/python bench/bench_ring_net_step.py --extra 10 --protocols LL128
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

import phantora.collectives.nccl as nccl
from phantora.collectives.nccl import tuning
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.published import Table, tables
from phantora.collectives.nccl.settings import NcclSettings
from phantora.collectives.spec import Collective

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_nccl_tests import Row, _size, compare, verdict

Select = Callable[[str, Platform, NcclSettings, int, int], tuning.Choice | None]


def inter_steps(kind: str, nnodes: int) -> int:
    """A ring's inter-node steps, NCCL's count: 2 (nNodes - 1) for all-reduce, nNodes - 1 otherwise."""
    return 2 * (nnodes - 1) if kind == "all_reduce" else nnodes - 1


def time_us(table: Table, size: int, busbw: float) -> float:
    """The time (µs) of one size of `table` at bus bandwidth `busbw` (GB/s), as nccl-tests derives busbw from it."""
    return size * Collective(table.kind, tuple(range(table.gpus)), size, "fp32").busbw_factor() / busbw / 1e3


def excess_per_step(table: Table, rows: list[Row], protocol: str) -> list[tuple[int, float]]:
    """(size, µs) of the published time over the model's per inter-node step, where NCCL's choice is a ring on
    `protocol`."""
    steps = inter_steps(table.kind, table.nodes)
    return [
        (r.size, (time_us(table, r.size, r.published) - time_us(table, r.size, r.simulated)) / steps)
        for r in rows
        if r.choice.lower().startswith(f"ring/{protocol.lower()}/")
    ]


def met(results: dict[str, list[Row]]) -> int:
    """How many tables meet the goal at every size."""
    return sum(1 for rows in results.values() if rows and not any(r.missed for r in rows))


def moved_sizes(before: list[Row], after: list[Row]) -> str:
    """Each size whose error moves, `size before -> after`."""
    return ", ".join(
        f"{_size(b.size)} {b.error:+.1%} -> {a.error:+.1%}"
        for b, a in zip(before, after, strict=True)
        if f"{b.error:+.1%}" != f"{a.error:+.1%}"
    )


def with_extra_step(extra_us: float, protocols: tuple[str, ...]) -> Select:
    """`tuning.select` with `extra_us` more per inter-node ring step of the given protocols (time only)."""
    select = tuning.select

    def patched(kind: str, p: Platform, st: NcclSettings, nbytes: int, pipe_ops: int = 1) -> tuning.Choice | None:
        c = select(kind, p, st, nbytes, pipe_ops)
        if c is None or c.algorithm != "ring" or c.protocol not in protocols or p.nnodes < 2:
            return c
        inter = inter_steps(kind, p.nnodes)
        return dataclasses.replace(c, lat_us=c.lat_us + extra_us * inter, time_us=c.time_us + extra_us * inter)

    return patched


def results(min_size: int, multi_host_only: bool = False) -> dict[str, list[Row]]:
    """Every compared table's rows (or only the multi-host ones) under the current `select`."""
    return {t.name: compare(t, "flow", min_size) for t in tables() if t.nodes > 1 or not multi_host_only}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extra", type=float, action="append", help="µs per inter-node ring step (default 34)")
    ap.add_argument("--protocols", action="append", help="comma-separated (default LL128, then LL128,Simple)")
    ap.add_argument("--min-size", type=int, default=1 << 20)
    args = ap.parse_args()
    extras = args.extra or [34.0, 34.0]
    protos = args.protocols or ["LL128", "LL128,Simple"]
    base = results(args.min_size)
    by_name = {t.name: t for t in tables()}
    print("Published time over the model's per inter-node step, where NCCL's choice is a ring on LL128:")
    for name, rows in base.items():
        excess = excess_per_step(by_name[name], rows, "LL128") if by_name[name].nodes > 1 else []
        if excess:
            print(f"  {name}: " + ", ".join(f"{_size(size)} {us:.1f} µs" for size, us in excess))
    for extra, proto in zip(extras, protos, strict=False):
        nccl.select = with_extra_step(extra, tuple(proto.split(",")))  # type: ignore[assignment]
        now = {**base, **results(args.min_size, multi_host_only=True)}
        nccl.select = tuning.select
        print(f"\n+{extra:g} µs per inter-node ring step, {proto}:")
        for name, rows in now.items():
            if rows and verdict(rows) != verdict(base[name]):
                print(f"  {name}\n    before: {verdict(base[name])}\n    after:  {verdict(rows)}")
                print(f"    sizes:  {moved_sizes(base[name], rows)}")
        print(f"  tables meeting the goal at every size: {met(base)} -> {met(now)} of {len(now)}")


if __name__ == "__main__":
    main()
