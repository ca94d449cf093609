"""A one-node LL / LL128 tree's chunk slots and NVLS-Tree's per-chunk tree flows (docs/collectives.md, "A one-node
tree's sweeps share their chunk's slot; NVLS-Tree's tree a flow per channel, head and loop"): one all-reduce alone
on the flow engine, coarse (NCCL's time) and chunked, with the chunked call's flows, its credits (flags inside a
host, clear-to-sends across hosts) and CPU seconds of decompose and the flow engine (one run each, after a warm-up).

    bench_tree_gaps.py [one-node|nvls-tree]

`one-node`: Tree LL and LL128 on one 8-GPU H100 host (nccl-tests' default server), 1-64 MiB x 4; `nvls-tree`:
NVLS-Tree on rail16_h100 (2 x 8 H100), 1-256 MiB x 4. Run it in two clones side by side for a before/after
(`PYTHONPATH=CLONE .venv/bin/python bench/bench_tree_gaps.py`). Simulated times are deterministic; CPU seconds
are indications.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this tree's phantora, not the venv's install

from phantora.collectives import AlgoOptions, Collective, decompose
from phantora.collectives.back_pressure import is_credit
from phantora.collectives.nccl.settings import nccl_env
from phantora.netsim.flow import FlowSimulator
from phantora.topology import Topology, dgx_host, load_topology

MiB = 1 << 20


def one_call(topo: Topology, ranks: int, size: int, env: dict[str, str], label: str) -> None:
    """Print one all-reduce's coarse and chunked end, the chunked flows and credits, and the CPU seconds."""
    ends, count, credits, cpu = [], 0, 0, [0.0, 0.0]
    for granularity in ("coarse", "chunked"):
        coll = Collective("all_reduce", tuple(range(ranks)), size, "fp32")
        start = time.process_time()
        dag = decompose(coll, topo, AlgoOptions(granularity=granularity, nccl_env=nccl_env(env)))
        planned = time.process_time()
        sim = FlowSimulator(topo)
        sim.submit(dag.flows, at=0)
        ends.append(max(c.end_ns for c in sim.drain()) / 1e3)
        count, credits = len(dag.flows), sum(is_credit(f) for f in dag.flows)
        cpu = [planned - start, time.process_time() - planned]
    print(f"{label:14} {size // MiB:4} MiB: coarse {ends[0]:.2f} us chunked {ends[1]:.2f} us "
          f"({ends[1] / ends[0] - 1:+.2%}), chunked flows {count} (credits {credits}), decompose {cpu[0]:.2f} "
          f"flow engine {cpu[1]:.2f} CPU s")  # fmt: skip


def main(argv: list[str]) -> None:
    modes = argv or ["one-node", "nvls-tree"]
    if "one-node" in modes:
        topo = dgx_host(gpu="h100")
        one_call(topo, 8, MiB, {"NCCL_ALGO": "Tree", "NCCL_PROTO": "LL128"}, "warm-up")
        for proto in ("LL", "LL128"):
            for size in (MiB, 4 * MiB, 16 * MiB, 64 * MiB):
                one_call(topo, 8, size, {"NCCL_ALGO": "Tree", "NCCL_PROTO": proto}, f"Tree {proto}")
    if "nvls-tree" in modes:
        topo = load_topology("rail16_h100")
        one_call(topo, 16, MiB, {"NCCL_ALGO": "NVLSTree"}, "warm-up")
        for size in (MiB, 4 * MiB, 16 * MiB, 64 * MiB, 256 * MiB):
            one_call(topo, 16, size, {"NCCL_ALGO": "NVLSTree"}, "NVLS-Tree")


if __name__ == "__main__":
    main(sys.argv[1:])
