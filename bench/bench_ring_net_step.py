"""What-if: a ring step across the network costs more than NCCL's model says (issue 33, multi-host).

Three clusters' ring tables take far longer at small and mid sizes than NCCL's ring latency (hwLat NET ring: LL
2.7, LL128 4.0, Simple 14 µs per inter-node step): ALCF's two DGX A100 (LL128 flat at about 80 µs from 1 to 2 MiB
where NCCL's LL128 ring costs 46 µs, while its LL sizes sit at NCCL's 37 µs), #309 gj-aion's forced two-host ring
(LL128 flat at 157 µs at 1-2 MiB) and the 10-host cluster's ring all-gather and reduce-scatter (about 630 µs at
32-128 MiB). This adds `extra` µs to each inter-node step of the ring (nNodes - 1 for all-gather and
reduce-scatter, 2 (nNodes - 1) for all-reduce) for the protocols named, in the time only: NCCL's choice is made
with its own constants, as the real NCCL makes it. It changes nothing in phantora's model; it prints how the
published-table comparison would move, one line per table that changes.

    .venv/bin/python bench/bench_ring_net_step.py                         # 34 µs on LL128, then on LL128 and Simple
    .venv/bin/python bench/bench_ring_net_step.py --extra 10 --protocols LL128
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

import phantora.collectives.nccl as nccl
from phantora.collectives.nccl import tuning
from phantora.collectives.nccl.platform import Platform
from phantora.collectives.nccl.published import tables
from phantora.collectives.nccl.settings import NcclSettings

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_nccl_tests import compare, verdict

Select = Callable[[str, Platform, NcclSettings, int], tuning.Choice | None]


def with_extra_step(extra_us: float, protocols: tuple[str, ...]) -> Select:
    """`tuning.select` with `extra_us` more per inter-node ring step of the given protocols (time only)."""
    select = tuning.select

    def patched(kind: str, p: Platform, st: NcclSettings, nbytes: int) -> tuning.Choice | None:
        c = select(kind, p, st, nbytes)
        if c is None or c.algorithm != "ring" or c.protocol not in protocols or p.nnodes < 2:
            return c
        inter = 2 * (p.nnodes - 1) if kind == "all_reduce" else p.nnodes - 1
        return dataclasses.replace(c, lat_us=c.lat_us + extra_us * inter, time_us=c.time_us + extra_us * inter)

    return patched


def lines(min_size: int) -> dict[str, str]:
    """The --summary line of every compared multi-host table under the current `select`."""
    return {t.name: verdict(compare(t, "flow", min_size)) for t in tables() if t.nodes > 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--extra", type=float, action="append", help="µs per inter-node ring step (default 34)")
    ap.add_argument("--protocols", action="append", help="comma-separated (default LL128, then LL128,Simple)")
    ap.add_argument("--min-size", type=int, default=1 << 20)
    args = ap.parse_args()
    extras = args.extra or [34.0, 34.0]
    protos = args.protocols or ["LL128", "LL128,Simple"]
    base = lines(args.min_size)
    for extra, proto in zip(extras, protos, strict=False):
        nccl.select = with_extra_step(extra, tuple(proto.split(",")))  # type: ignore[assignment]
        now = lines(args.min_size)
        nccl.select = tuning.select
        print(f"\n+{extra:g} µs per inter-node ring step, {proto}:")
        for name, line in now.items():
            if line != base[name]:
                print(f"  {name}\n    before: {base[name]}\n    after:  {line}")


if __name__ == "__main__":
    main()
