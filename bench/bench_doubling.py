"""Bus bandwidth gained per doubling of the size, 32 MiB to 2 GiB, published and modelled, for every one-host table
of tests/data/nccl_tests with four or more such doublings (phantora/collectives/nccl/doubling.py).

    .venv/bin/python bench/bench_doubling.py            # every such table
    .venv/bin/python bench/bench_doubling.py --table a100 --table ringalgo_all_reduce  # names containing either

Per table two lines: the published gains (`64M +4.5` is busbw(128 MiB) / busbw(64 MiB) - 1, in %) and the
model's at the same sizes (flow network, as bench_nccl_tests.py runs them), the published time over the model's
at each size (µs), then the sizes whose gain rises 5
points or more over the previous doubling's (`steps`), which a curve of a fixed cost plus bytes at a rate never has
(NCCL's p2p has them where it opens more channels).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_nccl_tests import simulate, test_calls

from phantora.collectives.nccl.doubling import doubling_gains, steps
from phantora.collectives.nccl.published import tables

LO, HI = 32 << 20, 1 << 30  # doublings from 32 MiB -> 64 MiB to 1 GiB -> 2 GiB


def _gains(gains: list[tuple[int, float]]) -> str:
    return " ".join(f"{s >> 20}M {g * 100:+.1f}" for s, g in gains)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", action="append", default=[], help="only tables whose name has this (repeatable)")
    args = ap.parse_args()
    for t in tables():
        published = doubling_gains(t.rows, LO, HI)
        wanted = not args.table or any(w in t.name for w in args.table)
        if t.nodes != 1 or not wanted or len(published) < 4:
            continue
        sizes = sorted({s for s, _ in published} | {2 * s for s, _ in published})
        bus = dict(t.rows)
        modelled = {s: simulate(t, s)[0] for s in sizes}
        model = doubling_gains(list(modelled.items()), LO, HI)
        factor = test_calls(t.kind, tuple(range(t.gpus)), 1)[0].busbw_factor()
        over = " ".join(f"{s >> 20}M {s * factor * (1 / bus[s] - 1 / modelled[s]) / 1e3:+.0f}" for s in sizes)
        found = ", ".join(f"{s >> 20} MiB" for s in steps(published)) or "none"
        print(t.name)
        print(f"  published  {_gains(published)}")
        print(f"  model      {_gains(model)}")
        print(f"  over µs    {over}")
        print(f"  steps      published: {found}; model: {', '.join(f'{s >> 20} MiB' for s in steps(model)) or 'none'}")


if __name__ == "__main__":
    main()
