"""A live run recorded, then its recording replayed: each send/recv's end ns, live against replayed.

    .venv/bin/python bench/bench_p2p_replay.py --topology testbed16 --nproc 4 bench/pp_exchange.py
    .venv/bin/python bench/bench_p2p_replay.py --topology h100x8.toml --nproc 8 bench/moe_dispatch.py --seed 0
    .venv/bin/python bench/bench_p2p_replay.py --network ns3 --topology testbed16 --nproc 4 bench/pp_exchange.py
    .venv/bin/python bench/bench_p2p_replay.py --topology testbed16 --workload bench/p2p_apart.json

Runs SCRIPT with `--tensors phantom --dedup off` under `phantora run --record` (`record_run`), takes each transfer's
end from the live run's cosim.json (a batch's pairs, an uneven all-to-all's), replays the graph in process on the
same network (flow, or a fresh ns-3 fabric with `--network ns3`) and prints one line: transfers, how many end at
their live ns, how many take their live duration (from when its flows were submitted to its end: in window mode the
target, since a live transfer starts late by the window's error), the worst difference, the last end either way, and
the wall and CPU seconds (docs/egraph.md "NCCL groups of transfers", "Window-mode recordings").

With `--workload FILE` (a workload with `splits`) the live side is the bridge's replay ranks
(`phantora.egraph.replay_rank`, one process a rank) and the replay is the in-process one (`replay_inprocess`), each
op's start and end compared, and its duration (docs/workload.md "Uneven all-to-all"). `--window W`: the live side in
window mode (W ns; its starts move by the window's own error, docs/status.md's grouped-p2p row).
"""

from __future__ import annotations

import argparse
import inspect
import json
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's phantora, not the venv's install

from phantora.egraph import replay_graph  # noqa: E402
from phantora.egraph.live import record_run  # noqa: E402
from phantora.launcher import RunConfig  # noqa: E402
from phantora.netsim.engine_spec import EngineSpec  # noqa: E402
from phantora.netsim.factory import make_engine  # noqa: E402
from phantora.topology.loader import load_topology  # noqa: E402
from phantora.topology.model import Topology  # noqa: E402


def transfer_key(tag: str) -> tuple[str, int, int]:
    """(call, src, dst) of a flow tag: `send#0@2>5/...` or a pairwise call's `all_to_all#1@0-7/0>2/...`."""
    head, second = tag.split("/")[:2]
    name, pair = head.split("@")
    src, dst = (second if ">" in second else pair).split(">")
    return name, int(src), int(dst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", required=True)
    ap.add_argument("--nproc", type=int, default=0)
    ap.add_argument("--window", type=int, default=0, help="the live run's co-simulation window, ns (0: exact)")
    ap.add_argument("--workload", help="compare a workload's in-process replay with its replay through the bridge")
    ap.add_argument("--network", choices=("flow", "ns3"), default="flow")
    ap.add_argument("script", nargs="?")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    topo = load_topology(a.topology)
    if a.workload:
        workload(a.workload, topo, EngineSpec(network=a.network, window_ns=a.window), a.topology)
        return
    if not a.script or not a.nproc:
        ap.error("give a script and --nproc (or --workload)")
    d = Path(tempfile.mkdtemp(prefix="p2p_replay_"))
    t0 = time.time()
    spec = EngineSpec(network=a.network, window_ns=a.window)
    cfg = RunConfig(a.script, a.args, topology=topo, nproc=a.nproc, tensors="phantom", trace="none", timeout_s=1800,
                    out_dir=str(d / "o"), dedup="off", engine=spec)  # fmt: skip
    _, graph = record_run(cfg, d / "g")
    t1 = time.time()
    recs = json.loads((d / "o" / "cosim.json").read_text())["collectives"]
    live = {(r["name"].split("@")[0], *r["group"]): r["end_ns"] for r in recs if r["kind"] == "send_recv"}
    live_dur = {
        (r["name"].split("@")[0], *r["group"]): r["end_ns"] - r["t_start"] for r in recs if r["kind"] == "send_recv"
    }
    sim = make_engine(cfg.engine, topo)
    try:
        res = replay_graph(graph, topo, sim, **fresh(replay_graph, lambda: make_engine(cfg.engine, topo)))
    finally:
        sim.close()
    t2 = time.time()
    ends: dict[tuple[str, int, int], int] = {}
    starts: dict[tuple[str, int, int], int] = {}  # released (a flow's start less its delay: the live t_start)
    delay = {f.id: f.delay_ns for f in res.plan_flows}
    for c in res.completions:
        if "/p2p" in c.tag:
            k = transfer_key(c.tag)
            ends[k] = max(ends.get(k, 0), c.end_ns)
            starts[k] = min(starts.get(k, c.start_ns), c.start_ns - delay[c.flow_id])
    same_dur = sum(ends.get(k, -1) - starts.get(k, 0) == v for k, v in live_dur.items())
    diff = {k: ends.get(k, -1) - v for k, v in live.items()}
    worst = max(diff, key=lambda k: abs(diff[k]))
    last_live, last_rep = max(live.values()), max(ends.get(k, -1) for k in live)
    cpu = cpu_s()
    print(
        f"{Path(a.script).name} {' '.join(a.args)} on {a.topology} x{a.nproc} ({a.network}): {len(live)} transfers, "
        f"{sum(v == 0 for v in diff.values())} at their live ns, {same_dur} of their live duration; worst {worst}: "
        f"live {live[worst]:,} replay {ends.get(worst, -1):,} ({diff[worst]:+,} ns); last end live {last_live:,} "
        f"replay {last_rep:,} "
        f"({100 * (last_rep - last_live) / last_live:+.2f} %); live {t1 - t0:.1f} s wall, replay {t2 - t1:.2f} s, "
        f"CPU {cpu:.1f} s"
    )


def workload(path: str, topo: Topology, spec: EngineSpec, where: str) -> None:
    """One line: the workload's ops in process against through the bridge (in window mode with `spec.window_ns`,
    the in-process replay rating its groups by the bridge's rounds)."""
    from bridge.run import CosimRun
    from phantora.replay import replay_inprocess
    from phantora.workload import load_workload

    wl = load_workload(path, world=topo.num_ranks)
    t0, c0 = time.time(), cpu_s()
    sim = make_engine(spec, topo)
    try:
        ref = {
            op.name: (op.start_ns, op.end_ns)
            for op in replay_inprocess(
                wl, topo, sim, **fresh(replay_inprocess, lambda: make_engine(spec, topo)), **window(spec.window_ns)
            ).ops
        }
    finally:
        sim.close()
    t1, c1 = time.time(), cpu_s()
    cmd = [sys.executable, "-m", "phantora.egraph.replay_rank", path]
    res = CosimRun(topo, rank_cmd=cmd, timeout_s=1800, engine=spec).run()
    t2, c2 = time.time(), cpu_s()
    got = {r["name"]: (r["t_start"], r["end_ns"]) for r in res.collectives}
    diff = {k: ref[k][1] - got[k][1] for k in got}
    dur = {k: (ref[k][1] - ref[k][0]) - (got[k][1] - got[k][0]) for k in got}
    worst_dur = max(dur, key=lambda k: abs(dur[k]))
    worst = max(diff, key=lambda k: abs(diff[k]))
    print(
        f"{Path(path).name} on {where} ({spec.network}): {len(got)} ops, {sum(got[k] == ref.get(k) for k in got)} at "
        f"their bridge ns in process, {sum(v == 0 for v in dur.values())} of their bridge duration (worst {worst_dur} "
        f"{dur[worst_dur]:+,} ns); worst end {worst}: bridge {got[worst][1]:,} in process {ref[worst][1]:,} "
        f"({diff[worst]:+,} ns); in process {t1 - t0:.2f} s wall {c1 - c0:.2f} CPU s, bridge {t2 - t1:.1f} s wall "
        f"{c2 - c1:.1f} CPU s"
    )


def fresh(replay: Any, make: Any) -> dict[str, Any]:
    """`replay`'s `fresh` argument (further engines: the replay runs again where the first run's ratings move), where
    it takes one (not before 24afa8c)."""
    return {"fresh": make} if "fresh" in inspect.signature(replay).parameters else {}


def window(ns: int) -> dict[str, Any]:
    """`replay_inprocess`'s `window_ns` (its groups rated by the bridge's rounds in window mode), where it takes one
    (not before 2026-12-01's)."""
    from phantora.replay import replay_inprocess

    return {"window_ns": ns} if ns and "window_ns" in inspect.signature(replay_inprocess).parameters else {}


def cpu_s() -> float:
    """CPU seconds of this process and its waited-for children."""
    return sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
               for f in ("ru_utime", "ru_stime"))  # fmt: skip


if __name__ == "__main__":
    main()
