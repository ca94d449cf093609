"""Each multi-host miss below 64 MiB under every algorithm and protocol NCCL could have run (a what-if, not the model).

    .venv/bin/python bench/bench_miss_choices.py                 # every compared multi-host table's misses
    .venv/bin/python bench/bench_miss_choices.py --table gjaion  # only the tables whose name contains this
    .venv/bin/python bench/bench_miss_choices.py --table nvlsenabled_all_gather --tuner  # one-host tables by name

For each size of a compared table on several hosts (on one host too, when `--table` names it) that misses the goal
below 64 MiB (bench_nccl_tests.py's `compare`), the model's error when NCCL_ALGO / NCCL_PROTO force each choice (a
table that forced the algorithm keeps it), beside the error of NCCL's own choice: whether some other choice at the
boundary of NCCL's tuner would meet the published point. A choice the model refuses prints `-`. `--tuner` adds the
time NCCL's tuner predicts for each choice it compares (the NCCL that ran: `tuning.rated`), latency and algbw.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_nccl_tests import BIG, compare, simulate

from phantora.collectives.nccl import tuning
from phantora.collectives.nccl.channels import comm_channels, ring_graph
from phantora.collectives.nccl.platform import platform_of
from phantora.collectives.nccl.published import Table, machine, tables
from phantora.collectives.nccl.settings import nccl_env, settings_of
from phantora.errors import InputError

ALGOS = {
    "all_reduce": ("Ring", "Tree", "NVLS", "NVLSTree"),
    "all_gather": ("Ring", "NVLS", "PAT"),
    "reduce_scatter": ("Ring", "NVLS", "PAT"),
}
PROTOS = ("LL", "LL128", "Simple")
ONLY_SIMPLE = ("NVLS", "NVLSTree", "PAT")  # NCCL runs these on Simple only (tuning.cc)


def forced(table: Table, algo: str, proto: str) -> Table:
    """`table` with NCCL_ALGO and NCCL_PROTO forced to `algo` / `proto` (its other variables kept)."""
    rest = tuple(kv for kv in table.forced if kv[0] != "NCCL_PROTO")
    return dataclasses.replace(table, nccl_algo=algo, forced=(*rest, ("NCCL_PROTO", proto)))


def alternatives(table: Table, size: int, published: float) -> list[str]:
    """The error of every choice NCCL allows for the table's collective at `size` ('-': refused)."""
    cells = []
    for algo in (table.nccl_algo,) if table.nccl_algo else ALGOS.get(table.kind, ()):
        for proto in PROTOS:
            if algo in ONLY_SIMPLE and proto != "Simple":
                continue
            try:
                bus, _ = simulate(forced(table, algo, proto), size)
            except (InputError, ValueError):  # NCCL has no such choice here (PAT on several GPUs a node)
                cells.append(f"{algo}/{proto} -")
                continue
            cells.append(f"{algo}/{proto} {(bus - published) / published:+.0%}")
    return cells


def tuner(table: Table, size: int) -> list[str]:
    """NCCL's predicted time (µs) of every choice its tuner compares at `size`, as the NCCL that ran rates it."""
    st = settings_of(nccl_env(table.env))
    p = platform_of(machine(table), tuple(range(table.gpus)), st)
    comm = comm_channels(p, ring_graph(p), st)
    cells = []
    for cost in tuning.costs(table.kind, p, st):
        rated = tuning.rated(cost, table.kind, p, st)
        if rated is None:
            continue
        t = tuning.model_time_us(rated, table.kind, p, size, comm, tuning.running_release(st))
        cells.append(f"{cost.algorithm}/{cost.protocol} {t:.1f} (lat {rated.lat_us:.1f}, {rated.algbw:.1f} GB/s)")
    return cells


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", default="", help="only the tables whose name contains this (one-host ones too)")
    ap.add_argument("--tuner", action="store_true", help="also NCCL's predicted time of each choice")
    args = ap.parse_args()
    for table in tables():
        if (table.nodes < 2 and not args.table) or args.table not in table.name or table.kind not in ALGOS:
            continue
        for row in compare(table, "flow", 1 << 20, BIG - 1):
            if not row.missed:
                continue
            print(f"{table.name} {row.size >> 20} MiB: published {row.published:.2f} GB/s")
            others = ", ".join(alternatives(table, row.size, row.published))
            print(f"  NCCL's choice {row.choice} {row.error:+.0%}; {others}")
            if args.tuner:
                print("  NCCL's tuner (µs): " + ", ".join(tuner(table, row.size)))


if __name__ == "__main__":
    main()
