"""CPU seconds the coordinator spends on one world-size uneven all-to-all (an MoE dispatch with EP = world), by
stage, on 16 to 1024 ranks of leafspine1024 (H100 hosts of 8), and the transfers' ends against another tree's.

The group is bench/moe_dispatch.py's: per-pair bytes log-uniform 1-64 MiB in rows of 4 KiB, seeded, every pair
starting at once. Stages of one rating (`p2p_group._rate_group`, its cache cleared): `plan` (each transfer's
channels and protocol, `plan_parts`), `rate` (the transfers' rates, each time they are set), `events` (the rest of
the schedule of starts and ends), `other` (latencies, the answer); `pairs` is the coordinator asking every pair's
choice (a `Collective` made and `nccl.choose` asked, as bridge/p2p_batch.py hands it the group) once the group is
rated, measured on `--sample` pairs and scaled to all n (n - 1) (marked `~`).

    nice -n 10 .venv/bin/python bench/bench_p2p_group_scale.py [--ranks 16 64 128] [--base CLONE]

`--base CLONE` runs the same rating with PYTHONPATH=CLONE in a child, alternating with this tree's, and checks that
every transfer's end (ns) is the same float, bit for bit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if "--child" not in sys.argv:  # a child imports the tree its PYTHONPATH names (`--base`: the tree compared)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cpu_timing import cpu_timed  # noqa: E402
from moe_dispatch import ROW, splits  # noqa: E402

TOPOLOGY = "leafspine1024"
STAGES = ("plan", "rate", "events", "other", "total", "pairs")


def group(n: int, seed: int) -> dict[tuple[int, int], tuple[int, int]]:
    """(start ns, bytes) by (src, dst) of bench/moe_dispatch.py's dispatch on `n` ranks."""
    rows = splits(n, seed, 1.0, 64.0) * ROW
    return {(s, d): (0, int(rows[s, d])) for s in range(n) for d in range(n) if s != d}


def _instrument(spent: dict[str, float]) -> None:
    """Wrap the rating's stages (either tree's functions) to add their CPU seconds to `spent`."""
    from phantora.collectives.nccl import p2p_group as G

    G.plan_parts = cpu_timed(spent, "plan", G.plan_parts)
    if hasattr(G, "_rates"):  # before: every running transfer rated at each event
        G._rates = cpu_timed(spent, "rate", G._rates)
        G._ends = cpu_timed(spent, "ends", G._ends)
    else:
        from phantora.collectives.nccl import p2p_group_ends as E

        for name in ("join", "leave", "rerate"):  # who keeps and sets the rates
            setattr(E._Group, name, cpu_timed(spent, "rate", getattr(E._Group, name)))
        G.group_ends = cpu_timed(spent, "ends", G.group_ends)


def rate_once(n: int, seed: int, sample: int) -> dict[str, Any]:
    """The `n`-rank dispatch rated once, uncached (`p2p_group.rate_group`, on the communicator and hosts the
    coordinator's `nccl.choose` rates it on): CPU s by stage; then `sample` pairs' choices asked as the coordinator
    asks them (the group cached); and each pair's end."""
    from phantora.collectives import AlgoOptions, Collective
    from phantora.collectives.layout import host_blocks
    from phantora.collectives.nccl import choose, p2p_group, platform_of, settings
    from phantora.collectives.nccl.settings import nccl_env
    from phantora.topology import load_topology

    topo = load_topology(TOPOLOGY)
    opts = AlgoOptions(nccl_env=nccl_env({}))
    ranks = tuple(range(n))
    pairs = group(n, seed)
    order = sorted(pairs)

    def handed(own: tuple[int, int]) -> tuple[Any, ...]:
        """What bridge/p2p_batch.py hands pair `own`: its group's pairs, and those moving other bytes with theirs."""
        nbytes = pairs[own][1]
        at = tuple((a, b, t, m) for (a, b), (t, m) in sorted(pairs.items()) if (t, m) != (0, nbytes))
        return ("send_recv", own, nbytes, "uint8", None, ranks, tuple(order), at)

    spent: dict[str, float] = defaultdict(float)
    _instrument(spent)
    hosts = [0] * n  # as nccl._grouped numbers them, so that the pairs asked after find the rating cached
    for h, block in enumerate(host_blocks(topo, [topo.node_of_rank(r) for r in ranks])):
        for pos in block:
            hosts[pos] = h
    on = platform_of(topo, ranks, settings(opts))
    p2p_group._rate_group.cache_clear()
    t0 = time.process_time()  # first, in a fresh process: as a coordinator meets its first dispatch
    rating = p2p_group.rate_group(on, settings(opts), tuple(hosts), pairs)
    spent["total"] = time.process_time() - t0
    ends_s = spent.pop("ends")
    spent["events"] = ends_s - spent["rate"]
    spent["other"] = spent["total"] - spent["plan"] - ends_s
    ends = [[s, d, rating.ends[(s, d)]] for s, d in order]
    if sample:
        asked = order[1 :: max(1, len(order) // sample)][:sample]
        given = [handed(own) for own in asked]
        t0 = time.process_time()
        for args in given:  # the coordinator's part: the pair's collective checked, its choice asked
            choose(Collective(*args), topo, opts)
        spent["pairs"] = (time.process_time() - t0) / len(asked) * len(order)
        if spent.get("ends"):
            raise SystemExit("a pair's choice rated the group again: the cache missed")
    return {"spent": dict(spent), "ends": ends, "sampled": bool(sample)}


def child(tree: Path, n: int, seed: int, sample: int) -> dict[str, Any]:
    """`rate_once` in a child process importing phantora from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, __file__, "--child", str(n), "--seed", str(seed), "--sample", str(sample)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{tree} on {n} ranks failed:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def fmt(spent: dict[str, float], sampled: bool) -> str:
    cells = []
    for k in STAGES:
        v = spent.get(k)
        cells.append("-" if v is None else f"{'~' if k == 'pairs' and sampled else ''}{v:.3f}")
    return " ".join(f"{c:>9}" for c in cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base", type=Path, default=None, help="a private clone to compare against (PYTHONPATH)")
    ap.add_argument("--sample", type=int, default=64, help="pairs whose choice is asked (0: none)")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        print(json.dumps(rate_once(args.child, args.seed, args.sample)))
        return
    here = HERE.parent
    print(f"CPU s per call, {TOPOLOGY}, seed {args.seed}; load {os.getloadavg()[0]:.1f}")
    print(f"{'ranks':>5} {'tree':>5} " + " ".join(f"{k:>9}" for k in STAGES))
    for n in args.ranks:
        trees = [("after", here)] + ([("base", args.base)] if args.base else [])
        got = {}
        for name, tree in trees[::-1] if n % 2 else trees:  # alternate which runs first
            got[name] = child(tree, n, args.seed, args.sample)
        for name, _ in trees:
            print(f"{n:>5} {name:>5} " + fmt(got[name]["spent"], got[name]["sampled"]))
        if args.base:
            a, b = got["after"]["ends"], got["base"]["ends"]
            same = sum(x == y for x, y in zip(a, b, strict=True))
            verdict = "bit for bit" if same == len(a) == len(b) else f"DIFFER: {len(a) - same} of {len(a)}"
            print(f"{n:>5} ends: {len(a)} transfers, {verdict}; last {max(e for *_, e in a):.1f} ns")
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
