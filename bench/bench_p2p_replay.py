"""A live run recorded, then its recording replayed: each send/recv's end ns, live against replayed.

    .venv/bin/python bench/bench_p2p_replay.py --topology testbed16 --nproc 4 bench/pp_exchange.py
    .venv/bin/python bench/bench_p2p_replay.py --topology h100x8.toml --nproc 8 bench/moe_dispatch.py --seed 0
    .venv/bin/python bench/bench_p2p_replay.py --network ns3 --topology testbed16 --nproc 4 bench/pp_exchange.py

Runs SCRIPT with `--tensors phantom --dedup off` under `phantora run --record` (`record_run`), takes each transfer's
end from the live run's cosim.json (a batch's pairs, an uneven all-to-all's), replays the graph in process on the
same network (flow, or a fresh ns-3 fabric with `--network ns3`) and prints one line: transfers, how many end at
their live ns, the worst difference, the last end either way, and the wall and CPU seconds (docs/egraph.md "NCCL
groups of transfers").
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's phantora, not the venv's install

from phantora.egraph import replay_graph  # noqa: E402
from phantora.egraph.live import record_run  # noqa: E402
from phantora.launcher import RunConfig  # noqa: E402
from phantora.netsim.engine_spec import EngineSpec  # noqa: E402
from phantora.netsim.factory import make_engine  # noqa: E402
from phantora.topology.loader import load_topology  # noqa: E402


def transfer_key(tag: str) -> tuple[str, int, int]:
    """(call, src, dst) of a flow tag: `send#0@2>5/...` or a pairwise call's `all_to_all#1@0-7/0>2/...`."""
    head, second = tag.split("/")[:2]
    name, pair = head.split("@")
    src, dst = (second if ">" in second else pair).split(">")
    return name, int(src), int(dst)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topology", required=True)
    ap.add_argument("--nproc", type=int, required=True)
    ap.add_argument("--network", choices=("flow", "ns3"), default="flow")
    ap.add_argument("script")
    ap.add_argument("args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    topo = load_topology(a.topology)
    d = Path(tempfile.mkdtemp(prefix="p2p_replay_"))
    t0 = time.time()
    cfg = RunConfig(a.script, a.args, topology=topo, nproc=a.nproc, tensors="phantom", trace="none", timeout_s=1800,
                    out_dir=str(d / "o"), dedup="off", engine=EngineSpec(network=a.network))  # fmt: skip
    _, graph = record_run(cfg, d / "g")
    t1 = time.time()
    recs = json.loads((d / "o" / "cosim.json").read_text())["collectives"]
    live = {(r["name"].split("@")[0], *r["group"]): r["end_ns"] for r in recs if r["kind"] == "send_recv"}
    sim = make_engine(cfg.engine, topo)
    try:
        res = replay_graph(graph, topo, sim)
    finally:
        sim.close()
    t2 = time.time()
    ends: dict[tuple[str, int, int], int] = {}
    for c in res.completions:
        if "/p2p" in c.tag:
            k = transfer_key(c.tag)
            ends[k] = max(ends.get(k, 0), c.end_ns)
    diff = {k: ends.get(k, -1) - v for k, v in live.items()}
    worst = max(diff, key=lambda k: abs(diff[k]))
    last_live, last_rep = max(live.values()), max(ends.get(k, -1) for k in live)
    cpu = sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))  # fmt: skip
    print(
        f"{Path(a.script).name} {' '.join(a.args)} on {a.topology} x{a.nproc} ({a.network}): {len(live)} transfers, "
        f"{sum(v == 0 for v in diff.values())} at their live ns; worst {worst}: live {live[worst]:,} replay "
        f"{ends.get(worst, -1):,} ({diff[worst]:+,} ns); last end live {last_live:,} replay {last_rep:,} "
        f"({100 * (last_rep - last_live) / last_live:+.2f} %); live {t1 - t0:.1f} s wall, replay {t2 - t1:.2f} s, "
        f"CPU {cpu:.1f} s"
    )


if __name__ == "__main__":
    main()
