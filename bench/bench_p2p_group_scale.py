"""CPU seconds the coordinator spends on one world-size uneven all-to-all (an MoE dispatch with EP = world), by
stage, on 16 to 1024 ranks of leafspine1024 (H100 hosts of 8), and the transfers' ends against another tree's.

The group is bench/moe_dispatch.py's: per-pair bytes log-uniform 1-64 MiB in rows of 4 KiB, seeded, every pair
starting at once. Stages of one rating (`p2p_group._rate_group`, its cache cleared): `plan` (each transfer's
channels and protocol, `plan_parts`), `rate` (the transfers' rates, each time they are set), `events` (the rest of
the schedule of starts and ends), `other` (latencies, the answer). Then the coordinator's launch of the pairs once
the group is rated, as bridge/core.py makes it: every pair issued and held (`P2pBatches`), then each launched:
`answer` (P2pBatches: the issues and holds, and each pair's group), `check` (`Collective.__post_init__`), `choice`
(`nccl.choose`), `flows` (the rest of `CollectivePlanner.plan`: decomposition into flows), `pairs` (their sum). The
pairs of `--senders` senders spread over the ranks are launched, the first pair timed apart and the others scaled
to all n (n - 1) (marked `~`; 0: every pair).

    nice -n 10 .venv/bin/python bench/bench_p2p_group_scale.py [--ranks 16 64 128] [--base CLONE]

`--base CLONE` runs the same with PYTHONPATH=CLONE in a child, alternating with this tree's, and checks that every
transfer's end (ns) is the same float, bit for bit, and that the launched pairs' flows, waits and choices are equal.

`--drain` launches every pair and then runs their flows in the flow engine (`make_engine(EngineSpec(), topo)`, all
submitted at 0, drained): `drain` is its CPU s, and with `--base` every completion's (flow, start, end) is compared.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
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
STAGES = ("plan", "rate", "events", "other", "total")
LAUNCH = ("answer", "check", "choice", "flows", "pairs")


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
        setattr(G, "_ends", cpu_timed(spent, "ends", getattr(G, "_ends")))  # noqa: B009, B010
    else:
        from phantora.collectives.nccl import p2p_group_ends as E

        for name in ("join", "leave", "rerate"):  # who keeps and sets the rates
            setattr(E._Group, name, cpu_timed(spent, "rate", getattr(E._Group, name)))
        G.group_ends = cpu_timed(spent, "ends", G.group_ends)


def drain(topo: Any, flows: list[Any], spent: dict[str, float]) -> tuple[str, int]:
    """The flows run in the flow engine, all submitted at 0 and drained: CPU s into spent["drain"]; a digest of every
    completion's (flow, start, end) and the last end."""
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine

    engine = make_engine(EngineSpec(), topo)
    t0 = time.process_time()
    engine.submit(flows, at=0)
    done = engine.drain()
    spent["drain"] = time.process_time() - t0
    key = hashlib.sha256(repr(sorted((c.flow_id, c.start_ns, c.end_ns) for c in done)).encode()).hexdigest()[:16]
    return key, max(c.end_ns for c in done)


def rate_once(n: int, seed: int, senders: int, drained: bool = False) -> dict[str, Any]:
    """The `n`-rank dispatch rated once, uncached (`p2p_group.rate_group`, on the communicator and hosts the
    coordinator's `nccl.choose` rates it on): CPU s by stage; then the pairs of `senders` senders launched as the
    coordinator launches them (the group cached: `launch`); and each pair's end."""
    from phantora.collectives import AlgoOptions
    from phantora.collectives.layout import host_blocks
    from phantora.collectives.nccl import p2p_group, platform_of, settings
    from phantora.collectives.nccl.settings import nccl_env
    from phantora.topology import load_topology

    topo = load_topology(TOPOLOGY)
    opts = AlgoOptions(nccl_env=nccl_env({}))
    ranks = tuple(range(n))
    pairs = group(n, seed)
    order = sorted(pairs)
    spent: dict[str, float] = defaultdict(float)
    _instrument(spent)
    hosts = [0] * n  # as nccl._grouped numbers them, so that the pairs launched after find the rating cached
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
    flows: list[Any] | None = [] if drained else None
    plans = launch(topo, opts, pairs, senders, spent, flows)
    if spent.get("ends"):
        raise SystemExit("a pair's choice rated the group again: the cache missed")
    if flows is not None:
        key, last = drain(topo, flows, spent)
        plans = f"{plans}; {len(flows)} flows drained, last end {last} ns, completions {key}"
    return {"spent": dict(spent), "ends": ends, "plans": plans, "sampled": 0 < senders < n}


def launch(
    topo: Any,
    opts: Any,
    pairs: dict[tuple[int, int], tuple[int, int]],
    senders: int,
    spent: dict[str, float],
    flows: list[Any] | None = None,
) -> str:
    """The coordinator's launch of the dispatch's pairs (bridge/core.py `_launch`, either tree's): CPU s by stage
    into `spent` (the first pair apart, the others of `senders` senders scaled to every pair), and a digest of the
    launched pairs' flows, waits and choices; `flows` takes those flows."""
    import bridge.p2p_batch as pb
    from bridge.matching import Call, Rendezvous
    from phantora.collectives import options, spec
    from phantora.collectives.mirrors import Mirrors
    from phantora.collectives.plan import CallSpec, CollectivePlanner

    n = max(max(p) for p in pairs) + 1
    comm = tuple(range(n))
    part: dict[str, float] = defaultdict(float)
    post = spec.Collective.__post_init__
    spec.Collective.__post_init__ = cpu_timed(part, "check", post)  # type: ignore[method-assign]
    options.choose = cpu_timed(part, "choice", options.choose)
    batches = pb.P2pBatches()
    shared = hasattr(batches, "launch")  # after: one group for the launch; before: each pair's answer
    rvs = []
    t0 = time.process_time()
    for h, ((s, d), (t, nbytes)) in enumerate(sorted(pairs.items())):
        send = Call(s, 2 * h, "send", nbytes, "uint8", None, t, comm=comm)
        recv = Call(d, 2 * h + 1, "recv", nbytes, "uint8", None, t, comm=comm)
        batches.issued(send, 0)
        batches.issued(recv, 0)
        rvs.append(Rendezvous(("p2p", s, d, 0, 0), (s, d), {s: send, d: recv}))
    for rv in rvs:
        batches.held(rv)
    setup = time.process_time() - t0
    planner = CollectivePlanner(topo, opts, Mirrors(n, n))
    chosen = set(range(0, n, max(1, n // senders))) if 0 < senders < n else set(range(n))
    todo = [rv for rv in rvs if rv.key[1] in chosen]
    digest = hashlib.sha256()
    timed = []
    for rv in todo:
        before = dict(part)
        t0 = time.process_time()
        nbytes = next(iter(rv.calls.values())).nbytes
        call = CallSpec("send_recv", rv.key[1:3], nbytes, "uint8", None, "x", {}, comm)
        if shared:
            call = dataclasses.replace(call, launch=batches.launch(rv, 0))
        else:
            inflight, at = batches.inflight(rv, 0)
            call = dataclasses.replace(call, inflight=inflight, inflight_at=at)
        answered = time.process_time() - t0
        plan = planner.plan(call, "x")
        total = time.process_time() - t0
        digest.update(repr((plan.flows, sorted((r, sorted(v)) for r, v in plan.last.items()), plan.choice)).encode())
        if flows is not None:
            flows.extend(plan.flows)
        step = {k: part.get(k, 0.0) - before.get(k, 0.0) for k in ("check", "choice")}
        step["answer"] = answered
        step["flows"] = total - answered - step["check"] - step["choice"]
        timed.append(step)
    spec.Collective.__post_init__ = post  # type: ignore[method-assign]
    scale = (len(pairs) - 1) / max(1, len(timed) - 1)
    for k in LAUNCH[:-1]:
        spent[k] = timed[0][k] + scale * sum(step[k] for step in timed[1:])
    spent["answer"] += setup
    spent["pairs"] = sum(spent[k] for k in LAUNCH[:-1])
    return digest.hexdigest()[:16]


def child(tree: Path, n: int, seed: int, senders: int, drained: bool) -> dict[str, Any]:
    """`rate_once` in a child process importing phantora from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, __file__, "--child", str(n), "--seed", str(seed), "--senders", str(senders)]
    cmd += ["--drain"] if drained else []
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{tree} on {n} ranks failed:\n{out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def fmt(spent: dict[str, float], sampled: bool, columns: tuple[str, ...]) -> str:
    cells = []
    for k in columns:
        v = spent.get(k)
        cells.append("-" if v is None else f"{'~' if k in LAUNCH and sampled else ''}{v:.3f}")
    return " ".join(f"{c:>9}" for c in cells)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 64, 128])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base", type=Path, default=None, help="a private clone to compare against (PYTHONPATH)")
    ap.add_argument("--senders", type=int, default=8, help="senders whose pairs are launched (0: all)")
    ap.add_argument("--drain", action="store_true", help="launch every pair, then drain their flows in the flow engine")
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.drain:
        args.senders = 0
    if args.child is not None:
        print(json.dumps(rate_once(args.child, args.seed, args.senders, args.drain)))
        return
    columns = STAGES + LAUNCH + (("drain",) if args.drain else ())
    here = HERE.parent
    print(f"CPU s per call, {TOPOLOGY}, seed {args.seed}; load {os.getloadavg()[0]:.1f}")
    print(f"{'ranks':>5} {'tree':>5} " + " ".join(f"{k:>9}" for k in columns))
    for n in args.ranks:
        trees = [("after", here)] + ([("base", args.base)] if args.base else [])
        got = {}
        for name, tree in trees[::-1] if n % 2 else trees:  # alternate which runs first
            got[name] = child(tree, n, args.seed, args.senders, args.drain)
        for name, _ in trees:
            print(f"{n:>5} {name:>5} " + fmt(got[name]["spent"], got[name]["sampled"], columns))
        if args.base:
            a, b = got["after"]["ends"], got["base"]["ends"]
            same = sum(x == y for x, y in zip(a, b, strict=True))
            verdict = "bit for bit" if same == len(a) == len(b) else f"DIFFER: {len(a) - same} of {len(a)}"
            print(f"{n:>5} ends: {len(a)} transfers, {verdict}; last {max(e for *_, e in a):.1f} ns")
            plans = "equal" if got["after"]["plans"] == got["base"]["plans"] else "DIFFER"
            print(f"{n:>5} launched pairs' flows, waits and choices: {plans} ({got['after']['plans']})")
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
