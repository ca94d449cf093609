"""The flow engine alone on chunked NCCL collectives with clear-to-sends (docs/flow-engine.md, "Chunked collectives
with clear-to-sends"): each case's DAG planned once, then submitted at 0 and drained in a fresh `FlowSimulator`,
`--reps` times; per case its flows, events, solves (carried, slack), carriers dropped, the best engine CPU s and a
key of every completion (sha256 of (flow, start, end) in flow order, 16 hex digits), which must not change.

    PYTHONPATH=CLONE .venv/bin/python bench/bench_flow_chunked.py [--reps N] [--only CASE ...]

Cases: `tree-simple` (Tree/Simple 256 MiB all-reduce on testbed16), `tree-ll` (Tree/LL 64 MiB), `tree-ll128`
(Tree/LL128 64 MiB), `ring-simple` (Ring/Simple 256 MiB), `alltoall` (64 MiB on rail16_h100). Run it in two clones
side by side (base, after, after, base) for a before/after.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import load_topology

MiB = 1 << 20
CASES = {  # name -> (topology, kind, bytes, NCCL env)
    "tree-simple": ("testbed16", "all_reduce", 256 * MiB, {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}),
    "tree-ll": ("testbed16", "all_reduce", 64 * MiB, {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}),
    "tree-ll128": ("testbed16", "all_reduce", 64 * MiB, {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL128"}),
    "ring-simple": ("testbed16", "all_reduce", 256 * MiB, {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}),
    "alltoall": ("rail16_h100", "all_to_all", 64 * MiB, {}),
}


def run(name: str, reps: int) -> None:
    topo_name, kind, nbytes, env = CASES[name]
    topo = load_topology(topo_name)
    coll = Collective(kind, tuple(range(topo.num_ranks)), nbytes, "fp32")
    flows = decompose(coll, topo, AlgoOptions(granularity="chunked", nccl_env=nccl_env(env))).flows
    cpu = []
    for _ in range(reps):
        sim = FlowSimulator(topo)
        t0 = time.process_time()
        sim.submit(flows, at=0)
        done = sim.drain()
        cpu.append(time.process_time() - t0)
    ends = sorted((c.flow_id, c.start_ns, c.end_ns) for c in done)
    key = hashlib.sha256(repr(ends).encode()).hexdigest()[:16]
    st = sim.stats()
    print(f"{name:12} flows {len(flows):7,} events {st['events']:6,} solves {st['resolves']:6,} "
          f"(carried {st['carried_resolves']:,}, slack {st['slack_resolves']:,}) carriers dropped "
          f"{st.get('carry_drops', 0)} engine CPU s {min(cpu):.3f} key {key}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=1, help="drains a case (the best CPU is printed)")
    ap.add_argument("--only", nargs="+", choices=sorted(CASES), default=list(CASES))
    args = ap.parse_args()
    for name in args.only:
        run(name, args.reps)


if __name__ == "__main__":
    main()
