"""How far published nccl-tests tables of the same set-up disagree with each other, and which of the model's misses
lie inside that disagreement (phantora/collectives/nccl/source_spread.py says what "the same set-up" holds equal).

    .venv/bin/python bench/bench_nccl_source_spread.py              # pairs, then every missing table (flow model)
    .venv/bin/python bench/bench_nccl_source_spread.py --no-model   # the pairs only (published figures, instant)
    .venv/bin/python bench/bench_nccl_source_spread.py --near 99    # any NCCL version counts as near

Part 1, every pair of compared tables (held-out ones included) of one set-up: what they do not hold equal, then
each size both publish: busbw of each (GB/s), the second's distance from the first ((b - a) / a, as the model's
error is counted), larger / smaller, the floor (the least worst error one prediction can have on both:
|b - a| / (a + b), at v = 2ab / (a + b)), and "none" where no prediction meets the goal on both (ratio above
1.15 / 0.85 = 1.353 below 64 MiB, 1.10 / 0.90 = 1.222 from 64 MiB). Sizes from --min-size (1 MiB, the goal's).

Part 2, every table the model misses (bench_nccl_tests.py's goal): its partners, and each missed size with the
partners' figures there and the verdict: "inside" (some partner's figure and this one leave no prediction within
the goal of both: no model can meet both), "outside" (each partner's figure and this one leave a prediction
within the goal of both), "no partner figure"; "(one prediction meets all: none)" where no one prediction meets
this table and every partner at once; "model meets a partner" where the model is within the goal of a partner's
figure; whether the model lies between the figures or above / below all; the floor (the least worst error one
prediction can have on this table and its partners at once, (max - min) / (max + min)) and the model's worst
error on them. A table without partners lists the tables of its GPUs, hosts and collective that differ in what
`setup_key` holds or in a version too far.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from phantora.collectives.nccl.published import Table, tables
from phantora.collectives.nccl.source_spread import (
    NEAR_MINORS,
    differences,
    fabric,
    gaps,
    judge,
    near_versions,
    partners,
    same_setup,
    settings,
    version,
)


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):g} {unit}"
    return f"{n} B"


def print_pairs(pool: list[Table], min_size: int, minors: int) -> None:
    """Every pair of one set-up, size by size, and a line over all pairs."""
    shared = unreachable = 0
    ratios: list[float] = []
    floors: list[float] = []
    for a, b in combinations(pool, 2):
        if not same_setup(a, b, minors):
            continue
        rows = gaps(a, b, min_size)
        print(f"{a.gpu}, {a.gpus} GPUs, {a.nodes} host(s), {fabric(a)}, {a.test}, {dict(settings(a)) or 'default'}:")
        print(f"  a = {a.name}\n  b = {b.name}")
        print(f"  not held equal: {'; '.join(differences(a, b)) or 'nothing stated'}")
        if not rows:
            print("  no size published by both\n")
            continue
        print(f"  {'size':>9} {'a':>8} {'b':>8} {'b vs a':>8} {'ratio':>6} {'floor':>6}  one prediction meets both")
        for g in rows:
            meets = "yes" if g.reachable else "none"
            print(f"  {_size(g.size):>9} {g.a:8.2f} {g.b:8.2f} {g.apart:+8.1%} {g.ratio:6.2f} {g.floor:6.1%}  {meets}")
            shared += 1
            unreachable += not g.reachable
            ratios.append(g.ratio)
            floors.append(g.floor)
        print()
    if ratios:
        print(
            f"all pairs from {_size(min_size)}: {shared} shared sizes, ratio median {statistics.median(ratios):.2f} "
            f"max {max(ratios):.2f}, floor median {statistics.median(floors):.1%} max {max(floors):.1%}; "
            f"{unreachable} with no prediction within the goal of both\n"
        )


def near_misses(t: Table, pool: list[Table], minors: int) -> list[str]:
    """Tables of `t`'s GPUs, hosts and collective that are not of its set-up, each with why."""
    out = []
    for p in pool:
        if p.name == t.name or (p.gpu, p.gpus, p.nodes, p.test) != (t.gpu, t.gpus, t.nodes, t.test):
            continue
        why = []
        if fabric(p) != fabric(t):
            why.append(f"fabric {fabric(t)} / {fabric(p)}")
        if settings(p) != settings(t):
            why.append(f"NCCL settings {dict(settings(t)) or 'default'} / {dict(settings(p)) or 'default'}")
        if why or not near_versions(version(t), version(p), minors):
            out.append(f"{p.name} ({'; '.join(why) or f'NCCL {version(t)} / {version(p)}, too far apart'})")
    return out


def print_misses(pool: list[Table], minors: int) -> None:
    """Every table the model misses, its missed sizes against its partners' figures."""
    from bench_nccl_tests import compare

    counts: dict[str, dict[str, int]] = {"fitted": {}, "held-out": {}}
    for t in pool:
        missed = [r for r in compare(t, "flow", 1 << 20) if r.missed]
        if not missed:
            continue
        found = partners(t, pool, minors)
        held = " (held out)" if t.held_out else ""
        print(f"{t.name}{held}: {len(missed)} missed size(s)")
        for p in found:
            print(f"  partner {p.name}: {'; '.join(differences(t, p)) or 'nothing stated'}")
        if not found:
            others = near_misses(t, pool, minors)
            print("  no partner" + ("; not the same set-up: " + "; ".join(others) if others else ""))
        for r in missed:
            v = judge(t, r.size, r.simulated, pool, minors)
            figures = ", ".join(f"{bw:.2f}" for _, bw in v.partner_figures) or "-"
            extra = "" if v.one_meets_all or len(v.partner_figures) < 2 else " (one prediction meets all: none)"
            extra += ", model meets a partner" if v.model_meets_a_partner else ""
            worst = ""
            if v.partner_figures:
                worst = f" (model {v.model_side}; floor {v.floor:.1%}, model's worst {v.model_worst:.1%})"
            print(
                f"  {_size(r.size):>9}: published {r.published:.2f}, model {r.simulated:.2f} ({r.error:+.1%}); "
                f"partners {figures}: {v.verdict}{extra}{worst}"
            )
            key = f"{v.verdict}, model {v.model_side}" if v.verdict == "inside" else v.verdict
            these = counts["held-out" if t.held_out else "fitted"]
            these[key] = these.get(key, 0) + 1
        print()
    for which, these in counts.items():
        total = sum(these.values())
        print(f"{which} tables' {total} missed sizes: " + "; ".join(f"{n} {k}" for k, n in sorted(these.items())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--no-model", action="store_true", help="only the pairs' published figures (no simulation)")
    ap.add_argument("--min-size", type=int, default=1 << 20, help="smallest size of the pairs (default 1 MiB)")
    ap.add_argument(
        "--near", type=int, default=NEAR_MINORS, help=f"NCCL minor releases apart still near (default {NEAR_MINORS})"
    )
    args = ap.parse_args()
    pool = tables(include_held_out=True)
    held = "GPU, GPUs, hosts, fabric class, collective, NCCL settings"
    print(f"same set-up: {held}; NCCL at most {args.near} minor releases apart (or unstated)\n")
    print_pairs(pool, args.min_size, args.near)
    if not args.no_model:
        print_misses(pool, args.near)


if __name__ == "__main__":
    main()
