"""A partition worker's set-up (issue 38): CPU and peak RSS of each `partition=N` worker's engine, one process each.

Each worker of `--partition N` (every group g < N) is built in a fresh process as `bridge.cut_worker` builds it
(`make_engine` on the topology with `partition=N, partition_worker=g`, keyed, DCQCN, `nvlink=fluid,wire=roce4k`
unless `--set` says otherwise), and timed by `time.process_time` in three parts: Python imports (phantora, the
topology), loading ns-3 and the fabric library (`load_ns3`), and building the engine (the fabric, its partition,
`Finalize`); then its peak RSS (`ru_maxrss`). Printed per N: the mean and largest of each over the workers.
Run it in two trees side by side for a before / after (`PYTHONPATH` does not matter: the script runs its own
tree's phantora).

    .venv/bin/python bench/bench_worker_setup.py --topology testbed16 leafspine1024 --partition 2 4 8
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this tree's phantora, not the venv's install


def one(topology: str, n: int, g: int, sets: list[str]) -> dict[str, float]:
    """Build worker g of n in this process; its set-up split (CPU s) and peak RSS (MB)."""
    c0 = time.process_time()
    from phantora.netsim.engine_spec import EngineSpec
    from phantora.netsim.factory import make_engine
    from phantora.netsim.packet import load_ns3
    from phantora.netsim.packet_config import KEYED_SCHEDULER, PacketConfig, apply_overrides
    from phantora.topology.loader import load_topology

    topo = load_topology(topology)
    c1 = time.process_time()
    load_ns3()
    c2 = time.process_time()
    fast = [f"scheduler={KEYED_SCHEDULER}", "nvlink=fluid", "wire=roce4k"]
    config = apply_overrides(PacketConfig(cc="dcqcn"), [*fast, *sets])
    spec = EngineSpec(network="ns3", packet=config.with_updates(partition=n, partition_worker=g), side="packet")
    sim = make_engine(spec, topo)  # as bridge.cut_pool's workers build theirs
    c3 = time.process_time()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sim.close()
    return {"imports": c1 - c0, "load_ns3": c2 - c1, "engine": c3 - c2, "setup": c3 - c0, "rss_mb": rss}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--topology", nargs="+", default=["testbed16", "leafspine1024"])
    ap.add_argument("--partition", type=int, nargs="+", default=[2, 4, 8])
    ap.add_argument("--set", action="append", default=[], help="an engine setting KEY=VALUE (repeatable)")
    ap.add_argument("--one", nargs=3, metavar=("TOPOLOGY", "N", "G"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        topology, n, g = args.one
        print(json.dumps(one(topology, int(n), int(g), args.set)))
        return
    cols = ("imports", "load_ns3", "engine", "setup", "rss_mb")
    print("topology        N  " + "  ".join(f"{c:>17}" for c in cols) + "   (mean / largest over the workers)")
    for topology in args.topology:
        for n in args.partition:
            runs = []
            for g in range(n):
                cmd = [sys.executable, __file__, "--one", topology, str(n), str(g)]
                cmd += [f"--set={s}" for s in args.set]
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
                if proc.returncode:
                    break
                runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
            if proc.returncode:  # e.g. more groups than the fabric has
                print(f"{topology:<14} {n:>2}  {(proc.stderr.strip().splitlines() or ['failed'])[-1]}", flush=True)
                continue
            cells = [f"{statistics.fmean(r[c] for r in runs):8.2f} /{max(r[c] for r in runs):8.2f}" for c in cols]
            print(f"{topology:<14} {n:>2}  " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
